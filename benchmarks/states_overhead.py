#!/usr/bin/env python
"""The extra time of ``--states last_prenorm`` and ``--states all`` over a plain scan (issue 24).

    PYTHONPATH=src python benchmarks/states_overhead.py --n 4096 --reps 5 --dtype bfloat16

A thin wrapper of :mod:`rmfast.bench.states_overhead` (what it measures, the columns) with this
script's options and defaults; the same run as ``rmfast bench --workload states`` (whose default
output folder is ``benchmarks/out`` and default device auto). One process, one model (the embedded
SmolLM2-135M-Instruct with a seeded random score head), the same ids; plain / last_prenorm / all interleaved
over ``--reps`` rounds after one untimed scan of each, each a full ``score_ids`` job through the
batching loop with a checkpoint, the states written to a fresh folder as ``rmfast scan --states``
does. Rows (per mode: the median scan time and its ratio to plain, layers, bytes per candidate, peak
memory) go to ``<out>/states_overhead_<timestamp>.csv`` and ``.json`` (and
``states_overhead_latest``) and a table to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("rmfast") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rmfast.bench.states_overhead import (StatesOverheadConfig, config_record, format_states_table,
                                          run_states_overhead, write_states_overhead)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="candidate ids per scan (default 4096)")
    ap.add_argument("--reps", type=int, default=5, help="rounds of plain + every mode; the median counts (default 5)")
    ap.add_argument("--modes", default="last_prenorm,all", help="the --states of each timed mode (default last_prenorm,all)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    cfg = StatesOverheadConfig(n=args.n, repeats=args.reps, modes=tuple(m for m in args.modes.split(",") if m),
                               dtype=args.dtype, device=args.device, threads=args.threads,
                               batch_size=args.batch_size if args.batch_size == "auto" else int(args.batch_size))
    rows = run_states_overhead(cfg)
    write_states_overhead(rows, args.out, {**config_record(cfg), "args": vars(args)}, device=args.device)
    print(format_states_table(rows))
    return 0 if all(r["scores_identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
