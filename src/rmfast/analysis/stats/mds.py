"""Metric multidimensional scaling of a precomputed dissimilarity matrix (numpy only).

Classical (Torgerson) scaling gives the start; SMACOF (Guttman transform) iterations
then minimise raw stress Σ_{i<j} (d_ij − δ_ij)². The result is centred, rotated to its
principal axes and sign-fixed, so the same input always gives the same picture.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import UserError


@dataclass
class MDSResult:
    """coords: (n, k) positions; stress1: Kruskal's stress-1, sqrt(Σ (d_ij − δ_ij)² / Σ d_ij²) with d the fitted
    distances (0 = perfect fit; Kruskal read 0.2 as poor; it had been divided by Σ δ², the dissimilarities': 0.256
    where Kruskal's is 0.265 on EloEverything)."""

    coords: np.ndarray
    stress1: float
    iterations: int


def _dist(x: np.ndarray) -> np.ndarray:
    diff = x[:, None, :] - x[None, :, :]
    return np.sqrt((diff**2).sum(-1))


def classical_mds(delta: np.ndarray, k: int = 2) -> np.ndarray:
    """Torgerson scaling: top-k eigenvectors of the double-centred squared dissimilarities."""
    n = len(delta)
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ (delta**2) @ j
    vals, vecs = np.linalg.eigh(b)
    idx = np.argsort(vals)[::-1][:k]
    return vecs[:, idx] * np.sqrt(np.clip(vals[idx], 0, None))


def mds(delta, k: int = 2, max_iter: int = 1000, eps: float = 1e-10) -> MDSResult:
    """Metric MDS of a symmetric dissimilarity matrix.

    >>> pts = np.array([[0, 0], [3, 0], [0, 4]], dtype=float)
    >>> r = mds(_dist(pts))
    >>> round(r.stress1, 6), np.allclose(_dist(r.coords), _dist(pts))
    (0.0, True)
    """
    delta = np.asarray(delta, dtype="float64")
    if delta.ndim != 2 or delta.shape[0] != delta.shape[1]:
        raise UserError("MDS needs a square dissimilarity matrix")
    if not np.allclose(delta, delta.T, atol=1e-9) or np.isnan(delta).any():
        raise UserError("MDS needs a symmetric dissimilarity matrix without missing values")
    n = len(delta)
    if n < 3:
        raise UserError(f"MDS needs at least 3 models, got {n}")
    delta = delta.copy()
    np.fill_diagonal(delta, 0.0)
    x = classical_mds(delta, k)
    norm = float((np.triu(delta, 1) ** 2).sum()) or 1.0
    stress = float((np.triu(_dist(x) - delta, 1) ** 2).sum())
    it = 0
    for it in range(1, max_iter + 1):
        d = _dist(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(d > 0, delta / d, 0.0)
        bmat = -ratio
        np.fill_diagonal(bmat, 0.0)
        np.fill_diagonal(bmat, -bmat.sum(1))
        x_new = bmat @ x / n
        new_stress = float((np.triu(_dist(x_new) - delta, 1) ** 2).sum())
        x = x_new
        if stress - new_stress <= eps * max(stress, 1e-300):
            stress = new_stress
            break
        stress = new_stress
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x @ vt.T
    for c in range(x.shape[1]):
        j = int(np.argmax(np.abs(x[:, c])))
        if x[j, c] < 0:
            x[:, c] = -x[:, c]
    fitted = float((np.triu(_dist(x), 1) ** 2).sum()) or norm  # Kruskal's denominator: the fitted distances'
    return MDSResult(coords=x, stress1=float(np.sqrt(stress / fitted)), iterations=it)
