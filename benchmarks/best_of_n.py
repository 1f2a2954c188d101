#!/usr/bin/env python
"""Best-of-N scoring: rmfast's RewardScorer vs the way users do it today, side by side in one run.

    python benchmarks/best_of_n.py [--prompt-tokens 64 512 2048] [--n 4 16 64] [--prompts 1]
                                   [--min-len 20] [--max-len 200] [--hf-batch 16] [--dtype float32]
                                   [--threads N] [--out benchmarks/results]

A thin wrapper of :mod:`rmfast.bench.best_of_n` (what it measures, the columns) with this script's
options and defaults; the same run as ``rmfast bench --workload best-of-n`` (whose default output
folder is ``benchmarks/out``). Model: the embedded SmolLM2-135M-Instruct with a seeded random
one-output score head (``rmfast.load("smollm2-135m-instruct", random_head_seed=0)``). Rows go to
``<out>/best_of_n_<timestamp>.csv`` and ``.json`` (and ``best_of_n_latest``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("rmfast") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rmfast.bench.best_of_n import BestOfNConfig, config_record, run_best_of_n, write_best_of_n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 512, 2048])
    ap.add_argument("--n", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--prompts", type=int, default=1, help="conversations per configuration (default 1)")
    ap.add_argument("--min-len", type=int, default=20)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--hf-batch", type=int, nargs="+", default=list(BestOfNConfig.hf_batch),
                    help="rows per padded HF batch: each timed, the fastest counts (default 1 16 64)")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per method; the best counts (default 1)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    cfg = BestOfNConfig(prompt_tokens=tuple(args.prompt_tokens), n=tuple(args.n), prompts=args.prompts,
                        min_len=args.min_len, max_len=args.max_len, hf_batch=tuple(args.hf_batch), repeats=args.repeats,
                        dtype=args.dtype, device=args.device, threads=args.threads, seed=args.seed)
    rows = run_best_of_n(cfg)
    write_best_of_n(rows, args.out, {**config_record(cfg), "args": vars(args)}, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
