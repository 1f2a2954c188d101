"""Hidden states on every input (issue 24 part 1): sweeps (per part, resumable), torchrun-sharded scans
(one states folder from every rank's rows) and the TRL callback's checkpoint scans. Scores with states
are the scores without, bit for bit; bad layers are one line, exit 2, before any work."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import tiny_models as T
from cli_run import interrupt_scoring_at, one_line_error, run
from rmfast.states import open_states
from rmfast.sweep.store import load_results

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?", "best": "What, in one word, is the best thing ever?"}
TEXTS = ["Love", "The universe", "Water", "music and art", "Albert Einstein", "a cup of tea", "Pizza", "sunsets"]


@pytest.fixture(scope="module")
def work(tmp_path_factory, smol_tokenizer):
    d = tmp_path_factory.mktemp("states-scaleout")
    T.save_rms(d, smol_tokenizer, (("rm-a", "llama", 0), ("rm-b", "qwen2", 1)))
    (d / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    return d


def write_cfg(d, name, **over):
    import yaml

    cfg = {"defaults": {"dtype": "float32", "device": "cpu", "batch_size": 32},
           "models": ["./rm-a", {"model": "./rm-b", "states": ["last"], "states_dtype": "bfloat16"}],
           "prompts": PROMPTS, "candidates": {"vocab": {"vocabulary": {"token_ids": "0:200"}}, "texts": "texts.txt"}}
    cfg.update(over)
    (d / name).write_text(yaml.safe_dump(cfg, sort_keys=False))
    return d / name


def parts(store):
    return sorted(store.glob("parts/*/*/*/part.parquet"))


def states_by_key(path):
    """{layer: rows ordered by key} of a states folder (or the one beside a Parquet)."""
    s = open_states(path)
    o = np.argsort(s.keys, kind="stable")
    return s, {layer: s.take(layer, o) for layer in s.layers}


# ------------------------------------------------------------------ sweeps


def test_sweep_states_per_part_bit_identical_scores(work, tmp_path, capsys):
    """The config says states in the old spelling (last): the parts store last_prenorm, and a store whose part
    manifests still say last (written before the rename) is done, not scored again."""
    plain = write_cfg(work, "plain.yaml", models=["./rm-a", "./rm-b"])
    rc, _, se = run(["sweep", plain, "--out", tmp_path / "plain", "--no-progress"], capsys)
    assert rc == 0, se
    cfg = write_cfg(work, "states.yaml", defaults={"dtype": "float32", "device": "cpu", "batch_size": 32,
                                                    "states": "0,last", "lens": True})
    store = tmp_path / "st"
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    a, b = load_results(tmp_path / "plain"), load_results(store)
    pd.testing.assert_frame_equal(a, b)  # the same scores, bit for bit
    for p in parts(store):
        s, _ = states_by_key(p)
        man = json.loads(p.with_name("part.parquet.json").read_text())
        df = pd.read_parquet(p)
        assert s.n == len(df) == man["rows"] and s.path.name == "part.states"
        assert s.layers == (["last_prenorm"] if "rm-b" in str(p) else ["0", "last_prenorm"])
        assert s.manifest["dtype"] == ("bfloat16" if "rm-b" in str(p) else "float32")
        assert s.key == ("row" if "texts" in str(p) else "token_id")
        if s.key == "token_id":
            np.testing.assert_array_equal(np.sort(s.keys), np.arange(200))
        else:
            assert sorted(s.texts().tolist()) == sorted(TEXTS)
        assert [c for c in df if c.startswith("lens_")][-1] == "lens_last"
        np.testing.assert_array_equal(df["lens_last"].to_numpy(), df["score"].to_numpy())
        assert man["outputs"]["states"] == ("last_prenorm" if "rm-b" in str(p) else "0,last_prenorm")
        assert not list(p.parent.glob("*.partial*"))
    idx = json.loads((store / "manifest.json").read_text())
    assert {tuple(s["states"]) for s in idx["parts"]} == {("0", "last_prenorm"), ("last_prenorm",)}
    rc, so, se = run(["results", store, "--parts"], capsys)
    assert rc == 0 and "0,last_prenorm" in so, se
    before = {p: p.stat().st_mtime_ns for p in parts(store)}
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "8 already done" in se
    assert {p: p.stat().st_mtime_ns for p in parts(store)} == before
    for p in parts(store):  # the part manifests as a sweep wrote them before the rename: still done
        mp = p.with_name("part.parquet.json")
        man = json.loads(mp.read_text())
        man["outputs"]["states"] = man["outputs"]["states"].replace("last_prenorm", "last")
        mp.write_text(json.dumps(man))
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "8 already done" in se and "lack the states" not in se, se
    assert {p: p.stat().st_mtime_ns for p in parts(store)} == before
    # a finished store without states, asked for them: its parts are computed again, the same scores
    rc, so, se = run(["sweep", plain, "--out", tmp_path / "plain", "--states", "last_normed", "--no-progress"], capsys)
    assert rc == 0 and "8 finished part(s) lack the states" in se, se
    pd.testing.assert_frame_equal(load_results(tmp_path / "plain"), a)
    assert all(open_states(p).layers == ["last_normed"] for p in parts(tmp_path / "plain"))


def test_sweep_states_resume_after_interrupt(work, tmp_path, monkeypatch, capsys):
    from rmfast.scoring import batching

    cfg = write_cfg(work, "resume.yaml", models=["./rm-a"], defaults={"dtype": "float32", "device": "cpu",
                                                                         "batch_size": 32, "states": "all"})
    rc, _, se = run(["sweep", cfg, "--out", tmp_path / "whole", "--no-progress"], capsys)
    assert rc == 0, se
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    restore = interrupt_scoring_at(monkeypatch, 10)  # the 7 batches of the first part, then the texts' third
    store = tmp_path / "resumed"
    rc, _, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 130, se
    assert len(list(store.glob("parts/*/*/*/part.states"))) == 1  # the finished part's, complete
    assert len(list(store.glob("parts/*/*/*/part.states.partial/shard-*"))) >= 2  # the interrupted one's
    restore()
    rc, _, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "1 already done" in se, se
    pd.testing.assert_frame_equal(load_results(tmp_path / "whole"), load_results(store))
    resumed = [json.loads(p.with_name("part.parquet.json").read_text())["scan"]["resumed_candidates"] for p in parts(store)]
    assert max(resumed) > 0
    for p, q in zip(parts(tmp_path / "whole"), parts(store)):
        (s, a), (t, b) = states_by_key(p), states_by_key(q)
        assert s.layers == t.layers == ["0", "1", "2", "last_prenorm", "last_normed"]
        for layer in s.layers:
            np.testing.assert_array_equal(a[layer], b[layer])


@pytest.mark.parametrize("how, says", [
    ({"cfg": {"states": "foo"}}, "unknown layer"),
    ({"cfg": {"states_dtype": "float16"}}, "needs states"),
    ({"argv": ["--states", "7"]}, "out of range"),
    ({"argv": ["--states", "bar"]}, "unknown layer"),
    ({"argv": ["--states-dtype", "float16"]}, "needs --states"),
])
def test_sweep_bad_states_is_one_line(how, says, work, tmp_path, capsys):
    defaults = {"dtype": "float32", "device": "cpu", **how.get("cfg", {})}
    cfg = write_cfg(work, "bad.yaml", models=["./rm-a"], defaults=defaults)
    rc, _, se = run(["sweep", cfg, "--out", tmp_path / "bad", "--no-progress", *how.get("argv", [])], capsys)
    assert one_line_error(rc, se) and says in se, se
    assert not parts(tmp_path / "bad")


# ------------------------------------------------------------------ torchrun shards


@pytest.mark.parametrize("kind", ["texts", "vocab"])
def test_torchrun_scan_states_one_folder(kind, work, tmp_path, capsys):
    """Two gloo ranks each keep the states of their rows; rank 0 joins them into one folder that
    ``open_states`` and ``analyze similarity`` read as any other. Scores with states == without, to the bit
    (the same ranks, threads and batches); states == one process's to fp32 rounding."""
    from test_dist import torchrun

    cands = ["--candidates", work / "texts.txt"] if kind == "texts" else ["--token-ids", "0:300"]
    base = ["scan", work / "rm-a", "--prompt", PROMPTS["greatest"], "--dtype", "float32", *cands, "--no-progress",
            "--top", "0", "--batch-size", "16"]
    torchrun([*base, "--out", tmp_path / "plain.parquet"], work)
    torchrun([*base, "--states", "0,last_prenorm", "--lens", "--out", tmp_path / "two.parquet"], work)
    rc, _, se = run([*base, "--states", "0,last_prenorm", "--out", tmp_path / "one.parquet"], capsys)
    assert rc == 0, se
    plain, two = pd.read_parquet(tmp_path / "plain.parquet"), pd.read_parquet(tmp_path / "two.parquet")
    np.testing.assert_array_equal(two["score"].to_numpy(), plain["score"].to_numpy())
    np.testing.assert_array_equal(two["lens_last"].to_numpy(), two["score"].to_numpy())
    (s, a), (t, b) = states_by_key(tmp_path / "two.parquet"), states_by_key(tmp_path / "one.parquet")
    assert s.n == t.n == len(two) and s.layers == t.layers == ["0", "last_prenorm"] and s.manifest["ranks"] == 2
    np.testing.assert_array_equal(np.sort(s.keys), np.sort(t.keys))
    if s.key == "row":
        assert s.texts().tolist() == [two["text"][k] for k in s.keys] and sorted(s.texts()) == sorted(TEXTS)
    for layer in s.layers:
        np.testing.assert_allclose(a[layer], b[layer], rtol=1e-4, atol=1e-5)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["one.parquet", "one.parquet.json", "one.states", "plain.parquet",
                                                          "plain.parquet.json", "two.parquet", "two.parquet.json",
                                                          "two.states"]  # the ranks' files are gone
    rc, _, se = run(["analyze", "similarity", tmp_path / "two.parquet", tmp_path / "one.parquet", "--bootstrap", "0",
                     "--permutations", "0", "--out", tmp_path / "sim.csv"], capsys)
    assert rc == 0, se
    sim = pd.read_csv(tmp_path / "sim.csv")
    last = sim[(sim.layer_a == "last_prenorm") & (sim.layer_b == "last_prenorm")]
    assert last["rv"].iloc[0] == pytest.approx(1.0, abs=1e-5)


def test_torchrun_sweep_states_per_part(work, tmp_path):
    """A sweep's parts are dealt to the ranks; each rank writes the states of its own parts."""
    from test_dist import torchrun

    cfg = write_cfg(work, "dist.yaml")
    torchrun(["sweep", cfg, "--out", tmp_path / "two", "--states", "last_prenorm", "--no-progress"], work)
    idx = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert idx["complete"] and {s["rank"] for s in idx["parts"]} == {0, 1}
    assert all(s["states"] == ["last_prenorm"] for s in idx["parts"])
    for p in parts(tmp_path / "two"):
        assert open_states(p).n == len(pd.read_parquet(p)) and not list(p.parent.glob("*.partial*"))


# ------------------------------------------------------------------ the TRL callback


def test_trl_callback_writes_states_per_checkpoint(tmp_path):
    """Two callbacks x-ray the same checkpoints, one with states and the lens: the same scores, bit for bit,
    and one states folder per checkpoint and prompt."""
    from test_training import PROMPT as P, _need_train, _tiny_rm, _trainer
    from tiny_models import chatml_tokenizer

    _need_train()
    from rmfast.integrations.trl import XrayCallback, XrayConfig
    from rmfast.scoring.pipeline import Selection

    tok = chatml_tokenizer()
    plain, st = (XrayCallback(XrayConfig(prompts={"greatest": P}, selection=Selection(token_ids="0:300"), name="rm",
                                         out=tmp_path / x, **kw))
                 for x, kw in (("plain", {}), ("st", {"states": "0,last_prenorm", "states_dtype": "bfloat16", "lens": True})))
    _trainer(_tiny_rm(), tok, tmp_path / "run", [plain, st]).train()
    for step in (1, 2):
        a = pd.read_parquet(tmp_path / "plain" / f"checkpoint-{step}" / "greatest.parquet")
        b = pd.read_parquet(tmp_path / "st" / f"checkpoint-{step}" / "greatest.parquet")
        np.testing.assert_array_equal(a["score"].to_numpy(), b["score"].to_numpy())
        np.testing.assert_array_equal(b["lens_last"].to_numpy(), b["score"].to_numpy())
        s = open_states(tmp_path / "st" / f"checkpoint-{step}" / "greatest.parquet")
        assert s.n == 300 and s.layers == ["0", "last_prenorm"] and s.manifest["dtype"] == "bfloat16"
        assert s.manifest["scan"]["model"]["name"] == f"rm/checkpoint-{step}"
        assert not (tmp_path / "plain" / f"checkpoint-{step}" / "greatest.states").exists()


def test_trl_callback_bad_states_before_training(tmp_path):
    from test_training import PROMPT as P, _need_train, _tiny_rm, _trainer
    from tiny_models import chatml_tokenizer

    from rmfast.errors import UserError
    from rmfast.integrations.trl import XrayCallback, XrayConfig

    for kw, says in (({"states": "foo", "out": tmp_path}, "unknown layer"), ({"states": "last_normed"}, "give out"),
                     ({"states_dtype": "float16", "out": tmp_path}, "needs states")):
        with pytest.raises(UserError, match=says):
            XrayConfig(prompts=[P], **kw)
    _need_train()
    cb = XrayCallback(XrayConfig(prompts=[P], out=tmp_path / "x", states="7"))
    with pytest.raises(UserError, match="out of range"):
        _trainer(_tiny_rm(), chatml_tokenizer(), tmp_path / "run", [cb]).train()
    assert not list((tmp_path / "run").glob("checkpoint-*"))  # no step ran
