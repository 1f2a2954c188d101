"""Scale-out: ranks from the environment, torchrun (two gloo CPU processes) == one process to fp32
rounding, --shard jobs in this process == one process to the bit, and --device-map auto.

torchrun's ranks run with other thread counts (and, for a split scan, other batches) than this
process, so their fp32 sums reduce in another order: the same rows, scores equal to rounding
(tests/rounding.py derives the bound from a float64 evaluation of the same rows)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rounding as R
import tiny_models as T
from rmfast.loading.spread import load_spread
from rmfast.sweep import dist
from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.sweep.store import load_results

TORCHRUN = Path(sys.executable).parent / "torchrun"
PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?", "best": "What, in one word, is the best thing ever?"}
TEXTS = ["Love", "The universe", "Water", "music and art", "Albert Einstein", "a cup of tea", "Pizza", "sunsets",
         "Freedom", "the smell of rain"]


@pytest.fixture(scope="module")
def work(tmp_path_factory, smol_tokenizer):
    import yaml

    d = tmp_path_factory.mktemp("dist")
    T.save_rms(d, smol_tokenizer, (("rm-a", "llama", 0), ("rm-b", "gemma", 1)))
    (d / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    cfg = {"defaults": {"dtype": "float32", "device": "cpu"}, "models": ["./rm-a", "./rm-b"], "prompts": PROMPTS,
           "candidates": {"vocab": {"vocabulary": {"token_ids": "0:300"}}, "texts": "texts.txt"}}
    (d / "sweep.yaml").write_text(yaml.safe_dump(cfg))
    return d


@pytest.fixture(scope="module")
def one_store(work, tmp_path_factory):
    """The sweep run by one plain process: what every split run must reproduce."""
    out = tmp_path_factory.mktemp("one") / "store"
    assert main(["sweep", str(work / "sweep.yaml"), "--out", str(out), "--no-progress"]) == 0
    return load_results(out, token_ids=True)


@pytest.fixture(scope="module")
def ref64(work, one_store):
    """one_store's rows evaluated in float64: the yardstick of fp32 rounding."""
    return R.float64_scores(one_store, {m: work / m for m in ("rm-a", "rm-b")})


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    return e


def torchrun(args, cwd):
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed beside this Python")
    p = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "rmfast", *map(str, args)],
                       cwd=cwd, env=env(), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


# ------------------------------------------------------------------ environment


def test_ranks_from_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert dist.from_env() == dist.Dist()  # outside torchrun nothing changes
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert dist.from_env() == dist.Dist()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(UserError, match="MASTER_ADDR"):
        dist.from_env()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    d = dist.from_env()
    assert (d.rank, d.world, d.group) == (2, 4, True) and d.mine(10).tolist() == [2, 6]
    with pytest.raises(UserError, match="torchrun"):
        dist.from_env("0/2")
    monkeypatch.delenv("WORLD_SIZE")
    assert dist.from_env("1/3") == dist.Dist(1, 3, 0, False)
    for bad in ("3/3", "a/b", "1", "-1/2"):
        with pytest.raises(UserError, match="shard"):
            dist.parse_shard(bad)


def test_assignment_balances_and_covers(work):
    from rmfast.sweep import assign, load_config

    cfg = load_config(work / "sweep.yaml")
    plan = cfg.plan()
    for world in (1, 2, 3, 8):
        shares = assign(plan, cfg, world)
        got = [p for s in shares for p in s]
        assert sorted(got, key=plan.index) == plan and len(set(got)) == len(plan)
    two = assign(plan, cfg, 2)
    assert {p.candidates for p in two[0]} == {p.candidates for p in two[1]} == {"vocab", "texts"}  # both get big parts


# ------------------------------------------------------------------ torchrun == one process


def test_torchrun_sweep_equals_one_process(work, one_store, ref64, tmp_path):
    """The same rows and every column but the scores identical; scores equal to fp32 rounding (the
    ranks run one thread each, this process its own count), ranks equal up to near-ties."""
    p = torchrun(["sweep", "sweep.yaml", "--out", tmp_path / "two", "--no-progress"], work)
    assert "[rank0-of-2]" in p.stderr and "[rank1-of-2]" in p.stderr
    idx = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert idx["complete"] and {s["rank"] for s in idx["parts"]} == {0, 1}
    b = load_results(tmp_path / "two", token_ids=True)
    assert len(one_store) == 2 * 2 * (300 + len(TEXTS))
    R.assert_same_rows_scores_to_rounding(one_store, b, ref64)


def test_torchrun_scan_shards_and_merges(work, one_store, ref64, tmp_path, capsys):
    args = ["scan", work / "rm-a", "--prompt", PROMPTS["greatest"], "--dtype", "float32", "--candidates", work / "texts.txt",
            "--no-progress", "--top", "3"]
    assert main([*map(str, args), "--out", str(tmp_path / "one.parquet")]) == 0
    p = torchrun([*args, "--out", tmp_path / "two.parquet"], work)
    assert p.stdout.count("top 3") == 1  # rank 0 alone reports
    a, b = pd.read_parquet(tmp_path / "one.parquet"), pd.read_parquet(tmp_path / "two.parquet")
    assert a["text"].tolist() == b["text"].tolist() == TEXTS
    # each rank scored half the texts in its own batches and threads: equal to fp32 rounding
    rows = (one_store["model"] == "rm-a") & (one_store["prompt"] == PROMPTS["greatest"]) & (one_store["candidates"] == "texts")
    r = pd.Series(ref64[rows.to_numpy()], index=one_store.loc[rows, "text"])[a["text"]]
    R.assert_agree_to_rounding(a["score"], b["score"], r)
    man = json.loads(Path(str(tmp_path / "two.parquet") + ".json").read_text())
    assert man["distributed"]["world"] == 2 and [r["n"] for r in man["distributed"]["ranks"]] == [5, 5]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["one.parquet", "one.parquet.json", "two.parquet",
                                                           "two.parquet.json"]  # shard files are gone


def test_torchrun_scan_keeps_every_ranks_scores_until_its_output_is_written(work, tmp_path):
    """Rank 0's write of the merged output fails (a full disk): every rank's checkpoint is still on disk (they were
    dropped at the barrier, so the rerun scored all other ranks' rows again), and the rerun resumes them all. A plain
    scan writing the same --out (its lock held) stops the torchrun scan at once."""
    from filelock import FileLock

    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed beside this Python")
    out = tmp_path / "scan.parquet"
    args = ["scan", work / "rm-a", "--prompt", PROMPTS["best"], "--dtype", "float32", "--candidates", work / "texts.txt",
            "--no-progress", "--out", out]

    def run(**kw):
        return subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(Path(__file__).parent /
                               "torchrun_fault.py"), *map(str, args)], cwd=work, env={**env(), **kw,
                              "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL)

    p = run(FAIL_WRITE="1")
    assert p.returncode != 0 and "No space left" in p.stderr and "every rank's" in p.stderr  # torchrun's own code
    assert sorted(x.name for x in tmp_path.glob("*.npz")) == ["scan.parquet.partial.rank0-of-2.npz",
                                                              "scan.parquet.partial.rank1-of-2.npz"]
    p = run()
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(Path(str(out) + ".json").read_text())["resumed_candidates"] == len(TEXTS)  # nothing rescored
    assert sorted(x.name for x in tmp_path.iterdir()) == ["scan.parquet", "scan.parquet.json"]
    with FileLock(str(tmp_path / "again.parquet") + ".lock"):  # a plain scan of the same --out is running
        args[-1] = tmp_path / "again.parquet"
        p = run()
    assert p.returncode != 0 and "another rmfast job is writing" in p.stderr


def test_shard_jobs_fill_one_store(work, one_store, tmp_path, capsys):
    """SLURM-array style: independent --shard I/N jobs; the last to finish writes the complete index.

    Bit-identical here: the jobs run in this process (same threads) and each part is scored whole,
    in the same batches as by one_store. Jobs on other machines or thread counts agree to rounding."""
    store = tmp_path / "arr"
    for i in range(3):
        assert main(["sweep", str(work / "sweep.yaml"), "--out", str(store), "--shard", f"{i}/3", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "8/8 parts" in out.out and "complete" in out.out
    pd.testing.assert_frame_equal(load_results(store, token_ids=True), one_store)


# ------------------------------------------------------------------ device_map


def test_device_map_auto_on_the_plain_hf_path(work):
    from rmfast.scoring.pipeline import score_texts
    from rmfast.loading.loader import load

    big = load_spread(str(work / "rm-a"), dtype="float32", device_map="auto")
    assert big.source["device_map"] == "auto"
    small = load(str(work / "rm-a"), dtype="float32", device="cpu")
    with pytest.warns(UserWarning, match="plain Hugging Face"):  # the plan's engine rule for a spread model
        a = score_texts(big.model, big.tokenizer, PROMPTS["best"], TEXTS, device_map="auto", progress=False)
    b = score_texts(small.model, small.tokenizer, PROMPTS["best"], TEXTS, progress=False)
    assert a.manifest["engine"] == "hf"
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="embedded"):
        load_spread("smollm2-135m-instruct", device_map="auto")
    assert a.manifest["decisions"]["engine"]["reason"].startswith("--device-map")
    with pytest.raises(UserError, match="one device"):
        score_texts(big.model, big.tokenizer, PROMPTS["best"], TEXTS, device_map="auto", engine="fast", progress=False)


def test_a_ranks_shard_says_what_its_scores_are(tmp_path):
    """Issue 51 item 5: a rank's shard Parquet (kept until the output is written) carries the scan's provenance,
    score_meaning included, in its schema metadata, as the merged scan does."""
    from rmfast.io import read_provenance
    from rmfast.scoring.plan import score_meaning
    from rmfast.scoring.results import ScanResult

    man = {"model": {"name": "org/rm"}, "prompt": "Best?", "head": "score", "score_meaning": score_meaning("score")}
    res = ScanResult(np.arange(3), np.array([0.5, 2.0, 1.0], np.float32), list("abc"), list("abc"), man)
    out = tmp_path / "scan.parquet"
    merged = dist.gather_shards(dist.Dist(0, 1), out, res, np.arange(3))
    assert merged.manifest["score_meaning"] == score_meaning("score")
    assert read_provenance(dist.shard_path(out, 0, 1))["score_meaning"] == score_meaning("score")
