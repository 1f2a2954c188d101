"""Every loading path takes the same folder checks (rmfast.loading.folder_checks), found missing by a loading probe:
``--device-map`` skipped them all (a missing reward head scored as a random one, silently); a RoPE type the installed
transformers does not know was a KeyError traceback; tensors the model has no place for were dropped without a word;
missing backbone weights were a warning before a ranking of a partly random model. And Gemma 3's attention softcap,
which HF's Gemma 3 never applies, is not applied by the fast engine either."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny_models as T
from rmfast.errors import UserError
from rmfast.loading.loader import load


def _edited(src, dst, drop=(), add=None, config=None):
    """A copy of model folder ``src`` at ``dst`` with tensors dropped / added and config keys replaced."""
    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    t = {k: v for k, v in t.items() if k not in drop}
    t.update(add or {})
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture()
def spread():
    pytest.importorskip("accelerate")
    from rmfast.loading.spread import load_spread

    return lambda folder, **kw: load_spread(str(folder), dtype="float32", device_map="auto", **kw)


def test_device_map_takes_every_check_of_a_one_device_load(rm_folder, tmp_path, spread):
    no_head = _edited(rm_folder, tmp_path / "no-head", drop=("score.weight",))
    for loader in (lambda f: load(str(f), dtype="float32", device="cpu"), spread):
        with pytest.raises(UserError, match=r"no weights for its reward head \(score.weight\)"):
            loader(no_head)
    no_layer = _edited(rm_folder, tmp_path / "no-layer", drop=("model.layers.0.mlp.down_proj.weight",))
    with pytest.raises(UserError, match="model.layers.0.mlp.down_proj.weight: transformers would draw them at random"):
        spread(no_layer)
    vocab = _edited(rm_folder, tmp_path / "vocab", config={"vocab_size": T.VOCAB + 64})
    with pytest.raises(UserError, match="the config does not belong to these weights"):
        spread(vocab)
    # a complete folder: the same model as the one-device load, placed by accelerate and saying so
    lm, one = spread(rm_folder), load(str(rm_folder), dtype="float32", device="cpu")
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=ids).logits, one.model(input_ids=ids).logits)
    assert lm.source["device_map"] == "auto" and lm.model.config.pad_token_id == one.model.config.pad_token_id


def test_missing_backbone_weights_are_refused_not_scored(rm_folder, tmp_path):
    folder = _edited(rm_folder, tmp_path / "no-embed", drop=("model.embed_tokens.weight",))
    with pytest.raises(UserError) as e:
        load(str(folder), dtype="float32", device="cpu")
    msg = e.value.cli_message()
    assert "model.embed_tokens.weight" in msg and "pass the complete checkpoint" in msg and "\n" not in msg


def test_an_unknown_rope_type_is_one_line(rm_folder, tmp_path):
    folder = _edited(rm_folder, tmp_path / "rope", config={"rope_scaling": {"rope_type": "weird", "factor": 2.0}})
    with pytest.raises(UserError, match="RoPE type 'weird', which transformers .* does not know"):
        load(str(folder), dtype="float32", device="cpu")


def test_tensors_the_model_does_not_use_are_named(rm_folder, tmp_path):
    extra = {"score.bias": torch.full((1,), 7.0), "model.layers.0.self_attn.q_proj.bias": torch.ones(64),
             "lm_head.weight": torch.zeros(T.VOCAB, 64)}  # a causal LM's head in a classifier: unused as usual
    folder = _edited(rm_folder, tmp_path / "extra", add=extra)
    with pytest.warns(UserWarning, match=r"does not use \(model.layers.0.self_attn.q_proj.bias, score.bias\)") as w:
        load(str(folder), dtype="float32", device="cpu")
    assert not any("lm_head" in str(x.message) for x in w)


def test_gemma3_attention_softcap_is_not_applied_as_hf_does_not(smol_tokenizer):
    """HF's Gemma3Attention keeps config.attn_logit_softcapping but never passes it to the attention: the fast engine
    applied it (scores 2.4e-4 - 8.2e-4 off HF's, no warning)."""
    from rmfast.fast.engine import Engine
    from rmfast.scoring.hf_path import hf_scores
    from rmfast.template import build_template

    model = T.tiny("gemma3")
    model.config.attn_logit_softcapping = 0.5  # a cap that would bite on O(1) logits
    tmpl = build_template(smol_tokenizer, "Greatest thing?", system="Be brief.")
    resp = torch.randint(0, T.VOCAB, (16, 3), generator=torch.Generator().manual_seed(0))
    fast = Engine(model, tmpl, head="score").score(resp)
    ref = hf_scores(model, tmpl, resp.tolist(), head="score")
    assert ref.std() > 1e-4
    torch.testing.assert_close(fast, ref, atol=2e-5, rtol=0)


def test_a_folder_with_a_config_and_no_weights_is_refused_before_any_part(rm_folder, tmp_path):
    """A GCG/checkpoint probe: `sweep --dry-run` passed a checkpoint with no weight file (one still being saved); the
    real sweep then stopped there with a fix for a damaged download. check_model (what a sweep runs on every model
    first) now says what it is."""
    from rmfast.loading.sources import check_model

    folder = tmp_path / "checkpoint-50"
    folder.mkdir()
    shutil.copy(rm_folder / "config.json", folder / "config.json")
    with pytest.raises(UserError, match="config.json but no weight files: a training checkpoint still being saved"):
        check_model(str(folder))
    check_model(str(rm_folder))  # a complete folder passes


def test_a_random_head_seed_on_a_reward_model_is_said_to_be_unused(rm_folder, tmp_path, capsys):
    """A GCG probe: `--random-head-seed N` on a model with its own head gave the same run as without it, no word."""
    from cli_run import run

    rc, _, err = run(["scan", str(rm_folder), "--token-ids", "0:8", "--dtype", "float32", "--random-head-seed", "3",
                      "--no-progress", "--out", str(tmp_path / "s.parquet")], capsys)
    assert rc == 0, err
    assert "--random-head-seed 3 is not used" in err and "its own trained head" in err
