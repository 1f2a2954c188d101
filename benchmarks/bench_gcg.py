#!/usr/bin/env python
"""Seconds per GCG step: rmfast (candidates through the shared-prompt engine) vs the same algorithm
evaluating candidates as full sequences through ``model(...)`` (nanoGCG without its prefix cache).

    python benchmarks/bench_gcg.py [--heads score logprob] [--steps 5] [--search-width 128] [--length 20]
                                   [--topk 256] [--dtype bfloat16] [--device auto] [--threads N] [--out benchmarks/out]

Same run for both: the embedded SmolLM2-135M-Instruct, the same prompt, seed, gradient, sampling and
filter; only the evaluator differs (``GCGConfig.evaluator`` "engine" — eager, and with the compiled CPU
layer, ``compile="on"`` — vs "full"). The compiled variant's one-off compile falls in its first
timed step; the median step excludes it. The score head is
SmolLM2 loaded as a classifier with a random head (``random_head_seed=0``); the logprob head is the
causal LM itself. Each configuration first runs one untimed warm-up step. Rows (machine, versions,
config, timestamp, per-step times and their split) go to ``<out>/gcg_<timestamp>.csv`` and ``.json``.
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import sys
import time
from pathlib import Path

try:
    import rmfast  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from rmfast.gcg import GCGConfig, run
from rmfast.io import write_json
from rmfast.loading.loader import load
from rmfast.cpu import versions as _versions

PROMPT = "What, in one word, is the best thing ever?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_gcg.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model spec (default: the embedded SmolLM2)")
    ap.add_argument("--heads", nargs="+", default=["score", "logprob"], choices=["score", "logprob"], help="default: both")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per evaluator (default 5)")
    ap.add_argument("--search-width", type=int, default=128, help="candidates per step (default 128)")
    ap.add_argument("--length", type=int, default=20, help="response tokens (default 20)")
    ap.add_argument("--topk", type=int, default=256, help="default 256")
    ap.add_argument("--seed", type=int, default=0, help="default 0")
    ap.add_argument("--minimize", action="store_true", help="minimize (default: maximize)")
    ap.add_argument("--dtype", default="bfloat16", help="default bfloat16")
    ap.add_argument("--device", default="auto", help="default auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"), help="output folder (default benchmarks/out)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    versions = _versions()
    machine = {"node": platform.node(), "processor": platform.processor() or platform.machine(),
               "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    rows = []
    for head in args.heads:
        lm = load(args.model, dtype=args.dtype, device=args.device, random_head_seed=0 if head == "score" else None)
        res = {}
        variants = [("engine", "engine", "off"), ("full", "full", "off")]
        if torch.device(args.device if args.device != "auto" else "cpu").type == "cpu" and not torch.cuda.is_available():
            variants.insert(1, ("engine+compile", "engine", "on"))
        for label, evaluator, comp in variants:
            base = dict(length=args.length, search_width=args.search_width, topk=args.topk, seed=args.seed,
                        maximize=not args.minimize, head=head, evaluator=evaluator, patience=10**6, compile=comp)
            run(lm.model, lm.tokenizer, PROMPT, GCGConfig(**base, steps=1), progress=False)  # warm-up
            cfg = GCGConfig(**base, steps=args.steps)
            r = run(lm.model, lm.tokenizer, PROMPT, cfg, progress=False, model_info=lm.source)
            res[label] = r
            t = r.timing
            steps = t["steps"]
            row = {
                "timestamp": stamp,
                "model": lm.source.get("name") or args.model,
                "head": head,
                "evaluator": label,
                "method": {"engine": "rmfast (shared-prompt engine, eager)",
                           "engine+compile": "rmfast (shared-prompt engine, compiled CPU layer)"}.get(label, "full sequences via model(...)"),
                "dtype": r.manifest["dtype"],
                "device": r.manifest["device"],
                "threads": torch.get_num_threads(),
                "length": args.length,
                "search_width": args.search_width,
                "topk": args.topk,
                "steps": steps,
                "eval_batch_size": r.manifest["eval_batch_size"],
                "n_evaluated": r.n_evaluated,
                "s_per_step_mean": round(statistics.mean(t["step_s"]), 4),
                "s_per_step_median": round(statistics.median(t["step_s"]), 4),
                "gradient_s_per_step": round(t["gradient_s"] / steps, 4),
                "filter_s_per_step": round(t["sample_filter_s"] / steps, 4),
                "evaluate_s_per_step": round((t["evaluate_s"]) / steps, 4),
                "evaluated_per_s": t["evaluated_per_s"],
                "prompt_encode_s": t["prompt_encode_s"],
                "best_score": round(r.best_score, 5),
                "best_score_reference": round(r.best_score_reference, 5),
            }
            rows.append(row)
            print(f"{head:8s} {label:14s} {row['s_per_step_median']:8.3f} s/step (median; mean {row['s_per_step_mean']:.3f}) "
                  f"grad {row['gradient_s_per_step']:.3f}  filter {row['filter_s_per_step']:.3f}  "
                  f"eval {row['evaluate_s_per_step']:.3f}  ({row['evaluated_per_s']} cand/s)  best {row['best_score']}", flush=True)
        mine = {r["evaluator"]: r for r in rows if r["head"] == head}
        f = mine["full"]
        for lab, e in mine.items():
            e["speedup_vs_full"] = round(f["s_per_step_median"] / e["s_per_step_median"], 2)
            e["eval_speedup_vs_full"] = round(f["evaluate_s_per_step"] / e["evaluate_s_per_step"], 2)
            e["same_trajectory_as_full"] = res[lab].restarts[0]["trajectory"] == res["full"].restarts[0]["trajectory"]
            if lab != "full":
                print(f"{head:8s} {lab}: speedup per step {e['speedup_vs_full']}x, evaluation {e['eval_speedup_vs_full']}x; "
                      f"identical trajectory to full: {e['same_trajectory_as_full']}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"gcg_{stamp}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    write_json(out / f"gcg_{stamp}.json", {"machine": machine, "versions": versions, "config": vars(args),
                                           "prompt": PROMPT, "timestamp": stamp, "rows": rows})
    print(f"wrote {out / f'gcg_{stamp}.csv'} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
