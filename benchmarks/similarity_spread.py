#!/usr/bin/env python
"""Is the similarity bootstrap's spread the estimator's own sampling spread? A known-truth simulation of debiased CKA.

X ~ N(0, I_p), Y = X W + sigma E (W fixed per setting; population CKA = ||W||_F^2 / (sqrt(p) ||W'W + sigma^2 I||_F));
``--datasets`` independent data sets per setting. For each: debiased CKA's estimate and the standard deviation of
its 200 bootstrap replicates (the tool's own resampling, copy pairs left out:
:func:`rmfast.analysis.representations.similarity_replicates.bootstrap_measures`), and whether the 95 % median-recentred
interval covers the truth. The ratio mean(bootstrap SD) / SD(estimates over the data sets) should be ~1; above 1 the
intervals are too wide (conservative). Writes a CSV row per setting.

    PYTHONPATH=src python benchmarks/similarity_spread.py --out benchmarks/results/similarity_spread.csv
"""

from __future__ import annotations

import argparse
import csv
import platform

import numpy as np

SETTINGS = [(40, 6, 4, 4.0), (40, 48, 48, 400.0), (200, 48, 48, 400.0), (200, 48, 48, 48.0), (200, 48, 48, 1e6),
            (1000, 48, 48, 400.0)]  # (n candidates, p, q, sigma^2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=int, default=60)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from rmfast.analysis.representations.similarity_bootstrap import bootstrap_interval
    from rmfast.analysis.representations.similarity_replicates import bootstrap_measures

    rows = []
    for n, p, q, s2 in SETTINGS:
        rng = np.random.default_rng(123)
        W = rng.normal(size=(p, q))
        syy = W.T @ W + s2 * np.eye(q)
        truth = float((W * W).sum() / np.sqrt(p * (syy * syy).sum()))
        est, sd, cover = [], [], []
        for r in range(a.datasets):
            X = rng.normal(size=(n, p))
            Y = X @ W + np.sqrt(s2) * rng.normal(size=(n, q))
            b = bootstrap_measures(X, Y, a.bootstrap, seed=1000 + r)
            o = b["obs"]["cka_debiased"]
            est.append(o)
            sd.append(np.std(b["cka_debiased"], ddof=1))
            lo, hi = bootstrap_interval(o, b["cka_debiased"], 0.95, "recentred")
            cover.append(lo <= truth <= hi)
        true_sd = float(np.std(est, ddof=1))
        row = {"n": n, "p": p, "q": q, "sigma2": s2, "datasets": a.datasets, "bootstrap": a.bootstrap,
               "truth": round(truth, 4), "mean_estimate": round(float(np.mean(est)), 4), "true_sd": round(true_sd, 5),
               "mean_bootstrap_sd": round(float(np.mean(sd)), 5), "ratio": round(float(np.mean(sd)) / true_sd, 3),
               "coverage_95_recentred": round(float(np.mean(cover)), 3), "cpu": platform.processor() or platform.machine()}
        print(row, flush=True)
        rows.append(row)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
