"""In-memory bootstrap replicates of the similarity measures, by the same code as :func:`.similarity.similarity`'s
replicates (copies of a candidate left out as :func:`.similarity._finish` says): for tests and the coverage
simulation (docs/representations.md)."""

from __future__ import annotations

import numpy as np

from . import similarity as sim
from .similarity_bootstrap import INTERVALS, bootstrap_interval, jackknife_count
from .similarity_guards import MEASURES


class _Arrays:
    """Two in-memory arrays as the states sets :func:`_variant_values` reads (one layer each: "x", "y")."""

    def __init__(self, Z: np.ndarray, layer: str):
        self.Z, self.layer, self.hidden_size = Z, layer, Z.shape[1]

    def take(self, layer: str, rows: np.ndarray) -> np.ndarray:
        return self.Z[rows]


def bootstrap_measures(X, Y, bootstrap: int, *, seed: int = 0, jackknife: bool = False) -> dict[str, np.ndarray]:
    """The measures of ``bootstrap`` resamples of the rows of two in-memory arrays, by the same code as
    :func:`similarity`'s replicates (copies of a candidate left out as :func:`_finish` says); returns
    {"obs": {measure: float}, measure: (bootstrap,) replicates} and, with ``jackknife``, "jack": {measure: (G,) the
    estimate without each block of :func:`.similarity_bootstrap.jackknife_blocks`} (G = :func:`.similarity_bootstrap.jackknife_count`). For tests
    and coverage simulations.

    >>> rng = np.random.default_rng(0); X = rng.normal(size=(30, 3)); Y = X @ rng.normal(size=(3, 2))
    >>> b = bootstrap_measures(X, Y, 5)
    >>> b["cka"].shape, abs(b["obs"]["cka"] - sim.measures(X, Y).cka) < 1e-12
    ((5,), True)
    """
    X = np.asarray(X, dtype=np.float64)  # (n, p)
    Y = np.asarray(Y, dtype=np.float64)  # (n, q)
    n = len(X)
    sim._check_n(n)
    rows = np.arange(n)
    shifts = ({"x": X[:sim.SHIFT_ROWS].mean(0)}, {"y": Y[:sim.SHIFT_ROWS].mean(0)})
    blocks = jackknife_count(n) if jackknife else 0
    variants = ["obs"] + [("boot", i) for i in range(bootstrap)] + [("jack", g) for g in range(blocks)]
    vals = sim._variant_values(_Arrays(X, "x"), _Arrays(Y, "y"), rows, rows, ["x"], ["y"], variants, seed=seed,
                           chunk_rows=max(n, 1), shifts=shifts)
    out = {"obs": vals["obs"][("x", "y")]}
    for m in MEASURES:
        out[m] = np.array([vals[("boot", i)][("x", "y")][m] for i in range(bootstrap)])
    if jackknife:
        out["jack"] = {m: np.array([vals[("jack", g)][("x", "y")][m] for g in range(blocks)]) for m in MEASURES}
    return out


def coverage_simulation(R: int = 40, B: int = 100, n: int = 40, p: int = 6, q: int = 4, s2: float = 4.0,
                        seed: int = 0, level: float = 0.95) -> tuple[float, dict]:
    """How often each interval covers a known population value: R data sets of n rows from X ~ N(0, I_p),
    Y = XW + sqrt(s2)·E (W fixed by ``seed``), population CKA = ‖W‖²_F / (√p ‖W'W + s2·I‖_F), the value debiased
    CKA estimates without bias; B replicates (and the jackknife) per data set. Returns (truth, {measure:
    {"below": mean share of replicates below the estimate, interval: coverage}}) for CKA, debiased CKA and RV2
    (docs/representations.md's table: ``benchmarks/similarity_coverage.py``; RV2's population value is the same
    ratio: the RV coefficient of the population covariances).

    >>> truth, cov = coverage_simulation(R=2, B=20)
    >>> round(truth, 3), sorted(cov["cka"])
    (0.402, ['basic', 'bca', 'below', 'percentile', 'recentred'])
    >>> sorted(cov)
    ['cka', 'cka_debiased', 'rv2']
    """
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(p, q))  # (p, q)
    Syy = W.T @ W + s2 * np.eye(q)  # (q, q)
    truth = float((W * W).sum() / np.sqrt(p * (Syy * Syy).sum()))
    hits: dict = {m: {k: [] for k in ("below", *INTERVALS)} for m in ("cka", "cka_debiased", "rv2")}
    for r in range(R):
        X = rng.normal(size=(n, p))  # (n, p)
        Y = X @ W + np.sqrt(s2) * rng.normal(size=(n, q))  # (n, q)
        b = bootstrap_measures(X, Y, B, seed=r, jackknife=True)
        for m, d in hits.items():
            obs, boot = b["obs"][m], b[m]
            d["below"].append(np.mean(boot < obs))
            for k in INTERVALS:
                lo, hi = bootstrap_interval(obs, boot, level, k, b["jack"][m])
                d[k].append(lo <= truth <= hi)
    return truth, {m: {k: float(np.mean(v)) for k, v in d.items()} for m, d in hits.items()}


__all__ = ["bootstrap_measures", "coverage_simulation"]
