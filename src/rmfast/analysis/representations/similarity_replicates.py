"""In-memory bootstrap replicates of the similarity measures, by the same code as :func:`.similarity.similarity`'s
replicates (copies of a candidate left out as :func:`.similarity._finish` says): for tests and the coverage
simulation (docs/representations.md)."""

from __future__ import annotations

import numpy as np

from . import similarity as sim
from .similarity_guards import MEASURES


class _Arrays:
    """Two in-memory arrays as the states sets :func:`_variant_values` reads (one layer each: "x", "y")."""

    def __init__(self, Z: np.ndarray, layer: str):
        self.Z, self.layer, self.hidden_size = Z, layer, Z.shape[1]

    def take(self, layer: str, rows: np.ndarray) -> np.ndarray:
        return self.Z[rows]


def bootstrap_measures(X, Y, bootstrap: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """The measures of ``bootstrap`` resamples of the rows of two in-memory arrays, by the same code as
    :func:`similarity`'s replicates (copies of a candidate left out as :func:`_finish` says); returns
    {"obs": {measure: float}, measure: (bootstrap,) replicates}. For tests and coverage simulations.

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
    variants = ["obs"] + [("boot", i) for i in range(bootstrap)]
    vals = sim._variant_values(_Arrays(X, "x"), _Arrays(Y, "y"), rows, rows, ["x"], ["y"], variants, seed=seed,
                           chunk_rows=max(n, 1), shifts=shifts)
    out = {"obs": vals["obs"][("x", "y")]}
    for m in MEASURES:
        out[m] = np.array([vals[("boot", i)][("x", "y")][m] for i in range(bootstrap)])
    return out


__all__ = ["bootstrap_measures"]
