"""Representational similarity analysis of model agreement against model metadata.

The observed matrix is the models' pairwise agreement (Kendall tau-b). Each metadata
"model" is a similarity matrix over the same models (the papers' Figure 2C):

    same_base_family   1 if the base family matches (Gemma vs Llama), else 0
    same_base          1 if the base model incl. version matches ("Llama 3.1"), else 0
    same_developer     1 if the developer matches, else 0
    params_similarity  1 / (1 + |Δ parameters in billions|)
    rank_similarity    1 / (1 + |Δ leaderboard rank|)

The RSA statistic is the Spearman correlation of the two matrices' upper triangles; the
p-value permutes the model labels of the metadata matrix (rows and columns together,
a Mantel test): p = (1 + #{r_perm ≥ r_obs}) / (1 + n_perm) for "greater".
"""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import pandas as pd

from ...errors import UserError
from .permutation import N_PERM, check_n_perm

PREDICTORS = ["same_base_family", "same_base", "same_developer", "params_similarity",
              "rank_similarity"]


def predictor_matrices(meta: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Similarity matrices from metadata rows (index = model); skips all-missing columns.

    >>> m = pd.DataFrame({"base_family": ["G", "G", "L"], "base": ["G2", "G2", "L3"],
    ...                   "developer": ["a", "b", "a"], "params_b": [2.0, 27.0, 8.0],
    ...                   "leaderboard_rank": [1, 2, 4]}, index=["x", "y", "z"])
    >>> float(predictor_matrices(m)["rank_similarity"].loc["x", "z"])
    0.25
    """
    out = {}
    idx = meta.index
    for name, col, kind in (("same_base_family", "base_family", "eq"), ("same_base", "base", "eq"),
                            ("same_developer", "developer", "eq"),
                            ("params_similarity", "params_b", "inv"),
                            ("rank_similarity", "leaderboard_rank", "inv")):
        if col not in meta.columns or meta[col].isna().any():
            continue
        v = meta[col].to_numpy()
        if kind == "eq":
            mat = (v[:, None] == v[None, :]).astype("float64")
        else:
            v = v.astype("float64")
            mat = 1.0 / (1.0 + np.abs(v[:, None] - v[None, :]))
        out[name] = pd.DataFrame(mat, index=idx, columns=idx)
    return out


def _upper(mat: np.ndarray) -> np.ndarray:
    return mat[np.triu_indices(len(mat), 1)]


def _rankdata(x: np.ndarray) -> np.ndarray:
    # average ranks along the last axis (ties share their mean rank)
    from scipy.stats import rankdata

    return rankdata(x, axis=-1)


def _corr_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(-1) / den


def rsa_test(observed: pd.DataFrame, predictor: pd.DataFrame, *, n_perm: int = N_PERM,
             alternative: str = "greater", seed: int = 0) -> dict:
    """Spearman RSA of two model × model matrices with a label-permutation p-value.

    With few models every permutation is enumerated (exact test) when that is no more
    than ``n_perm``. Returns r, p_value, n_perm (used), exact, seed (None where exact), n_models, n_pairs.

    >>> idx = list("abcde"); x = np.arange(5.0)
    >>> obs = pd.DataFrame(-abs(x[:, None] - x[None, :]), idx, idx)
    >>> round(rsa_test(obs, obs, n_perm=200)["r"], 6)
    1.0
    """
    if alternative not in ("greater", "two-sided", "less"):
        raise UserError(f"alternative={alternative!r}; use greater, less or two-sided")
    check_n_perm(n_perm)
    models = list(observed.index)
    pred = predictor.loc[models, models].to_numpy(dtype="float64")
    obs = observed.loc[models, models].to_numpy(dtype="float64")
    n = len(models)
    base = {"n_models": n, "n_pairs": n * (n - 1) // 2}
    o_up = _upper(obs)
    # undefined: too few models, a constant predictor or observed matrix, or a NaN in either (a model whose scores
    # are constant or NaN: np.ptp of a NaN array is NaN, never 0, and every comparison with a NaN r was False, so
    # the test ran and reported p = 1/(n_perm + 1), or 0 when exact: "significant" beside r = NaN)
    if n < 3 or not (np.isfinite(o_up).all() and np.isfinite(_upper(pred)).all()) \
            or np.ptp(_upper(pred)) == 0 or np.ptp(o_up) == 0:
        return {**base, "r": np.nan, "p_value": np.nan, "n_perm": 0, "exact": False, "seed": None}
    o_rank = _rankdata(o_up)
    r_obs = float(_corr_rows(o_rank, _rankdata(_upper(pred)))[()])
    exact = math.factorial(n) <= n_perm
    if exact:
        perms = np.array(list(permutations(range(n))))
    else:
        rng = np.random.default_rng(seed)
        perms = np.array([rng.permutation(n) for _ in range(n_perm)])
    iu = np.triu_indices(n, 1)
    # permuted upper triangles: pred[perm][:, perm] at (i, j) = pred[perm[i], perm[j]]
    permuted = pred[perms[:, iu[0]], perms[:, iu[1]]]
    r_perm = _corr_rows(_rankdata(permuted), o_rank[None, :])
    tol = 1e-12
    if alternative == "greater":
        hits = np.sum(r_perm >= r_obs - tol)
    elif alternative == "less":
        hits = np.sum(r_perm <= r_obs + tol)
    else:
        hits = np.sum(np.abs(r_perm) >= abs(r_obs) - tol)
    if exact:  # the identity permutation is among the enumerated ones
        p = hits / len(perms)
    else:
        p = (1 + hits) / (1 + len(perms))
    return {**base, "r": r_obs, "p_value": float(p), "n_perm": int(len(perms)), "exact": exact,
            "seed": None if exact else seed}  # a Monte-Carlo p is reproducible from its seed
