"""Coverage of the similarity measures' bootstrap intervals (docs/representations.md, "Coverage, measured"):
how often each interval (median-recentred, BCa, percentile, basic) covers a known population CKA, per setting.
A statistics check, not a speed benchmark; rows carry the settings, the commit and the machine.

    python benchmarks/similarity_coverage.py --out benchmarks/results/similarity_coverage.csv
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import time

from rmfast.analysis.representations.similarity_replicates import coverage_simulation
from rmfast.cpu import cpu_info

#: (data sets, replicates, n, p, q, sigma^2): the docs' two settings, then a strong and a larger-n one, then n = d
#: (the report's maps: 4,096 candidates of 2,048-4,096 dimensions) and n = 5d (a referee's RV2 settings)
SETTINGS = [(200, 200, 40, 6, 4, 4.0), (100, 200, 40, 48, 48, 400.0), (200, 200, 40, 6, 4, 0.25),
            (200, 200, 100, 6, 4, 1.0), (100, 200, 100, 100, 100, 900.0), (100, 200, 240, 48, 48, 400.0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for R, B, n, p, q, s2 in SETTINGS:
        t0 = time.perf_counter()
        truth, cov = coverage_simulation(R=R, B=B, n=n, p=p, q=q, s2=s2)
        secs = time.perf_counter() - t0
        for measure, c in cov.items():
            rows.append({"data_sets": R, "replicates": B, "n": n, "p": p, "q": q, "sigma2": s2,
                         "truth": round(truth, 4), "measure": measure, "below": round(c["below"], 3),
                         **{f"cover_{k}": round(v, 3) for k, v in c.items() if k != "below"},
                         "seconds": round(secs, 1), "commit": commit, "cpu": cpu_info().model})
            print(rows[-1])
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
