"""Results you can trust: the bf16 self-audit, results written as a pair, concurrent writers on one
store, checkpoints inside a part (kill -9, a full disk), and batches bounded by memory."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import rmfast
from rmfast.scoring import batching, pipeline
from rmfast import io
from rmfast.fast.engine import Engine
from rmfast.sweep.store import load_results
from cli_run import interrupt_scoring_at, kill_9_when, one_line_error, run

REPO = Path(__file__).resolve().parents[1]
PROMPT = "What, in one word, is the greatest thing ever?"




def sub_env():
    """A child process: one thread (so every run sums in the same order), this checkout's rmfast."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(Path(rmfast.__file__).parents[1]), str(REPO / "tests")]))


# A child that checkpoints after every batch and takes 50 ms more per batch (so that a kill lands
# inside its part; the numbers are untouched).
SLOW_EVERY_BATCH = (
    "import sys, time; import rmfast.scoring.pipeline as p; p.CHECKPOINT_EVERY_N = 1; p.CHECKPOINT_MIN_S = 0.0\n"
    "from rmfast.fast.engine import Engine\nreal = Engine.score\n"
    "def slow(self, r):\n    time.sleep(0.05)\n    return real(self, r)\n"
    "Engine.score = slow\nfrom rmfast.cli import main\nsys.exit(main(sys.argv[1:]))")
PLAIN = "import sys; from rmfast.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, smol_tokenizer):
    """Two tiny reward models saved as HF folders with the real SmolLM2 tokenizer."""
    import tiny_models as T

    d = tmp_path_factory.mktemp("trust-models")
    for name, arch, seed in (("rm-a", "llama", 0), ("rm-b", "qwen2", 1)):
        m = T.tiny(arch, "classifier", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id, seed=seed)
        m.save_pretrained(d / name)
        smol_tokenizer.save_pretrained(d / name)
    return d


def write_cfg(path: Path, model: Path, **over) -> Path:
    import yaml

    cfg = {"defaults": {"dtype": "float32", "device": "cpu", "compile": "off"},
           "models": [str(model)], "prompts": {"greatest": PROMPT},
           "candidates": {"vocab": {"vocabulary": {"token_ids": "0:200"}}}}
    cfg.update(over)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ------------------------------------------------------------------ 1. the bf16 self-audit


def test_bf16_scan_audits_itself(tiny_dir, tmp_path, capsys):
    """A bf16 scan rescores a seeded sample in fp32: the manifest holds the agreement, computed against
    a real fp32 scan of the same ids, and the scan prints one line about it."""
    from rmfast.scoring.audit import agreement, sample_rows, top_k_for
    from rmfast.loading.loader import load

    out = tmp_path / "bf16.parquet"
    rc, so, se = run(["scan", tiny_dir, "--dtype", "bfloat16", "--token-ids", "0:600", "--audit", "50",
                      "--compile", "off", "--out", out, "--no-progress", "--top", "0"], capsys)
    assert rc == 0, se
    lines = [ln for ln in so.splitlines() if "audit:" in ln]
    assert len(lines) == 1 and lines[0].startswith("bf16 audit: 50 ids rescored in fp32: Spearman "), so
    a = json.loads(Path(str(out) + ".json").read_text())["bf16_audit"]
    assert a["n"] == 50 and a["seed"] == 0 and a["top_k"] == top_k_for(50) and a["wall_s"] > 0  # 50 < 10% of 600
    # the same numbers from an fp32 scan of the sampled ids, done here independently (the same
    # weights: the bf16 ones, in fp32; the audit measures bf16 arithmetic, not the weights' rounding)
    df = pd.read_parquet(out)
    rows = sample_rows(len(df), 50, 0)
    lm = load(str(tiny_dir), dtype="bfloat16", device="cpu")
    lm.model.float()
    ref = pipeline.scan(lm.model, lm.tokenizer, PROMPT, token_ids=df["token_id"].to_numpy()[rows], compile="off",
                        progress=False).scores
    want = agreement(df["score"].to_numpy()[rows], ref, a["top_k"])
    assert a["max_abs_diff"] == pytest.approx(want["max_abs_diff"], abs=1e-6) and a["max_abs_diff"] > 0
    assert a["spearman"] == pytest.approx(want["spearman"], abs=1e-6)
    assert a["top_k_overlap"] == want["top_k_overlap"]
    # fp32 scans and --audit 0 have none
    for argv in (["--dtype", "float32"], ["--dtype", "bfloat16", "--audit", "0"]):
        o = tmp_path / f"x{len(argv)}{argv[-1]}.parquet"
        rc, so, se = run(["scan", tiny_dir, *argv, "--token-ids", "0:50", "--out", o, "--no-progress", "--top", "0"], capsys)
        assert rc == 0 and "audit:" not in so and "bf16_audit" not in json.loads(Path(str(o) + ".json").read_text())


def test_audit_leaves_the_model_alone_and_covers_texts(tiny_dir, monkeypatch):
    """run_scan audits text candidates too; the fp32 copy is a copy: the job's model stays bf16, its
    weights unchanged, and the copy is freed."""
    import gc
    import weakref

    from rmfast.scoring import audit
    from rmfast.loading.loader import load

    lm = load(str(tiny_dir), dtype="bfloat16", device="cpu")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    made = []
    real = audit.fp32_copy

    def spy(model):
        m32, where = real(model)
        made.append(weakref.ref(m32))
        return m32, where

    sel = pipeline.Selection(texts=["Love", "The universe", "Water", "music and art", "a cup of tea"])
    monkeypatch.setattr(audit, "fp32_copy", spy)
    res, _ = pipeline.run_scan(lm.model, lm.tokenizer, PROMPT, sel, progress=False, audit=4, compile="off")
    a = res.manifest["bf16_audit"]
    assert a["n"] == 4 and a["rows"] == "texts" and a["dtype"] == "bfloat16"
    gc.collect()
    assert made and made[0]() is None  # the fp32 copy is gone
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    for k, v in lm.model.state_dict().items():
        assert torch.equal(v, before[k]), k


# ------------------------------------------------------------------ 2. a Parquet and its manifest as a pair


def test_result_pair_never_mismatches(tmp_path, monkeypatch):
    """A writer killed between its two renames leaves no pair that lies: the reader sees the new rows
    with no manifest (unfinished), never the new rows with the old manifest."""
    from rmfast.scoring.results import ScanResult

    def res(v):
        return ScanResult(np.arange(3), np.full(3, v, np.float32), ["a", "b", "c"], ["a", "b", "c"], {"prompt": f"v{v}"})

    out = tmp_path / "r.parquet"
    res(1.0).to_parquet(out)
    assert ScanResult.from_parquet(out).manifest["prompt"] == "v1.0"
    real, calls = os.replace, []

    def dies_second(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the kill lands between the Parquet's rename and the manifest's
        return real(a, b)

    monkeypatch.setattr(io.os, "replace", dies_second)
    with pytest.raises(KeyboardInterrupt):
        res(2.0).to_parquet(out, overwrite=True)
    monkeypatch.setattr(io.os, "replace", real)
    got = ScanResult.from_parquet(out)
    assert got.scores[0] == 2.0 and got.manifest.get("prompt") != "v1.0"
    with pytest.raises(io.UserError, match="no manifest"):
        io.read_manifest(out)
    assert not list(tmp_path.glob("*.tmp"))
    # a manifest from another write is refused
    res(3.0).to_parquet(out, overwrite=True)
    m = json.loads(io.manifest_path(out).read_text())
    io.write_json(io.manifest_path(out), {**m, "write_id": "0" * 16})
    with pytest.raises(io.UserError, match="different writes"):
        ScanResult.from_parquet(out)


def test_disk_full_replaces_nothing(tmp_path, monkeypatch):
    """A full disk while writing the pair: the old Parquet and manifest stay, together."""
    import pyarrow.parquet as pq

    from rmfast.scoring.results import ScanResult

    out = tmp_path / "r.parquet"
    ScanResult(np.arange(2), np.ones(2, np.float32), ["a", "b"], ["a", "b"], {"prompt": "old"}).to_parquet(out)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(OSError):
        ScanResult(np.arange(2), np.zeros(2, np.float32), ["a", "b"], ["a", "b"], {"prompt": "new"}).to_parquet(out, overwrite=True)
    monkeypatch.undo()
    got = ScanResult.from_parquet(out)
    assert got.manifest["prompt"] == "old" and got.scores[0] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "r.parquet.json"]


# ------------------------------------------------------------------ 3. two writers on one store


@pytest.mark.slow
def test_two_sweeps_on_one_store_split_the_work(models_dir, tmp_path):
    """Two sweeps started together on one store: every part computed exactly once, in all, and both
    end with the whole store (the one that finds a part taken waits for it)."""
    cfg = write_cfg(tmp_path / "two.yaml", models_dir / "rm-a",
                    models=[str(models_dir / "rm-a"), str(models_dir / "rm-b")],
                    prompts={"greatest": PROMPT, "best": "What, in one word, is the best thing ever?",
                             "worst": "What, in one word, is the worst thing ever?"},
                    candidates={"a": {"vocabulary": {"token_ids": "0:300"}},
                                "b": {"vocabulary": {"token_ids": "300:600"}},
                                "c": {"vocabulary": {"token_ids": "600:900"}}})
    store = tmp_path / "shared"
    procs = [subprocess.Popen([sys.executable, "-c", PLAIN, "sweep", str(cfg), "--out", str(store), "--no-progress"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=sub_env(), text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
        assert "18/18 parts" in so and "complete" in so
    computed = [ln for _, se in outs for ln in se.splitlines() if " rows in " in ln]
    assert len(computed) == 18, "\n".join(computed)
    assert len({ln.split("] ", 2)[-1].split(":")[0] for ln in computed}) == 18  # no part twice
    df = load_results(store)
    assert len(df) == 18 * 300 and not df.duplicated(["model", "prompt", "candidates", "token_id"]).any()
    assert not list(store.rglob("*.tmp")) and not list(store.rglob("*.partial.npz"))


def test_part_lock_keeps_other_writers_out(tmp_path):
    """claim: one holder at a time; a starting writer's temp cleanup runs only under the part's lock,
    so it never deletes a file another writer is writing."""
    from filelock import FileLock

    from rmfast.sweep.store import PartRef, Store

    st = Store(tmp_path / "s")
    part = PartRef("m", "m", "p", "p", "P?", "c", "c", key="k")
    (st.root / part.relpath).mkdir(parents=True)
    with FileLock(str(st.root / part.relpath / ".part.lock")):  # another writer holds it
        with st.claim(part) as held:
            assert not held
    with st.claim(part) as held:
        assert held


# ------------------------------------------------------------------ 4. checkpoints inside a part


@pytest.mark.slow
def test_sweep_killed_inside_a_part_resumes_bit_identical(models_dir, tmp_path):
    """kill -9 a sweep inside its only part (after a checkpoint): the rerun scores only what is left,
    and the store ends bit-identical to an uninterrupted sweep (one thread everywhere, same batches)."""
    cfg = write_cfg(tmp_path / "one.yaml", models_dir / "rm-a",
                    defaults={"dtype": "float32", "device": "cpu", "compile": "off", "batch_size": 64},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:3000"}}})
    store = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EVERY_BATCH, "sweep", str(cfg), "--out", str(store), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=sub_env(), start_new_session=True)
    def ready():  # a checkpoint holding at least 256 scored rows
        cks = list(store.glob("parts/*/*/*/part.partial.npz"))
        try:
            return bool(cks) and int((~np.isnan(np.load(cks[0])["scores"])).sum()) >= 256
        except Exception:
            return False

    kill_9_when(proc, ready, 300, poll=0.05)
    assert not list(store.glob("parts/*/*/*/part.parquet.json")) and list(store.glob("parts/*/*/*/part.partial.npz"))
    for out in (store, tmp_path / "clean"):
        r = subprocess.run([sys.executable, "-c", PLAIN, "sweep", str(cfg), "--out", str(out), "--no-progress"],
                           capture_output=True, text=True, env=sub_env(), timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    man = json.loads(next(store.glob("parts/*/*/*/part.parquet.json")).read_text())["scan"]
    assert man["resumed_candidates"] >= 256 and man["scored_candidates"] == 3000 - man["resumed_candidates"]
    a, b = load_results(store), load_results(tmp_path / "clean")
    assert len(a) == 3000
    np.testing.assert_array_equal(a["token_id"].to_numpy(), b["token_id"].to_numpy())
    np.testing.assert_array_equal(a["score"].to_numpy(), b["score"].to_numpy())


def test_sweep_disk_full_keeps_the_checkpoint(models_dir, tmp_path, monkeypatch, capsys):
    """Writing a part fails (ENOSPC): one line, exit 2, the part's checkpoint stays; the rerun after
    the disk is freed writes it without scoring again."""
    import pyarrow.parquet as pq

    cfg = write_cfg(tmp_path / "full.yaml", models_dir / "rm-a")
    store = tmp_path / "full"
    real = pq.write_table

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    rc, _, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert one_line_error(rc, se) and "No space left" in se and "rerun" in se, se
    assert list(store.glob("parts/*/*/*/part.partial.npz")) and not list(store.rglob("part.parquet*"))
    monkeypatch.setattr(pq, "write_table", real)
    monkeypatch.setattr(Engine, "score", lambda self, r: pytest.fail("rescored after a failed write"))
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    man = json.loads(next(store.glob("parts/*/*/*/part.parquet.json")).read_text())["scan"]
    assert man["resumed_candidates"] == 200 and man["scored_candidates"] == 0
    assert not list(store.glob("parts/*/*/*/part.partial.npz"))


# ------------------------------------------------------------------ 5. two scans to one --out


def test_second_scan_refuses_before_scoring(tiny_dir, tmp_path, monkeypatch, capsys):
    """Another job on the same --out finishes just as this one takes the lock (after this one's
    checks): this job refuses holding the lock, before scoring anything."""
    import contextlib

    from rmfast.cli import scan as scan_cli

    out = tmp_path / "both.parquet"
    real = scan_cli.output_lock

    @contextlib.contextmanager
    def other_job_just_finished(path):
        out.write_bytes(b"the other job's output")
        with real(path):
            yield

    monkeypatch.setattr(scan_cli, "output_lock", other_job_just_finished)
    monkeypatch.setattr(Engine, "score", lambda self, r: pytest.fail("scored before refusing"))
    rc, _, se = run(["scan", tiny_dir, "--token-ids", "0:10", "--out", out, "--no-progress"], capsys)
    assert one_line_error(rc, se) and "already exists" in se
    assert out.read_bytes() == b"the other job's output"


# ------------------------------------------------------------------ 6. batches bounded by memory


def test_row_bytes_and_memory_cap_planted():
    """The estimate from the model's shapes, and the cap from a planted amount of free memory."""
    from types import SimpleNamespace as NS

    cfg = NS(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
             num_hidden_layers=30, vocab_size=49152)
    m = NS(config=cfg, parameters=lambda: iter([torch.zeros(1, dtype=torch.bfloat16)]))
    T, P, D = 5, 40, 64
    act = T * (4 * 576 + (9 + 2 * 3) * D + 3 * 1536) * 2
    att = 2 * 9 * T * (P + T) * 4
    assert batching.row_bytes(m, T, prefix_len=P) == act + att
    assert batching.row_bytes(m, T, prefix_len=P, head="logprob") == act + att + 2 * T * 8192 * 4
    full = batching.row_bytes(m, T, prefix_len=P, full_sequence=True)
    L = T + P
    assert full == L * (4 * 576 + (9 + 2 * 3) * D + 3 * 1536) * 2 + 2 * 9 * L * L * 4 + 30 * L * 2 * 3 * D * 2
    cpu = torch.device("cpu")
    per = batching.row_bytes(m, T, prefix_len=P)
    assert batching.memory_cap(cpu, per, available=100 * per) == 50  # half of the free memory
    assert batching.auto_batch_size(cpu, T, per, available=100 * per) == 50
    assert batching.auto_batch_size(cpu, T, per, available=10**15) == batching.auto_batch_size(cpu, T)
    with pytest.warns(UserWarning, match="batch_size 500 needs .* using 50"):
        assert batching.cap_batch_size(500, cpu, per, available=100 * per) == 50
    assert batching.cap_batch_size(20, cpu, per, available=100 * per) == 20


def test_scan_batches_fit_planted_memory(tiny_dir, monkeypatch):
    """With little free memory (planted), auto and explicit batch sizes shrink to fit, and a resumed
    scan keeps the batches it started with, whatever memory says then."""
    from rmfast.loading.loader import load

    lm = load(str(tiny_dir), dtype="float32", device="cpu")
    free = {"b": 10**12}
    monkeypatch.setattr(batching, "available_memory", lambda device: free["b"])
    kw = dict(token_ids="0:400", compile="off", progress=False)
    big = pipeline.scan(lm.model, lm.tokenizer, PROMPT, **kw).manifest["batch_size"]
    tpr = pipeline.scan(lm.model, lm.tokenizer, PROMPT, token_ids="0:2", compile="off", progress=False).manifest["tokens_per_row"]
    tmpl_p = len(pipeline.build_template(lm.tokenizer, PROMPT).prefix_ids)
    per = batching.row_bytes(lm.model, tpr, prefix_len=tmpl_p)
    free["b"] = 2 * 37 * per  # room for 37 rows
    small = pipeline.scan(lm.model, lm.tokenizer, PROMPT, **kw).manifest["batch_size"]
    assert big > 37 and small <= 37
    with pytest.warns(UserWarning, match="batch_size 300 needs"):
        assert pipeline.scan(lm.model, lm.tokenizer, PROMPT, batch_size=300, **kw).manifest["batch_size"] == 37
    # interrupted with little memory, resumed with plenty: the checkpoint's batches, bit-identical
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    ck = Path(str(tiny_dir)).parent / f"mem-{os.getpid()}.partial.npz"
    restore = interrupt_scoring_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        pipeline.scan(lm.model, lm.tokenizer, PROMPT, checkpoint=ck, **kw)
    restore()
    free["b"] = 10**12
    resumed = pipeline.scan(lm.model, lm.tokenizer, PROMPT, checkpoint=ck, **kw)
    assert resumed.manifest["batch_size"] == small and resumed.manifest["resumed_candidates"] == 2 * small
    free["b"] = 2 * 37 * per
    whole = pipeline.scan(lm.model, lm.tokenizer, PROMPT, **kw)
    np.testing.assert_array_equal(resumed.scores, whole.scores)
    assert not ck.exists()


def test_a_logprob_scan_without_an_end_of_turn_says_none_is_scored(smol_tokenizer):
    """A causal LM under a plain template ('User: {prompt}\\nAssistant: {response}'): nothing follows the response,
    so the score is log p(response | prompt) alone (the scan says "no end-of-turn to score"), but score_meaning
    said "+ log p(end of turn | prompt, response)" in the manifest and the Parquet (a walkthrough)."""
    import tiny_models as T
    from rmfast.scoring.plan import score_meaning

    m = T.tiny("llama", "causal_lm", pad_token_id=smol_tokenizer.pad_token_id, seed=2)
    plain = pipeline.scan(m, smol_tokenizer, PROMPT, token_ids="0:3", head="logprob", compile="off", progress=False,
                          template="User: {prompt}\nAssistant: {response}").manifest
    assert plain["tokens_per_row"] == 0 and plain["score_meaning"] == score_meaning("logprob", end_of_turn=False)
    assert "none is scored" in plain["score_meaning"] and "end of turn |" not in plain["score_meaning"]
    chat = pipeline.scan(m, smol_tokenizer, PROMPT, token_ids="0:3", head="logprob", compile="off",
                         progress=False).manifest
    assert chat["score_meaning"] == score_meaning("logprob") and "log p(end of turn | prompt, response)" in chat["score_meaning"]
