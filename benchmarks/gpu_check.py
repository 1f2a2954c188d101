#!/usr/bin/env python
"""`make gpu-check`: the GPU path proven in one call, on a CUDA machine with nothing but the repo.

    PYTHONPATH=src python3 benchmarks/gpu_check.py [--out DIR] [--export DIR] [--budget-s S] [--models a,b]
    PYTHONPATH=src python3 benchmarks/gpu_check.py --dry-run      # the same steps on the CPU, tiny (tests/test_gpu_check.py)

Needs PyTorch, Triton, transformers (with tokenizers), numpy and pytest; no package registry, no model
hub, no `pip install` (it runs from `src/`). Steps, each a subprocess with a time limit inside one
budget (default 540 s: 9 minutes), in this order:

1. **env**: versions, the GPU, its measured bf16 GEMM peak (8192^3 matmul) and copy bandwidth.
2. **tests**: `pytest tests/test_kernels.py tests/test_gpu.py` (and tests/test_cascade.py,
   test_elementwise_kernels.py where they exist): every Triton kernel in fp32, fp16 and bf16 against its torch reference; the engine against
   plain HF on the tiny model of every architecture on the GPU; CUDA out-of-memory back-off. On a GPU a
   skipped test counts as a failure.
3. **bench**: `rmfast bench --random-init NAME --device cuda --dtype bfloat16` for Llama-3.1-8B (with
   the full-vocabulary run) and Gemma-2-27B (where its bf16 weights leave 12 GiB free): rmfast vs the
   plain-HF baselines (naive, hf-cache) and the GEMM peak on the model's shapes, scores checked to agree.
   The baselines' batch options are planned for the card with the bench's own memory guard
   (:func:`plan_batches`), so no model is refused before timing.
4. **workloads** (8B, bf16): best-of-N (prompt 512 and 2,048 x N 16 and 64; 16 prompts x 4), one
   best-of-N call under torch.profiler (a table by kernel; the scan's batch too: its GEMM share by kernel beside
   rmfast.bench.layer_cost's prediction; both attention forms by row length; fused vs separate projections; the
   attention kernels' launch configurations on the scan's and a best-of-N wave's shapes, rmfast.bench.attention_tune),
   the states overhead with its folder in RAM first (`all`, /dev/shm, where it has room: the overhead where the
   disk keeps up), then in the temporary folder (`last_prenorm`, `all`, `all/sync`).
5. **bench** of Gemma-2-9B and Gemma-2-2B, as the budget allows.
   A step is skipped, and said so, when the budget left is below its estimate.
6. **collect**: everything under --out: `summary.md` (one screen, also printed: every step's status),
   `summary.json`, `tests.csv`, `bench.csv` (every bench row), `cost_model.csv` (per measurement: FLOPs
   per candidate, predicted time at the measured peak, measured time, fraction; the analytic GPU model
   beside it), `best_of_n.csv`, `states.csv`, `profile.txt`, `env.json`, `gpu-check.log`, the step
   folders, and `gpu-check.tar.gz` of all of it. `--export DIR` copies the top-level files there
   (:data:`EXPORT`, eight files: what the device tool brings back from $OUT).

`--dry-run`: CPU, float32, the same steps on tiny configs (`--random-init NAME --tiny --layers 2`, a
few dozen candidates; the workloads on `--tiny`, one best-of-N process) and a few CPU-capable tests of
the same files.

Exit code: 0 when every test passed and no model or workload that ran crashed or disagreed (a model
or workload skipped for memory or time, or cut at the budget, makes it "PASS (partial: ...)"); 1
otherwise; 2 without CUDA (outside --dry-run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tarfile
from pathlib import Path

from gpu_kit.config import (BEST_OF_N_RUNS, DEFAULT_OUT, DRY_MODELS, DRY_TESTS_K, EXPORT, GPU_PLAN, GPU_TESTS, REPO, SCRIPT,  # noqa: F401
                            SRC, STATES_RAM)
from gpu_kit.models import bench_cmd, bench_model, lowered_after_refusal, plan_batches  # noqa: F401 (the tests read them here)
from gpu_kit.probe import probe
from gpu_kit.profile import profile_best_of_n
from gpu_kit.steps import Clock, csv_rows, parse_junit, run_step, say, write_csv
from gpu_kit.summary import summarize, summarize_workloads
from gpu_kit.workloads import WORKLOAD_KINDS, ram_has_room, run_workloads  # noqa: F401


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, float32, tiny configs: the same steps in about a minute")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT.relative_to(REPO)})")
    ap.add_argument("--export", default=None, help="also copy the top-level result files here (e.g. $OUT on the device)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall-time budget of the whole check (default 540)")
    ap.add_argument("--models", default=None,
                    help="comma list of --random-init names: base architectures or aliases of `rmfast models`, e.g. "
                         "S-Lla-8B-v0.2,R-Gem-2B (default: the five bases of GPU_PLAN; dry run: two)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-workloads", action="store_true", help="skip best-of-N, the profile and the states workload")
    ap.add_argument("--workloads", default=None,
                    help=f"comma list of the workloads to run, of {','.join(WORKLOAD_KINDS)} (default: all)")
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # internal: step 1 in its own process
    ap.add_argument("--profile-best-of-n", default=None, help=argparse.SUPPRESS)  # internal: the profile step
    args = ap.parse_args(argv)
    if args.probe:
        probe(Path(args.probe), args.dry_run)
        return 0
    if args.profile_best_of_n:
        profile_best_of_n(Path(args.profile_best_of_n), args.dry_run)
        return 0

    only = None if args.workloads is None else [w.strip() for w in args.workloads.split(",") if w.strip()]
    if only is not None and (bad := sorted(set(only) - set(WORKLOAD_KINDS))):
        ap.error(f"--workloads: unknown {', '.join(bad)}; choose from {', '.join(WORKLOAD_KINDS)}")
    sys.path.insert(0, str(SRC))
    clock = Clock(args.budget_s)
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    dry = args.dry_run
    log = open(out / "gpu-check.log", "w")
    steps: list[dict] = []

    # 1. environment
    env_path = out / "env.json"
    steps.append(run_step("env", [sys.executable, str(SCRIPT), "--probe", str(env_path)]
                          + (["--dry-run"] if dry else []), out / "steps", min(120, clock.left()), log))
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    if not dry and not env.get("cuda_available"):
        say("no CUDA device here: run on a GPU machine, or pass --dry-run", log)
        (out / "summary.md").write_text("# gpu-check: no CUDA device (use --dry-run on a CPU)\n")
        return 2

    # 2. tests
    tests: dict = {"status": "skipped (--skip-tests)"}
    if not args.skip_tests:
        junit = out / "steps" / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", f"--junitxml={junit}",
               *[t for t in GPU_TESTS if (REPO / t).exists()]]
        if dry:
            cmd += ["-k", DRY_TESTS_K]
        elif importlib.util.find_spec("xdist") is not None:
            cmd += ["-n", "6"]  # Triton compiles on 6 CPU cores at once; tiny models, so the GPU is not the limit
        st = run_step("tests", cmd, out / "steps", min(300 if not dry else 120, clock.left()), log)
        steps.append(st)
        rows, counts = parse_junit(junit)
        write_csv(out / "tests.csv", rows, ["test", "outcome", "seconds", "message"])
        bad = [r for r in rows if r["outcome"] in ("failed", "error") or (r["outcome"] == "skipped" and not dry)]
        tests = {"status": st["status"], "counts": counts, "bad": bad}
        if not dry and counts["skipped"]:
            tests["note"] = "a skipped test on a GPU machine counts as a failure (what did it miss?)"
        tests["ok"] = st["rc"] == 0 and counts["passed"] > 0 and not bad
    if not (out / "tests.csv").exists():
        write_csv(out / "tests.csv", [], ["test", "outcome", "seconds", "message"])

    # 3. bench: the plan's first models; 4. the workloads; 5. the plan's late models, as the budget allows
    from rmfast.bench.random_init import label

    names = [s.strip() for s in (args.models or (DRY_MODELS if dry else ",".join(p["name"] for p in GPU_PLAN))).split(",") if s.strip()]
    plans = {p["name"]: p for p in GPU_PLAN}
    models: list[dict] = []
    ctx = {"out": out, "dry": dry, "env": env, "clock": clock, "log": log, "steps": steps}
    todo = [] if args.skip_bench else names
    for name in [n for n in todo if not plans.get(n, {}).get("late")]:
        models.append(bench_model(name, plans.get(name), ctx))
    workloads = [] if args.skip_workloads else run_workloads(ctx, only)
    for name in [n for n in todo if plans.get(n, {}).get("late")]:
        models.append(bench_model(name, plans.get(name), ctx))

    # 4. collect
    from rmfast.bench.flops import cost_rows
    from rmfast.bench.output import CSV_FIELDS
    from rmfast.bench.random_init import cost_model_config

    bench_rows, bench_meta = [], {}
    for m in models:
        j = out / "bench" / m["name"] / "bench_latest.json"
        if j.exists():
            meta = json.loads(j.read_text())
            bench_rows += meta["rows"]
            bench_meta[m["name"]] = {k: meta.get(k) for k in ("machine", "versions", "config", "total_s", "models")}
    write_csv(out / "bench.csv", bench_rows, CSV_FIELDS + ["whole_vocab_timed", "batch_probe", "mem_how"])
    cfgs = {m["label"]: cost_model_config(m["name"], layers=2 if dry else None, tiny=dry) for m in models}
    hbm = (env.get("copy") or {}).get("tb_s_read_plus_write")
    mem_gb = (env.get("gpu_mem_bytes") or 0) / 1e9 or None
    costs = cost_rows(bench_rows, cfgs, hbm_tb_s=hbm, gpu_name=env.get("gpu"), mem_gb=mem_gb)
    write_csv(out / "cost_model.csv", costs, list(costs[0]) if costs else ["model", "method"])
    ran = [m for m in models if m.get("rc") is not None]
    bon_rows = [dict(r, run=k) for k in BEST_OF_N_RUNS for r in csv_rows(out / "best_of_n" / k / "best_of_n_latest.csv")]
    write_csv(out / "best_of_n.csv", bon_rows, ["run"] + [f for f in (list(bon_rows[0]) if bon_rows else ["model"]) if f != "run"])
    states_rows = [dict(r, folder=where) for sub, where in (("states", "temp dir"), ("states_ram", STATES_RAM["dir"]))
                   for r in csv_rows(out / sub / "states_overhead_latest.csv")]
    write_csv(out / "states.csv", states_rows, list(states_rows[0]) if states_rows else ["model", "mode"])
    serve_rows = csv_rows(out / "serve" / "serve_latest.csv")  # in summary.json and .md (8 files come back)
    # A model or workload cut by the budget, skipped, or unverifiable makes the run partial; a crash, a failed
    # workload or a disagreement fails it.
    failed_wl = [w["step"] for w in workloads if w["rc"] not in (0, None)]
    ok = (bool(tests.get("ok", args.skip_tests)) and not any(m.get("failed") for m in models) and not failed_wl
          and (bool(ran) or args.skip_bench))
    left_out = [w["step"] for w in workloads if w["status"].endswith("not in --workloads")]  # by choice: not partial
    partial = ([m["name"] for m in models if m["status"] != "ok"]
               + [w["step"] for w in workloads if w["rc"] is None and w["step"] not in left_out]
               if ok else [])  # skipped, cut or unverified
    summary = {"ok": ok, "partial": partial, "left_out": left_out, "dry_run": dry, "env": env, "steps": steps, "tests": tests, "models": models,
               "workloads": workloads, "serve": serve_rows,
               "bench": bench_meta, "cost_model": costs, "total_s": round(clock.elapsed(), 1),
               "plan": GPU_PLAN if not dry else "dry run: " + " ".join(bench_cmd("NAME", Path("OUT"), True, {}, 8)[2:])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    text = summarize(out, env, steps, tests, models, bench_rows, costs, dry, ok, partial, clock, left_out)
    text += "\n\n" + summarize_workloads(out, workloads, bon_rows, states_rows, serve_rows)
    text += "\n\nsteps: " + "; ".join(f"{st['step']} {st['status']} ({st['wall_s']} s)" for st in steps)
    (out / "summary.md").write_text(text + "\n")
    log.close()
    with tarfile.open(out / "gpu-check.tar.gz", "w:gz") as tf:
        for p in sorted(out.rglob("*")):
            if p.is_file() and p.name != "gpu-check.tar.gz":
                tf.add(p, arcname=str(Path("gpu-check") / p.relative_to(out)))
    if args.export:
        exp = Path(args.export)
        exp.mkdir(parents=True, exist_ok=True)
        for f in EXPORT:
            shutil.copy2(out / f, exp / f)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
