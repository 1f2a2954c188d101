"""Subsampling curve: plain RV/CKA vs RV2 and debiased CKA as the number of items n shrinks.

Synthetic random features (no model needed). A population of N items, two representations of
width d each:

- ``null``:    X and Y independent standard normal: every measure's truth is 0.
- ``related``: Y = X W + noise (W random d × d, noise sd 2): a fixed, moderate relation.

For each n, ``--reps`` random subsets of n items; the mean and sd of each measure go to a CSV
(one row per scenario × n). Usage::

    python benchmarks/similarity_subsampling.py --out benchmarks/results/similarity_subsampling.csv
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from rmfast.analysis.representations.similarity import MEASURES, measures


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=256, help="width of each representation (default 256)")
    ap.add_argument("--population", type=int, default=8192, help="items in the population (default 8192)")
    ap.add_argument("--ns", default="8,16,32,64,128,256,512,1024,4096,8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    N, d = args.population, args.d
    X = rng.normal(size=(N, d))  # (N, d)
    scen = {"null": rng.normal(size=(N, d)),  # (N, d) independent of X
            "related": X @ rng.normal(size=(d, d)) / np.sqrt(d) + 2.0 * rng.normal(size=(N, d))}
    rows = []
    t0 = time.perf_counter()
    for name, Y in scen.items():
        for n in (int(v) for v in args.ns.split(",")):
            reps = 1 if n == N else args.reps
            vals = []
            for _ in range(reps):
                idx = rng.choice(N, size=n, replace=False)
                m = measures(X[idx], Y[idx])
                vals.append([getattr(m, k) for k in MEASURES] + [m.rv_null_mean])
            v = np.array(vals)  # (reps, 5)
            row = {"scenario": name, "n": n, "d": d, "n_over_d": n / d, "reps": reps}
            for j, k in enumerate(list(MEASURES) + ["rv_null_mean"]):
                row[f"{k}_mean"] = float(v[:, j].mean())
                row[f"{k}_sd"] = float(v[:, j].std(ddof=1)) if reps > 1 else 0.0
            rows.append(row)
            print(f"{name} n={n}: cka {row['cka_mean']:.3f} rv2 {row['rv2_mean']:.3f} "
                  f"dcka {row['cka_debiased_mean']:.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {out} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
