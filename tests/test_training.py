"""Training runs: checkpoint sweeps (full and LoRA), the TRL x-ray callback, the demo's smoke run.

Tiny random models (tests/tiny_models.py) trained for two steps with TRL's RewardTrainer; trl and
peft come from the ``train`` extra and the tests that need them skip where they are absent.
Equalities are exact (bit for bit): the callback's scan and the scan of the saved checkpoint run
the same rows through the same engine with the same batch shapes and thread count in one process
(README, "What is bit-identical").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import REPO, SHARED_DATA
from tiny_models import chatml_tokenizer, tiny

from rmfast.loading.training_checkpoints import expand_runs, is_adapter_folder, is_run_folder, run_checkpoints
from rmfast.cli import main as cli
from rmfast.errors import UserError
from rmfast.scoring.pipeline import Selection, run_scan
from rmfast.scoring.results import ScanResult

PROMPT = "What, in one word, is the greatest thing ever?"
IDS = "0:300"


def _need_train():
    pytest.importorskip("trl", reason="trl is in the train extra: pip install -e '.[train]'")
    pytest.importorskip("peft", reason="peft is in the train extra: pip install -e '.[train]'")


@pytest.fixture(scope="module")
def tok():
    return chatml_tokenizer()


def _save(model, tok, folder: Path) -> Path:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _pairs(tok, n=8):
    from datasets import Dataset

    words = ["love", "war", "peace", "hate", "kindness", "greed", "truth", "lies", "joy", "pain"]

    def ids(w):
        return list(tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": w}],
                                            tokenize=True, return_dict=False))

    return Dataset.from_dict({"chosen_ids": [ids(words[2 * (i % 5)]) for i in range(n)],
                              "rejected_ids": [ids(words[2 * (i % 5) + 1]) for i in range(n)]})


def _trainer(model, tok, out: Path, callbacks=(), peft_config=None, **kw):
    from trl import RewardConfig, RewardTrainer

    cfg = RewardConfig(output_dir=str(out), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2,
                       save_strategy="steps", save_steps=1, save_only_model=True, report_to=[], seed=0, use_cpu=True,
                       disable_tqdm=True, logging_steps=1, **kw)
    return RewardTrainer(model=model, args=cfg, train_dataset=_pairs(tok), processing_class=tok,
                         callbacks=list(callbacks), peft_config=peft_config)


def _tiny_rm(dropout=0.0):
    m = tiny("llama", num_labels=1, pad_token_id=2).requires_grad_(True)
    m.config.attention_dropout = dropout
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = dropout
    return m


def _xray(**kw):
    from rmfast.integrations.trl import XrayCallback, XrayConfig

    return XrayCallback(XrayConfig(prompts={"greatest": PROMPT}, selection=Selection(token_ids=IDS), name="rm", **kw))


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _opt_tensors(opt):
    return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


# --------------------------------------------------------------------------------------------
# run folders (no trl needed)


def test_run_folder_expands_into_its_checkpoints(tmp_path, tok):
    run = tmp_path / "run"
    for step in (10, 2):
        _save(tiny("llama", num_labels=1, seed=step), tok, run / f"checkpoint-{step}")
    (run / "checkpoint-x").mkdir()  # not a step: ignored
    assert is_run_folder(run) and not is_run_folder(run / "checkpoint-2")
    from rmfast.errors import UserNote
    from rmfast.sweep import ModelCfg

    final = _save(tiny("llama", num_labels=1, seed=5), tok, tmp_path / "final")  # the final model beside checkpoints
    _save(tiny("llama", num_labels=1, seed=6), tok, final / "checkpoint-4")
    with pytest.warns(UserNote, match=r"holds a model of its own and 1 checkpoint\(s\).*list its checkpoint-N folders"):
        assert expand_runs([ModelCfg(name="f", slug="f", model=str(final))], str)[0].model == str(final)
    assert [c.step for c in run_checkpoints(run)] == [2, 10]
    from rmfast import load

    with pytest.raises(UserError, match=r"is a training run \(2 checkpoints: checkpoint-2 \.\.\. checkpoint-10\)"):
        load(str(run))  # (it said "has no config.json")
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(json.dumps({"out": str(tmp_path / "store"), "defaults": {"dtype": "float32", "compile": "off"},
                               "models": [{"model": "run", "name": "rm"}], "prompts": {"greatest": PROMPT},
                               "candidates": {"v": {"vocabulary": {"token_ids": "0:64"}}}}))
    from rmfast.sweep import load_config

    assert [m.name for m in load_config(cfg).models] == ["rm/checkpoint-2", "rm/checkpoint-10"]
    assert cli(["sweep", str(cfg), "--no-progress"]) == 0
    from rmfast.analysis.paper_b.trajectory import load_trajectory_inputs

    from rmfast.sweep.store import read_scans

    t = load_trajectory_inputs(tmp_path / "store" / "parts", read_scans=read_scans)  # a store: by its store.json
    with pytest.raises(UserError, match="is a sweep store: give its folder alone"):
        load_trajectory_inputs(tmp_path / "store" / "parts")  # never every Parquet under it
    assert sorted(t["step"].unique()) == [2, 10] and set(t["run"]) == {"rm | " + PROMPT}
    assert list(t.columns).count("token") == 1  # the decoded text, not also the raw piece
    assert cli(["analyze", "trajectory", str(tmp_path / "store" / "parts"), "--out", str(tmp_path / "traj")]) == 0
    corr = pd.read_csv(tmp_path / "traj" / "trajectory_final_corr.csv")
    assert corr["step"].tolist() == [2, 10] and corr["spearman"].iloc[-1] == pytest.approx(1.0)
    # a checkpoint-N without a config (half-saved, or copied without it) had vanished from the run without a word
    (run / "checkpoint-6").mkdir()
    with pytest.raises(UserError, match=r"checkpoint-6 holds no config.json or adapter_config.json"):
        load_config(cfg)


def test_expand_runs_keeps_plain_models(tmp_path, tok):
    from rmfast.sweep import ModelCfg

    folder = _save(tiny("llama", num_labels=1), tok, tmp_path / "m")
    m = ModelCfg(name="m", slug="m", model=str(folder))
    assert expand_runs([m], str) == [m]


# --------------------------------------------------------------------------------------------
# LoRA checkpoints


def _lora_checkpoint(tok, base: Path, folder: Path):
    """A LoRA adapter on ``base`` with non-zero B and a trained score head, saved to ``folder``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    m = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    cfg = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    p = get_peft_model(m, cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B = 0 at init would make the merge a no-op: a test that could not fail
        for n, w in p.named_parameters():
            if "lora_B" in n or "modules_to_save" in n:
                w.copy_(torch.randn(w.shape, generator=g) * 0.3)
    p.save_pretrained(folder)
    tok.save_pretrained(folder)
    return p


def test_lora_checkpoint_equals_the_merged_model(tmp_path, tok):
    _need_train()
    base = _save(tiny("llama", kind="causal_lm"), tok, tmp_path / "base")  # a causal LM: the head comes from the adapter
    p = _lora_checkpoint(tok, base, tmp_path / "run" / "checkpoint-3")
    merged = p.merge_and_unload().eval()
    from rmfast.loading.loader import load

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load(str(tmp_path / "run" / "checkpoint-3"), dtype="float32", device="cpu")
    # peft's read of a property transformers deprecated is not the user's to see, once per checkpoint of a sweep
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert lm.kind == "classifier" and lm.source["type"] == "adapter"
    sel = Selection(token_ids=IDS)
    a, _ = run_scan(merged, tok, PROMPT, sel, compile="off", progress=False)
    b, _ = run_scan(lm.model, lm.tokenizer, PROMPT, sel, compile="off", progress=False)
    np.testing.assert_array_equal(a.scores, b.scores)
    base_scores, _ = run_scan(load(str(base), dtype="float32", random_head_seed=0).model, tok, PROMPT, sel,
                              compile="off", progress=False)
    assert not np.allclose(base_scores.scores, a.scores)  # the adapter changed what is scored


def test_lora_base_override_and_one_line_error(tmp_path, tok, capsys):
    _need_train()
    base = _save(tiny("llama", kind="causal_lm"), tok, tmp_path / "base")
    run = tmp_path / "run"
    for step in (1, 2):
        _lora_checkpoint(tok, base, run / f"checkpoint-{step}")
        ac = run / f"checkpoint-{step}" / "adapter_config.json"
        ac.write_text(json.dumps({**json.loads(ac.read_text()), "base_model_name_or_path": "nobody/not-cached-here"}))
    assert is_adapter_folder(run / "checkpoint-1") and is_run_folder(run)
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(json.dumps({"out": str(tmp_path / "store"), "defaults": {"dtype": "float32", "compile": "off"},
                               "models": [str(run)], "prompts": {"greatest": PROMPT},
                               "candidates": {"v": {"vocabulary": {"token_ids": "0:64"}}}}))
    capsys.readouterr()
    assert cli(["sweep", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # the sweep's status line, then the one-line error
    assert last.startswith("rmfast: error:") and "nobody/not-cached-here" in last and "--base" in last
    assert "Traceback" not in err
    assert "adapter_config.json's base_model_name_or_path" in last
    # a --base that cannot load is named as the one given (it said "pass --base" to one who had)
    capsys.readouterr()
    assert cli(["sweep", str(cfg), "--no-progress", "--base", str(tmp_path / "no-such-base"), "--force"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no-such-base' given for it" in last and "pass --base" not in last, last
    assert cli(["sweep", str(cfg), "--no-progress", "--base", str(base), "--force"]) == 0
    from rmfast.sweep.store import load_results

    got = load_results(tmp_path / "store", token_ids=False)
    assert sorted(got["model"].unique()) == ["run/checkpoint-1", "run/checkpoint-2"]
    # another base of the same shapes: its parts are scored again (a corrected --base had kept every score the old
    # base's, "their contents the same", exit 0)
    other = _save(tiny("llama", kind="causal_lm", seed=7), tok, tmp_path / "other")
    assert cli(["sweep", str(cfg), "--no-progress", "--base", str(other)]) == 0
    again = load_results(tmp_path / "store", token_ids=False)
    fresh = tmp_path / "fresh.yaml"
    fresh.write_text(cfg.read_text().replace(str(tmp_path / "store"), str(tmp_path / "store2")))
    assert cli(["sweep", str(fresh), "--no-progress", "--base", str(other)]) == 0
    want = load_results(tmp_path / "store2", token_ids=False)
    key = ["model", "token_id"] if "token_id" in want else ["model", "text"]
    np.testing.assert_array_equal(again.sort_values(key)["score"].to_numpy(), want.sort_values(key)["score"].to_numpy())
    assert not np.allclose(again.sort_values(key)["score"].to_numpy(), got.sort_values(key)["score"].to_numpy())
    # the store's readers judge the parts by the base the sweep used (--base), not the one adapter_config.json names:
    # with that one present, every reader had called the parts stale (0 done, "incomplete") right after scoring them
    for step in (1, 2):
        ac = run / f"checkpoint-{step}" / "adapter_config.json"
        ac.write_text(json.dumps({**json.loads(ac.read_text()), "base_model_name_or_path": str(base)}))
    third = tmp_path / "third.yaml"
    third.write_text(cfg.read_text().replace(str(tmp_path / "store"), str(tmp_path / "store3")))
    assert cli(["sweep", str(third), "--no-progress", "--base", str(other)]) == 0
    from rmfast.sweep.store import Store

    st = Store(tmp_path / "store3")
    assert [p.model for p in st.plan() if st.fresh_manifest(p) is None] == []
    assert len(load_results(tmp_path / "store3", token_ids=False)) == len(want)


# --------------------------------------------------------------------------------------------
# the callback


def test_callback_scan_equals_a_fresh_scan_of_the_checkpoint(tmp_path, tok):
    _need_train()
    cb = _xray(out=tmp_path / "xray")
    tr = _trainer(_tiny_rm(), tok, tmp_path / "run", [cb])
    cb.trainer = tr
    tr.train()
    assert [h["label"] for h in cb.history] == ["rm/checkpoint-1", "rm/checkpoint-2"]
    mine = ScanResult.from_parquet(tmp_path / "xray" / "checkpoint-2" / "greatest.parquet")
    out = tmp_path / "fresh.parquet"
    assert cli(["scan", str(tmp_path / "run" / "checkpoint-2"), "--prompt", PROMPT, "--token-ids", IDS,
                "--dtype", "float32", "--compile", "off", "--out", str(out)]) == 0
    fresh = ScanResult.from_parquet(out)
    np.testing.assert_array_equal(mine.token_ids, fresh.token_ids)
    np.testing.assert_array_equal(mine.scores, fresh.scores)  # bit for bit
    first = ScanResult.from_parquet(tmp_path / "xray" / "checkpoint-1" / "greatest.parquet")
    assert not np.array_equal(first.scores, mine.scores)  # training moved the scores between the two saves
    from rmfast.io import read_provenance  # the callback's tables say what `score` is, as scan's (issue 51 item 5)

    assert read_provenance(tmp_path / "xray" / "checkpoint-2" / "greatest.parquet")["score_meaning"] == \
        read_provenance(out)["score_meaning"]
    logged = [e for e in tr.state.log_history if "rmfast/xray_s" in e]
    assert [e["step"] for e in logged] == [1, 2] and "rmfast/greatest/score_max" in logged[0]


class _Probe:
    """Two callbacks around the x-ray: the state before it, checked after it."""

    def __init__(self):
        from transformers import TrainerCallback

        probe = self

        class Before(TrainerCallback):
            def on_save(self, args, state, control, model=None, optimizer=None, **kw):
                probe.before = probe.snapshot(model, optimizer)

        class After(TrainerCallback):
            def on_save(self, args, state, control, model=None, optimizer=None, **kw):
                probe.checked.append(probe.snapshot(model, optimizer) == probe.before)

        self.before, self.checked, self.callbacks = None, [], (Before(), After())

    @staticmethod
    def snapshot(model, optimizer):
        return {"params": _digest(p for p in model.parameters()), "opt": _digest(_opt_tensors(optimizer)),
                "modes": [m.training for m in model.modules()], "torch": _digest([torch.get_rng_state()]),
                "random": random.getstate(), "numpy": _digest([torch.from_numpy(np.random.get_state()[1])])}


@pytest.mark.parametrize("lora", [False, True])
def test_callback_does_not_disturb_training(tmp_path, tok, lora):
    """Weights, optimizer state, train flags and RNG states are the same after the x-ray as before it,
    and a run with the callback ends with the very weights of a run without it (dropout on, so a
    disturbed RNG would show)."""
    _need_train()
    from peft import LoraConfig

    peft_cfg = (lambda: LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.1,
                                   target_modules=["q_proj", "v_proj"])) if lora else (lambda: None)
    probe = _Probe()
    cb = _xray()
    a = _trainer(_tiny_rm(0.2), tok, tmp_path / "a", [probe.callbacks[0], cb, probe.callbacks[1]], peft_cfg(),
                 disable_dropout=False)
    a.train()
    assert len(cb.history) == 2 and probe.checked == [True, True]
    b = _trainer(_tiny_rm(0.2), tok, tmp_path / "b", [], peft_cfg(), disable_dropout=False)
    b.train()
    assert _digest(a.model.parameters()) == _digest(b.model.parameters())
    assert _digest(_opt_tensors(a.optimizer)) == _digest(_opt_tensors(b.optimizer))


def test_every_n_steps_and_summary(tmp_path, tok):
    _need_train()
    dic = pd.DataFrame({"term": ["love", "war", "peace", "power"], "category": ["Communion", "Agency"] * 2})
    from rmfast.integrations.trl import XrayCallback, XrayConfig

    cb = XrayCallback(XrayConfig(prompts=[PROMPT], selection=Selection(texts=["love", "war", "peace", "power", "x"]),
                                 dictionary=dic, every_n_steps=1, on_save=False, k=2))
    _trainer(_tiny_rm(), tok, tmp_path / "run", [cb]).train()
    assert [h["label"] for h in cb.history] == ["run/step-1", "run/step-2"]
    s = cb.history[-1]["scalars"]
    name = next(iter(cb.config.prompts))
    gap = s[f"rmfast/{name}/gap/Communion_minus_Agency"]
    med = {c: s[f"rmfast/{name}/median_rank/{c}"] for c in ("Agency", "Communion")}
    assert gap == med["Communion"] - med["Agency"] and len(cb.history[-1]["top"][name]) == 2


def test_xray_config_rejects_bad_input():
    from rmfast.integrations.trl import XrayConfig

    with pytest.raises(UserError, match="every_n_steps"):
        XrayConfig(prompts=[PROMPT], every_n_steps=0)
    with pytest.raises(UserError, match="at least one prompt"):
        XrayConfig(prompts={})
    # each of these was found only at the first save's x-ray, after the steps before it, as a traceback out of
    # trainer.train() (a walkthrough: a missing dictionary cost both steps and their checkpoint's x-ray)
    for kw, said in [({"prompts": "What?"}, "prompts is one str"), ({"prompts": {"a": ""}}, "not a non-empty str"),
                     ({"k": -3}, "k must be an integer >= 1"), ({"k": 0}, "k must be an integer >= 1"),
                     ({"k": 2.5}, "k must be an integer"), ({"batch_size": "x"}, "batch"),
                     ({"compile": "maybe"}, "unknown compile=.maybe."), ({"dictionary": "/nonexistent/dict.csv"}, "does not exist"),
                     ({"every_n_steps": "2"}, "every_n_steps must be an integer")]:
        with pytest.raises(UserError, match=said):
            XrayConfig(**{"prompts": [PROMPT], **kw})


def test_what_needs_the_model_is_checked_at_the_trains_start(tmp_path, tok):
    """A template without placeholders, ids past the vocabulary, layers past the model: on_train_begin refuses
    them in one line before any training step (no checkpoint is written)."""
    pytest.importorskip("trl")
    for kw, said in [({"template": "no placeholders"}, "template"),
                     ({"states": "99", "out": tmp_path / "x"}, "99")]:
        cb = _xray(**kw)
        tr = _trainer(_tiny_rm(), tok, tmp_path / "run", callbacks=[cb])
        with pytest.raises(UserError, match=said):
            tr.train()
        assert not list((tmp_path / "run").glob("checkpoint-*")), kw
    from rmfast.integrations.trl import XrayCallback, XrayConfig

    cb = XrayCallback(XrayConfig(prompts=[PROMPT], selection=Selection(token_ids="0:999999")))
    with pytest.raises(UserError, match="999"):
        cb.check(_tiny_rm(), tok)


# --------------------------------------------------------------------------------------------
# the demo, two steps on a tiny model


def test_demo_smoke_runs_the_trajectory_over_its_checkpoint_sweep(tmp_path, tok):
    _need_train()
    if not (SHARED_DATA / "eloeverything").is_dir() or not (SHARED_DATA / "lexicons" / "big2_nouns.csv").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    spec = importlib.util.spec_from_file_location("train_demo", REPO / "examples" / "train_reward_model.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    base = _save(tiny("llama", kind="causal_lm"), tok, tmp_path / "base")
    out = tmp_path / "demo"
    rep = demo.main(["--out", str(out), "--smoke", "--model", str(base),
                     "--elo", str(SHARED_DATA / "eloeverything" / "What, in one word, is the greatest thing ever.csv"),
                     "--dictionary", str(SHARED_DATA / "lexicons" / "big2_nouns.csv"), "--threads", "1"])
    assert rep["sweep_rc"] == 0 and rep["trajectory_rc"] == 0
    assert sorted(rep["heldout_pair_accuracy"]) == [0, 1, 2]
    assert all(0.0 <= v <= 1.0 for v in rep["heldout_pair_accuracy"].values())
    gaps = [rep["steps"][k]["big2_gap_communion_minus_agency"] for k in (0, 1, 2)]  # (it read a key never written)
    assert all(isinstance(g, float) for g in gaps), gaps
    cats = pd.read_csv(out / "trajectory" / "trajectory_categories.csv")
    assert sorted(cats["step"].unique()) == [1, 2] and set(cats["category"]) == {"Agency", "Communion"}
    assert (out / "trajectory" / "trajectory_categories.png").is_file()
    # the sweep's checkpoint scans are the callback's scans of the same Big Two words
    sweep = pd.read_parquet(next((out / "store" / "parts").glob("model=*checkpoint-2/*/*/part.parquet")))
    cb = pd.read_parquet(out / "xray" / "big2" / "checkpoint-2" / "greatest.parquet")
    both = sweep.merge(cb, on="text", suffixes=("_sweep", "_cb"))
    assert len(both) == len(cb) > 200
    np.testing.assert_array_equal(both["score_sweep"].to_numpy(), both["score_cb"].to_numpy())
    shutil.rmtree(out / "run")


def test_a_model_that_cannot_load_is_found_before_any_part(tmp_path, tok):
    """An empty folder, a run folder with no checkpoint, a file, and an adapter without its weights (or with pickled
    ones) passed the sweep's check and --dry-run, and failed after the models before them were scored (the adapter
    ones as "no score head"): each is one line from check_model now, the loader's own wording."""
    _need_train()
    from rmfast.loading.sources import check_model

    (tmp_path / "empty").mkdir()
    (tmp_path / "run" / "logs").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("x")
    for spec, what in ((tmp_path / "empty", "has no config.json"), (tmp_path / "run", "has no config.json"),
                       (tmp_path / "notes.txt", "is a file but not a .gguf")):
        with pytest.raises(UserError, match=what):
            check_model(str(spec))
    base = _save(tiny("llama", kind="causal_lm"), tok, tmp_path / "base")
    ck = tmp_path / "lora" / "checkpoint-1"
    _lora_checkpoint(tok, base, ck)
    check_model(str(ck))  # whole: fine
    (ck / "adapter_model.safetensors").rename(ck / "adapter_model.bin")
    with pytest.raises(UserError, match=r"pickled weights \(adapter_model.bin\)"):
        check_model(str(ck))
    (ck / "adapter_model.bin").unlink()
    with pytest.raises(UserError, match=r"has no adapter weights \(adapter_model.safetensors\)"):
        check_model(str(ck))
    from rmfast.loading.loader import load

    with pytest.raises(UserError, match="has no adapter weights"):
        load(str(ck))


def test_config_errors_name_the_yaml_entry_of_a_run(tmp_path, tok, capsys):
    """Errors counted a run's expanded checkpoints ("models[2]" of a two-model YAML); a run's name clash suggested
    replacing the run by one checkpoint. Each names the YAML's entry, and the fix names the run."""
    for seed in (0, 1):
        for step in (1, 2):
            _save(tiny("llama", num_labels=1, seed=step), tok, tmp_path / f"s{seed}" / "run" / f"checkpoint-{step}")
    (tmp_path / "empty").mkdir()
    cfg = tmp_path / "sweep.yaml"

    def sweep(models):
        cfg.write_text(json.dumps({"out": str(tmp_path / "store"), "defaults": {"dtype": "float32"}, "models": models,
                                   "prompts": {"greatest": PROMPT}, "candidates": {"v": {"vocabulary": {"token_ids": "0:8"}}}}))
        capsys.readouterr()
        assert cli(["sweep", str(cfg), "--dry-run"]) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    err = sweep([str(tmp_path / "s0" / "run"), str(tmp_path / "empty")])
    assert ": models[1] (empty): " in err and "has no config.json" in err, err
    err = sweep([str(tmp_path / "s0" / "run"), str(tmp_path / "s1" / "run")])
    assert "models[1].name: 'run/checkpoint-1' clashes with models[0]" in err, err
    assert f"{{model: {tmp_path / 's1' / 'run'}, name: run-2}}: a run's checkpoints are named after it" in err, err


def test_a_run_folder_given_to_an_analysis_says_sweep_it_first(tmp_path, tok, capsys):
    for step in (1, 2):
        _save(tiny("llama", num_labels=1, seed=step), tok, tmp_path / "run" / f"checkpoint-{step}")
    assert cli(["analyze", "trajectory", str(tmp_path / "run"), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "is a training run's folder (checkpoint-N/ models), not scores: sweep it first" in err, err
