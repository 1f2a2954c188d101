"""Hidden states from the scan's own forward (issue 24 part 1) and the reward lens (part 2)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from cli_run import interrupt_scoring_at, one_line_error, run
from rounding import assert_agree_to_rounding
from rmfast.scoring.hf_path import final_norm_module
from rmfast.scoring.plan import plan_scoring
from rmfast.states import StatesWriter, open_states, parse_layers
from rmfast.template import build_template

PROMPT = "What, in one word, is the greatest thing ever?"
IDS = [[5], [77], [1234], [4000], [31], [9999]]


def _hf_reference(model, tmpl, ids):
    """HF's own forward of each whole sequence: {name: (N, D) float64-comparable} at the final position."""
    seqs = torch.tensor([tmpl.sequence(r) for r in ids])  # (N, L)
    pre = []
    h = final_norm_module(model).register_forward_pre_hook(lambda m, a: pre.append(a[0]))
    try:
        hs = model(input_ids=seqs, output_hidden_states=True).hidden_states
    finally:
        h.remove()
    L = len(hs) - 1
    out = {str(k): hs[k][:, -1] for k in range(L)}
    out.update(last_prenorm=pre[-1][:, -1], last_normed=hs[L][:, -1])
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_states_equal_hf_hidden_states(arch, engine, smol_tokenizer):
    """Every layer's state at the final position equals HF's ``hidden_states`` (fp32, to rounding measured
    against the float64 forward); the scores with states are the scores without, bit for bit."""
    m = T.tiny(arch, num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)
    tmpl = build_template(smol_tokenizer, PROMPT)
    plan = plan_scoring(m, tmpl, head="score", engine=engine, batch_size=len(IDS))
    layers = parse_layers("all", plan.n_layers)
    got = plan.score(IDS, states=layers)
    np.testing.assert_array_equal(got.scores, plan.score(IDS))
    ref = _hf_reference(m, tmpl, IDS)
    with torch.no_grad():
        ref64 = _hf_reference(T.tiny(arch, num_labels=1, pad_token_id=smol_tokenizer.pad_token_id,
                                     dtype=torch.float64), tmpl, IDS)
    assert list(got.states) == layers == list(ref)
    for name in layers:
        a, b, r = (x[name].detach().double().numpy().ravel() for x in (got.states, ref, ref64))
        assert got.states[name].dtype == torch.float32 and got.states[name].shape == (len(IDS), 64)
        assert_agree_to_rounding(b, a, r)  # E measured on HF's own fp32 forward
    # the names: last_normed is HF's hidden_states[-1] (the tuple's last entry is the normed last_hidden_state);
    # last_prenorm, the norm's input, is not
    with torch.no_grad():
        final = m(input_ids=torch.tensor([tmpl.sequence(r) for r in IDS]), output_hidden_states=True).hidden_states[-1]
    np.testing.assert_allclose(got.states["last_normed"].numpy(), final[:, -1].numpy(), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got.states["last_prenorm"].numpy(), final[:, -1].numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_lens_last_layer_is_the_score(engine, smol_tokenizer):
    m = T.tiny("llama", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)
    tmpl = build_template(smol_tokenizer, PROMPT)
    plan = plan_scoring(m, tmpl, head="score", engine=engine, batch_size=len(IDS))
    got = plan.score(IDS, lens=True)
    assert got.lens.shape == (len(IDS), plan.n_layers + 1)
    if engine == "fast":  # the same function of the same tensor
        np.testing.assert_array_equal(got.lens[:, -1], got.scores)
    else:  # HF's head on (B, D) rows vs its (B, L, D) forward: to rounding
        np.testing.assert_allclose(got.lens[:, -1], got.scores, rtol=1e-5, atol=1e-5)
    # an earlier layer's lens is another number (the lens reads each layer, not the last again)
    assert not np.allclose(got.lens[:, 0], got.scores)


def _scan(tiny_dir, out, capsys, *extra):
    args = ["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "0:600", "--batch-size", "64",
            "--no-progress", "--top", "0", "--out", str(out), *extra]
    return run(args, capsys)


def test_scan_states_scores_bit_identical_and_lens(tiny_dir, tmp_path, capsys):
    rc, _, se = _scan(tiny_dir, tmp_path / "plain.parquet", capsys)
    assert rc == 0, se
    rc, so, se = _scan(tiny_dir, tmp_path / "s.parquet", capsys, "--states", "0,2,last_prenorm,last_normed", "--lens",
                       "--states-dtype", "bfloat16")
    assert rc == 0, se
    assert f"and {tmp_path / 's.states'}/ (4 layers, bfloat16)" in so, so  # where the states went, said
    plain, s = pd.read_parquet(tmp_path / "plain.parquet"), pd.read_parquet(tmp_path / "s.parquet")
    np.testing.assert_array_equal(s["score"].to_numpy(), plain["score"].to_numpy())
    np.testing.assert_array_equal(s["lens_last"].to_numpy(), s["score"].to_numpy())
    assert [c for c in s if c.startswith("lens_")] == ["lens_0", "lens_1", "lens_2", "lens_last"]
    st = open_states(tmp_path / "s.parquet")
    assert st.layers == ["0", "2", "last_prenorm", "last_normed"] and st.manifest["dtype"] == "bfloat16"
    np.testing.assert_array_equal(np.sort(st.keys), np.arange(600))
    assert not (tmp_path / "s.states.partial").exists()
    man = json.loads((tmp_path / "s.parquet.json").read_text())
    assert man["states"]["folder"] == "s.states" and man["lens"]["layers"][-1] == "last"


def test_a_scan_killed_before_its_states_rename_is_finished_by_the_same_command(tiny_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """A kill after the Parquet and its manifest were written but before the states folder's rename: the rerun said
    "already exists; pass --overwrite" (reading as "rescore"), and readers took the Parquet as complete. The same
    command finishes it now from the checkpoint, scoring nothing again: scores and states equal an unbroken run's."""
    import os as _os

    from rmfast.states import writer as W

    rc, _, se = _scan(tiny_dir, tmp_path / "whole.parquet", capsys, "--states", "0,last_normed")
    assert rc == 0, se
    real = _os.replace

    def killed(src, dst):  # the kill, at the states folder's rename into place
        if _os.path.isdir(src):
            raise KeyboardInterrupt
        real(src, dst)

    out = tmp_path / "s.parquet"
    with monkeypatch.context() as m:
        m.setattr(W.os, "replace", killed)
        rc, _, se = _scan(tiny_dir, out, capsys, "--states", "0,last_normed")
    assert rc == 130 and out.exists() and (tmp_path / "s.parquet.json").exists()
    assert (tmp_path / "s.states.partial").is_dir() and not (tmp_path / "s.states").exists()
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "0,last_normed")
    assert rc == 0, se
    assert json.loads((tmp_path / "s.parquet.json").read_text())["resumed_candidates"] == 600  # nothing rescored
    whole, got = pd.read_parquet(tmp_path / "whole.parquet"), pd.read_parquet(out)
    np.testing.assert_array_equal(got["score"].to_numpy(), whole["score"].to_numpy())
    a, b = open_states(tmp_path / "whole.parquet"), open_states(out)
    ids = np.arange(600)
    for layer in ("0", "last_normed"):
        np.testing.assert_array_equal(b.take(layer, ids), a.take(layer, ids))
    assert not (tmp_path / "s.states.partial").exists() and not (tmp_path / "s.parquet.partial.npz").exists()
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "0,last_normed")
    assert one_line_error(rc, se) and "exists; use --overwrite" in se  # finished: a third run is refused as ever


def test_a_finished_scans_leftover_checkpoint_is_removed_by_the_rerun(tiny_dir, tmp_path, monkeypatch, capsys):
    """A kill after the output (and its states) were in place but before the checkpoint's removal left the checkpoint
    beside a finished scan for good: the rerun refused ("already exists") and nothing removed it. The rerun removes
    it now, the finished job's own only: another job's checkpoint there is kept."""
    from rmfast.scoring import pipeline

    def killed(res, checkpoint=None):
        raise KeyboardInterrupt

    out, ck = tmp_path / "s.parquet", tmp_path / "s.parquet.partial.npz"
    with monkeypatch.context() as m:
        m.setattr(pipeline, "drop_checkpoint", killed)
        rc, _, se = _scan(tiny_dir, out, capsys, "--states", "0")
    assert rc == 130 and ck.is_file() and (tmp_path / "s.states").is_dir()
    before, saved = out.read_bytes(), ck.read_bytes()
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "0")
    assert one_line_error(rc, se) and "exists; use --overwrite" in se
    assert not ck.exists() and not (tmp_path / "s.parquet.lock").exists() and out.read_bytes() == before
    ck.write_bytes(saved)  # the same key, every row done, but saved after the output: a later job's (a killed
    _scan(tiny_dir, out, capsys, "--states", "0")  # --lens or --states --overwrite rerun has that key): kept
    assert ck.is_file()
    ck.unlink()
    with monkeypatch.context() as m:  # another job's checkpoint (other candidates) beside the finished scan: kept
        m.setattr(pipeline, "drop_checkpoint", killed)
        rc, _, se = _scan(tiny_dir, tmp_path / "t.parquet", capsys, "--token-ids", "0:100")
    (tmp_path / "t.parquet.partial.npz").rename(ck)
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "0")
    assert one_line_error(rc, se) and ck.is_file()


def test_states_resume_after_interrupt_is_bit_identical(tiny_dir, tmp_path, monkeypatch, capsys):
    from rmfast.scoring import batching

    rc, _, se = _scan(tiny_dir, tmp_path / "whole.parquet", capsys, "--states", "all", "--lens")
    assert rc == 0, se
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    restore = interrupt_scoring_at(monkeypatch, 4)
    out = tmp_path / "resumed.parquet"
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "all", "--lens")
    assert rc == 130 and not out.exists()
    partial = tmp_path / "resumed.states.partial"
    assert len(list(partial.glob("shard-*.safetensors"))) >= 2  # one per checkpoint save
    restore()
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "all", "--lens")
    assert rc == 0, se
    assert json.loads((tmp_path / "resumed.parquet.json").read_text())["resumed_candidates"] == 192
    a, b = open_states(tmp_path / "whole.parquet"), open_states(out)
    assert a.layers == b.layers and b.n == 600
    for layer in a.layers:
        np.testing.assert_array_equal(a.take(layer, np.argsort(a.keys)), b.take(layer, np.argsort(b.keys)))
    w, r = pd.read_parquet(tmp_path / "whole.parquet"), pd.read_parquet(out)
    lens = [c for c in w if c.startswith("lens_")]
    np.testing.assert_array_equal(r[["score", *lens]].to_numpy(), w[["score", *lens]].to_numpy())


def test_a_rerun_asking_other_states_says_its_rows_are_scored_again(tiny_dir, tmp_path, monkeypatch, capsys):
    """(It rescored the checkpoint's rows without a word: a walkthrough.)"""
    from rmfast.scoring import batching

    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    restore = interrupt_scoring_at(monkeypatch, 4)
    out = tmp_path / "r.parquet"
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "all")
    assert rc == 130
    restore()
    with pytest.warns(UserWarning, match=r"note: the checkpoint's 192 scored rows are scored again: it kept states "
                                         r".* this scan asks for last_prenorm"):
        rc, _, se = _scan(tiny_dir, out, capsys, "--states", "last_prenorm")
    assert rc == 0, se


def test_writer_drops_a_shard_the_checkpoint_does_not_cover(tmp_path):
    """A kill between a shard's write and the checkpoint's save: the rerun deletes that shard and scores
    its rows again; rows the checkpoint holds without a state are scored again too."""
    folder = tmp_path / "x.states"
    w = StatesWriter(folder, ["last_prenorm"], "float32", "token_id", job="j")
    done = np.zeros(6, dtype=bool)
    assert not w.prepare(done).any()
    for lo in (0, 2, 4):
        rows = np.arange(lo, lo + 2)
        w.add(rows, rows + 100, {"last_prenorm": torch.full((2, 3), float(lo))})
        w.flush()
    done = np.array([1, 1, 1, 1, 0, 0], dtype=bool)  # the checkpoint saw the first two shards only
    w2 = StatesWriter(folder, ["last_prenorm"], "float32", "token_id", job="j")
    np.testing.assert_array_equal(w2.prepare(done), done)
    assert len(list(w2.partial.glob("shard-*"))) == 2
    w3 = StatesWriter(folder, ["last_prenorm"], "float32", "token_id", job="another job")
    with pytest.warns(UserWarning, match=r"kept states last_prenorm in float32 for another job \(its job\)"):
        assert not w3.prepare(np.ones(6, dtype=bool)).any()  # another job's shards: wiped, everything rescored
    w3.add(np.arange(6), np.arange(6) + 100, {"last_prenorm": torch.arange(18.0).view(6, 3)})
    w3.finish({"model": "m"})
    s = open_states(folder)
    assert s.n == 6 and s.take("last_prenorm", np.array([5]))[0].tolist() == [15.0, 16.0, 17.0]


def test_text_candidates_and_the_python_sink(tiny_dir, tmp_path, capsys):
    """Text candidates keyed by row; the Python sink gets what the folder holds. Both asked with the old name
    ``last`` (an old command): stored as last_prenorm, the note said once, and the sink's ``st["last"]`` works."""
    from rmfast import load
    from rmfast.scoring.pipeline import StatesRequest, score_texts

    cands = tmp_path / "c.txt"
    cands.write_text("Love\nThe universe\nPizza\n")
    with pytest.warns(UserWarning, match="layer 'last' is read as 'last_prenorm'") as said:
        rc, _, se = run(["scan", str(tiny_dir), "--dtype", "float32", "--candidates", str(cands), "--states", "last",
                         "--no-progress", "--top", "0", "--out", str(tmp_path / "t.parquet")], capsys)
    assert rc == 0, se
    assert sum("'last_prenorm'" in str(w.message) for w in said) == 1  # once, though the CLI and the scan both read it
    s = open_states(tmp_path / "t.parquet")
    assert s.key == "row" and sorted(s.keys.tolist()) == [0, 1, 2] and s.layers == ["last_prenorm"]
    assert sorted(s.texts().tolist()) == ["Love", "Pizza", "The universe"]
    lm = load(str(tiny_dir), dtype="float32", device="cpu")
    got = []
    with pytest.warns(UserWarning, match="'last_normed'"):
        res = score_texts(lm.model, lm.tokenizer, PROMPT, ["Love", "The universe", "Pizza"], progress=False,
                          states=StatesRequest("last", sink=lambda k, st: got.append((k, st["last"]))))
    keys = np.concatenate([k for k, _ in got])
    states = torch.cat([v for _, v in got]).numpy()[np.argsort(keys)]
    np.testing.assert_array_equal(states, s.take("last", np.argsort(s.keys)))
    assert res.manifest["states"]["folder"] is None


@pytest.mark.parametrize("argv, says", [
    (["--states", "foo"], "unknown layer"),
    (["--states", "7"], "out of range"),
    (["--states", "3"], "say last_prenorm"),
    (["--states", "-1"], "out of range"),
    (["--states-dtype", "float16"], "needs --states"),
])
def test_bad_states_input_is_one_line(argv, says, tiny_dir, tmp_path, capsys):
    rc, _, se = _scan(tiny_dir, tmp_path / "x.parquet", capsys, *argv)
    assert one_line_error(rc, se) and says in se, se
    assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "x.states").exists()


def test_lens_needs_a_score_head(tmp_path, smol_tokenizer, capsys):
    d = tmp_path / "lm"
    T.tiny("llama", "causal_lm").save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    rc, _, se = run(["scan", str(d), "--dtype", "float32", "--token-ids", "0:10", "--lens", "--no-progress",
                     "--out", str(tmp_path / "x.parquet")], capsys)
    assert one_line_error(rc, se) and "score head" in se, se


def test_random_head_seed_gives_a_causal_lm_a_score_head_states_and_lens(tmp_path, smol_tokenizer, capsys):
    d = tmp_path / "lm"
    T.tiny("llama", "causal_lm").save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    outs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.parquet"
        rc, _, se = run(["scan", str(d), "--dtype", "float32", "--token-ids", "0:10", "--random-head-seed", "3",
                         "--states", "last_normed", "--lens", "--no-progress", "--out", str(out)], capsys)
        assert rc == 0, se
        outs.append(pd.read_parquet(out))
        assert open_states(out).n == 10
    assert "lens_last" in outs[0] and np.array_equal(outs[0]["score"], outs[1]["score"])  # seeded: the same head


def test_analyze_lens_tables_and_figure(tiny_dir, tmp_path, capsys, monkeypatch):
    import rmfast.analysis.representations.lens as L

    titles, real = [], L.write_lens_figure
    monkeypatch.setattr(L, "write_lens_figure", lambda res, p, title=None: titles.append(title) or real(res, p, title))
    rc, _, se = _scan(tiny_dir, tmp_path / "s.parquet", capsys, "--lens")
    assert rc == 0, se
    rc, _, se = run(["analyze", "lens", str(tmp_path / "s.parquet"), "--out", str(tmp_path / "lens.csv"), "--k", "20"],
                    capsys)
    assert rc == 0, se
    model = json.loads((tmp_path / "s.parquet.json").read_text())["model"]
    assert titles == [f"reward lens: {model['name']}"]  # the model's name from the manifest (a random head said)
    t = pd.read_csv(tmp_path / "lens.csv")
    assert t["layer"].astype(str).tolist() == ["0", "1", "2", "last"]
    last = t.iloc[-1]
    assert abs(last["spearman"] - 1.0) < 1e-12 and last["top_k_overlap"] == 1.0 and last["bottom_k_overlap"] == 1.0
    assert np.isnan(t["spearman"].iloc[0]) and "undefined" in se  # layer 0: one template token in every row
    assert t["spearman"].iloc[1:3].abs().max() < 1.0
    assert (tmp_path / "lens.png").read_bytes()[:4] == b"\x89PNG"
    # the entry table against a direct computation: the first layer where each final top-20 row is in that layer's top-20
    df = pd.read_parquet(tmp_path / "s.parquet")
    rc, _, se = run(["analyze", "lens", str(tmp_path / "s.parquet"), "--table", "entry", "--k", "20",
                     "--out", str(tmp_path / "entry.csv")], capsys)
    e = pd.read_csv(tmp_path / "entry.csv", dtype={"first_layer": str, "stays_from": str})
    top = df.nlargest(20, "score")
    tops = {c: set(df.nlargest(20, c)["token_id"]) for c in ["lens_1", "lens_2", "lens_last"]}
    for tid, first in zip(e["token_id"], e["first_layer"]):
        want = next(c[5:] for c in tops if tid in tops[c])
        assert first == want, (tid, first, want)
    assert e["token_id"].tolist() == top["token_id"].tolist()


def test_analyze_lens_bad_input(tiny_dir, tmp_path, capsys):
    rc, _, se = _scan(tiny_dir, tmp_path / "p.parquet", capsys)
    rc, _, se = run(["analyze", "lens", str(tmp_path / "p.parquet")], capsys)
    assert one_line_error(rc, se) and "--lens" in se, se
    rc, _, se = run(["analyze", "lens", str(tmp_path / "nope.parquet")], capsys)
    assert one_line_error(rc, se), se
    rc, _, se = _scan(tiny_dir, tmp_path / "l.parquet", capsys, "--lens")
    rc, _, se = run(["analyze", "lens", str(tmp_path / "l.parquet"), "--k", "5000"], capsys)  # 600 rows
    assert rc == 0 and "k = 5,000 is cut to 600 of the 600 rows" in se, se  # was cut silently, every overlap 1


def test_disk_full_mid_scan_keeps_what_was_done(tiny_dir, tmp_path, monkeypatch, capsys):
    """A shard write that fails (ENOSPC) is one line + exit 2; the scores so far stay in the checkpoint,
    the shards so far in the partial folder, and the rerun ends bit-identical to an uninterrupted scan."""
    import errno

    import rmfast.io
    from rmfast.scoring import batching

    rc, _, se = _scan(tiny_dir, tmp_path / "whole.parquet", capsys, "--states", "1,last_prenorm")
    assert rc == 0, se
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    real, calls = rmfast.io.atomic_write, {"n": 0}

    def full(path, write, **kw):
        if str(path).endswith(".safetensors"):
            calls["n"] += 1
            if calls["n"] >= 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, write, **kw)

    monkeypatch.setattr(rmfast.io, "atomic_write", full)
    out = tmp_path / "r.parquet"
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "1,last_prenorm")
    assert one_line_error(rc, se) and "No space left" in se, se
    assert len(list((tmp_path / "r.states.partial").glob("shard-*"))) == 2
    assert (tmp_path / "r.parquet.partial.npz").exists() and not out.exists()
    monkeypatch.setattr(rmfast.io, "atomic_write", real)
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "1,last_prenorm")
    assert rc == 0, se
    a, b = open_states(tmp_path / "whole.parquet"), open_states(out)
    for layer in ("1", "last_prenorm"):
        np.testing.assert_array_equal(a.take(layer, np.argsort(a.keys)), b.take(layer, np.argsort(b.keys)))


def test_logprob_head_states_equal_hf(smol_tokenizer):
    """A causal LM (logprob head): the state of the position that predicts the last end-of-turn token."""
    m = T.tiny("llama", "causal_lm")
    tmpl = build_template(smol_tokenizer, PROMPT)
    assert tmpl.continuation_ids
    got = {e: plan_scoring(m, tmpl, head="logprob", engine=e, batch_size=len(IDS)).score(IDS, states=["1", "last_prenorm"])
           for e in ("fast", "hf")}
    seqs = torch.tensor([[*tmpl.prefix_ids, *r, *tmpl.continuation_ids] for r in IDS])

    def reference(model):  # {name: (N*D,)} at position -2 of the whole sequence
        pre = []
        h = final_norm_module(model).register_forward_pre_hook(lambda mod, a: pre.append(a[0]))
        with torch.no_grad():
            hs = model(input_ids=seqs, output_hidden_states=True).hidden_states
        h.remove()
        return {"1": hs[1][:, -2].double().numpy().ravel(), "last_prenorm": pre[-1][:, -2].double().numpy().ravel()}

    ref, ref64 = reference(m), reference(T.tiny("llama", "causal_lm", dtype=torch.float64))
    for e in got:
        for name in ("1", "last_prenorm"):
            assert_agree_to_rounding(ref[name], got[e].states[name].double().numpy().ravel(), ref64[name])
        np.testing.assert_array_equal(got[e].scores, plan_scoring(m, tmpl, head="logprob", engine=e,
                                                                 batch_size=len(IDS)).score(IDS))


# ------------------------------------------------------------------ issue 35: states under hostile input

def test_a_link_or_a_file_where_the_states_go_is_refused_before_any_work(tiny_dir, tmp_path, capsys):
    """States moved to another disk and linked back (or a file at ``<stem>.states``): a scan with --states --overwrite
    is one line, exit 2, before any work; the scan, its Parquet and the linked states are kept. Before, it scored
    everything, replaced the Parquet, then stopped with a traceback (rmtree on a link) and the old states orphaned."""
    import hashlib

    out = tmp_path / "ln.parquet"
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "last_prenorm")
    assert rc == 0, se
    away = tmp_path / "disk2" / "ln.states"
    away.parent.mkdir()
    (tmp_path / "ln.states").rename(away)
    (tmp_path / "ln.states").symlink_to(away, target_is_directory=True)
    md5 = hashlib.md5(out.read_bytes()).hexdigest()
    rc, _, se = _scan(tiny_dir, out, capsys, "--prompt", "worst", "--states", "last_prenorm", "--overwrite")
    assert one_line_error(rc, se) and "ln.states is a symbolic link, not a states folder" in se, se
    assert hashlib.md5(out.read_bytes()).hexdigest() == md5 and open_states(out).n == 600  # nothing lost
    (tmp_path / "ln.states").unlink()
    (tmp_path / "ln.states").write_text("x")
    rc, _, se = _scan(tiny_dir, out, capsys, "--prompt", "worst", "--states", "last_prenorm", "--overwrite")
    assert one_line_error(rc, se) and "ln.states is a regular file, not a states folder" in se, se
    assert hashlib.md5(out.read_bytes()).hexdigest() == md5


def test_states_are_tied_to_their_scan(tiny_dir, tmp_path, capsys):
    """An overwrite without --states removes the old states; a states folder of another write of the scan
    (or of another prompt, written without a write id) beside it is refused in one line by every reader."""
    import shutil

    from rmfast.errors import UserError
    from rmfast.states import write_states

    out = tmp_path / "s.parquet"
    rc, _, se = _scan(tiny_dir, out, capsys, "--states", "last_prenorm")
    assert rc == 0, se
    tie = open_states(out).manifest["scan"]
    assert tie["write_id"] == json.loads((tmp_path / "s.parquet.json").read_text())["write_id"]
    assert tie["prompt"] == PROMPT and tie["n_candidates"] == 600 and tie["model"]["content_sha256"]
    shutil.copytree(tmp_path / "s.states", tmp_path / "old.states")
    rc, _, se = _scan(tiny_dir, out, capsys, "--prompt", "worst", "--overwrite")  # no --states: the old ones go
    assert rc == 0, se
    assert not (tmp_path / "s.states").exists()
    shutil.copytree(tmp_path / "old.states", tmp_path / "s.states")  # the first prompt's states put back beside it
    with pytest.raises(UserError, match=r"s.states belongs to the scan written as .*not from this scan"):
        open_states(out)
    rc, _, se = run(["analyze", "similarity", out, out, "--out", tmp_path / "sim.csv"], capsys)
    assert one_line_error(rc, se) and "not from this scan" in se, se
    shutil.rmtree(tmp_path / "s.states")  # states written without a scan (the API): compared on model, prompt, count
    write_states(tmp_path / "s.states", np.arange(600), {"last_prenorm": np.zeros((600, 4), "float32")},
                 scan={"prompt": PROMPT, "n_candidates": 600})
    with pytest.raises(UserError, match=r"its prompt is not s.parquet's"):
        open_states(out)
    write_states(tmp_path / "s.states", np.arange(600), {"last_prenorm": np.zeros((600, 4), "float32")},
                 scan={"prompt": "worst", "n_candidates": 600})
    assert open_states(out).n == 600  # the same prompt and count: accepted
    with pytest.raises(UserError, match="token_id 0 is given 3 times"):  # (a reader dropped them, then blamed the sets)
        write_states(tmp_path / "d.states", [0, 0, 0, 1], {"last_prenorm": np.zeros((4, 4), "float32")})
    assert not (tmp_path / "d.states").exists()


def test_float16_states_overflow_is_counted_and_warned(tmp_path, smol_tokenizer, capsys):
    """Activations past float16's 65,504 stored as float16 are inf: counted per layer in the states
    manifest and warned about in one line naming the fix; fp32 states of the same scan have none."""
    d = tmp_path / "big"
    m = T.tiny("llama", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(1e6)  # embeddings ~1e4-1e6: past float16's range
    m.save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    with pytest.warns(UserWarning, match=r"stored states are NaN or infinite \(0: .*states_dtype bfloat16 or float32"):
        rc, _, se = _scan(d, tmp_path / "h.parquet", capsys, "--states", "0,last_prenorm", "--states-dtype", "float16")
    assert rc == 0, se
    man = open_states(tmp_path / "h.parquet").manifest
    assert man["n_nonfinite"]["0"] > 0, man
    st = open_states(tmp_path / "h.parquet")
    assert (~np.isfinite(st.take("0", np.arange(st.n)))).sum() == man["n_nonfinite"]["0"]
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*stored states are NaN")
        rc, _, se = _scan(d, tmp_path / "f.parquet", capsys, "--states", "0,last_prenorm", "--states-dtype", "float32")
    assert rc == 0, se
    assert open_states(tmp_path / "f.parquet").manifest["n_nonfinite"] == {"0": 0, "last_prenorm": 0}


def _small_states(folder):
    from rmfast.states import write_states

    return write_states(folder, np.arange(6), {"last_prenorm": np.arange(18, dtype="float32").reshape(6, 3)}, shard_rows=4)


def test_a_half_copied_shard_is_one_line(tmp_path):
    """A shard cut short (a copy that did not finish): refused naming the file and both sizes, not a
    numpy mmap error."""
    from rmfast.errors import UserError

    folder = _small_states(tmp_path / "s.states")
    shard = folder / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(UserError, match=r"shard-00001.safetensors: \d+ bytes, but its header needs \d+ \(cut short"):
        open_states(folder)


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.update(shards="shard-00000.safetensors"), "shards must be a list"),
    (lambda m: m["shards"][0].update(rows="4"), "shard 0 must be"),
    (lambda m: m["shards"][0].update(file="../../etc/passwd"), "shard 0 must be"),
    (lambda m: m["shards"].__setitem__(1, ["shard-00001.safetensors", 2]), "shard 1 must be"),
    (lambda m: m.update(n="6"), "n must be a non-negative integer"),
    (lambda m: m.update(hidden_size=0), "hidden_size must be a positive integer"),
    (lambda m: m.update(layers="last"), "layers must be distinct"),
])
def test_a_hand_edited_manifest_is_one_line(edit, says, tmp_path):
    from rmfast.errors import UserError

    folder = _small_states(tmp_path / "s.states")
    man = json.loads((folder / "manifest.json").read_text())
    edit(man)
    (folder / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(UserError, match=says):
        open_states(folder)


def test_analyze_lens_keeps_an_existing_figure_without_overwrite(tiny_dir, tmp_path, capsys):
    """--out lens.csv writes lens.png beside it: an existing lens.png is replaced only with --overwrite."""
    rc, _, se = _scan(tiny_dir, tmp_path / "s.parquet", capsys, "--lens")
    assert rc == 0, se
    (tmp_path / "lens.png").write_bytes(b"mine")
    argv = ["analyze", "lens", tmp_path / "s.parquet", "--out", tmp_path / "lens.csv"]
    rc, _, se = run(argv, capsys)
    assert one_line_error(rc, se) and "lens.png already exists" in se, se
    assert (tmp_path / "lens.png").read_bytes() == b"mine" and not (tmp_path / "lens.csv").exists()
    rc, _, se = run(argv + ["--overwrite"], capsys)
    assert rc == 0, se
    assert (tmp_path / "lens.png").read_bytes()[:4] == b"\x89PNG"


def test_two_folders_with_one_vocabulary_join_on_token_id(tiny_dir, tmp_path, capsys):
    """A reward model and its base model: two tokenizer folders, one vocabulary. The manifests record the
    vocabulary's content hash, and the states join compares that (it compared the folders' paths and fell
    back to decoded text, dropping every candidate whose text occurs twice)."""
    import shutil

    from rmfast.analysis.representations.similarity import align

    other = tmp_path / "base-model"
    shutil.copytree(tiny_dir, other)
    for d, name in ((tiny_dir, "a"), (other, "b")):
        rc, _, se = _scan(d, tmp_path / f"{name}.parquet", capsys, "--states", "last_normed")
        assert rc == 0, se
    a, b = open_states(tmp_path / "a.parquet"), open_states(tmp_path / "b.parquet")
    assert a.manifest["scan"]["tokenizer"] != b.manifest["scan"]["tokenizer"]
    al = align([a, b])
    assert al.join == "id" and al.n == 600, (al.join, al.n)
    from rmfast.scoring.candidates import vocab_sha256
    from transformers import AutoTokenizer

    assert a.manifest["scan"]["vocab_sha256"] == vocab_sha256(AutoTokenizer.from_pretrained(tiny_dir))
    assert json.loads((tmp_path / "a.parquet.json").read_text())["vocab_sha256"] == a.manifest["scan"]["vocab_sha256"]


def test_analyze_lens_entry_table_says_what_score_is(tiny_dir, tmp_path, capsys):
    """Issue 51 item 5: the lens's entry table holds the scan's scores; its CSV says what they are (the scan's
    score_meaning, a column: a CSV has no schema metadata); the layers table, without scores, is as it was."""
    rc, _, se = _scan(tiny_dir, tmp_path / "s.parquet", capsys, "--lens")
    assert rc == 0, se
    meaning = json.loads((tmp_path / "s.parquet.json").read_text())["score_meaning"]
    rc, _, se = run(["analyze", "lens", str(tmp_path / "s.parquet"), "--table", "entry", "--k", "5",
                     "--out", str(tmp_path / "entry.csv")], capsys)
    assert rc == 0, se
    e = pd.read_csv(tmp_path / "entry.csv")
    assert "score" in e and (e["score_meaning"] == meaning).all()
    rc, _, se = run(["analyze", "lens", str(tmp_path / "s.parquet"), "--out", str(tmp_path / "layers.csv")], capsys)
    assert rc == 0 and "score_meaning" not in pd.read_csv(tmp_path / "layers.csv"), se
