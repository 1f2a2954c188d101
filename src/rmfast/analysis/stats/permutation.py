"""Two-group tests of a measure: Welch's t, rmfast's label permutation, and R's ``perm.t.test``.

Two ways to compare groups of models (e.g. Gemma- vs Llama-based reward models) on a
per-model × prompt measure (a category's median rank):

- :func:`permutation_test` (rmfast's default, used with one value per MODEL): Welch t,
  group labels permuted over the units, every relabelling enumerated when there are at most
  ``n_perm`` of them, two-sided by ``|t*| >= |t|``. With models as the units the test
  respects that the prompts of one model are not independent replicates.
- :func:`mkinfer_perm_t_test` (paper B's, ``method="paper"``): R ``MKinfer::perm.t.test``
  with its defaults (Welch, ``R = 9999`` Monte-Carlo permutations of the pooled values, the
  symmetric two-sided p ``max(mean(|T*| >= |t|), 1/R)``, all ``n!`` orderings when fewer than
  ``R``). It returns both of that function's p-values: ``p_value``, the PARAMETRIC Welch
  p (``2·pt(-|t|, df)``, the element ``$p.value`` that paper B's script reports), and
  ``perm_p_value``, the permutation p (``$perm.p.value``, which the script computes but does
  not use). R's random stream (``set.seed(42)``) cannot be replayed here, so ``perm_p_value``
  agrees with R's only up to Monte-Carlo error; ``p_value`` is deterministic and exact.

:func:`bonferroni` is the correction both use: ``min(1, p·m)`` over the m tests.
"""

from __future__ import annotations

import math
from itertools import combinations, permutations

import numpy as np

from ...errors import UserError

MKINFER_R = 9999  # MKinfer::perm.t.test's default number of Monte-Carlo permutations
#: rmfast's one default number of random permutations (every test, the CLI's --n-perm): the
#: authors' 9,999, so p = (1 + hits) / 10,000 has a round denominator.
N_PERM = MKINFER_R
#: rmfast's permutation test enumerates every relabelling when there are at most this many, whatever ``n_perm``
#: (10 models split 5/5: 252): an exact p costs less than the default number of random draws.
ENUMERATE_UP_TO = N_PERM


def welch_t(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Welch's t of A minus B along the last axis: ``(mean_a - mean_b) / sqrt(va/na + vb/nb)``.

    >>> round(float(welch_t(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0, 7.0]))), 4)
    -4.0415
    """
    # a, b: (..., n_a), (..., n_b) -> (...)
    va = a.var(-1, ddof=1) / a.shape[-1]
    vb = b.var(-1, ddof=1) / b.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a.mean(-1) - b.mean(-1)) / np.sqrt(va + vb)


def welch_df(a: np.ndarray, b: np.ndarray) -> float:
    """Welch–Satterthwaite degrees of freedom (as R's ``t.test``).

    >>> round(welch_df(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0, 7.0])), 3)
    4.959
    """
    sa = a.var(ddof=1) / len(a)
    sb = b.var(ddof=1) / len(b)
    return float((sa + sb) ** 2 / (sa ** 2 / (len(a) - 1) + sb ** 2 / (len(b) - 1)))


def check_n_perm(n_perm: int) -> None:
    """A permutation test needs at least one relabelling (``n_perm=0`` gave p = 1.0, or an IndexError in RSA).

    >>> check_n_perm(0)
    Traceback (most recent call last):
    ...
    rmfast.errors.UserError: n_perm=0: a permutation test needs at least 1 relabelling; give n_perm >= 1
    """
    if not isinstance(n_perm, (int, np.integer)) or n_perm < 1:
        raise UserError(f"n_perm={n_perm!r}: a permutation test needs at least 1 relabelling; give n_perm >= 1")


def permutation_test(values: np.ndarray, in_a: np.ndarray, *, n_perm: int = N_PERM,
                     seed: int = 0) -> dict:
    """Two-sided permutation Welch-t test of group A vs the rest (labels permuted).

    Enumerates all C(n, n_a) relabellings when there are no more than ``n_perm`` or
    :data:`ENUMERATE_UP_TO` (then ``p = hits / C``: exact, and cheap, so a small ``n_perm`` never
    trades it for a few random draws); otherwise draws ``n_perm`` at random
    (``p = (1 + hits) / (1 + n_perm)``). A measure equal for every unit has no t (0/0) and no p: NaN, not the
    0 that no relabelling reaching a NaN t had given (a "***" beside t = NaN).

    >>> v = np.array([1.0, 1.1, 0.9, 5.0, 5.2, 4.8]); a = np.array([1, 1, 1, 0, 0, 0], bool)
    >>> r = permutation_test(v, a); r["exact"], round(r["p_value"], 3)
    (True, 0.1)
    >>> permutation_test(np.full(6, 5.0), a)["p_value"]
    nan
    """
    check_n_perm(n_perm)
    values = np.asarray(values, dtype="float64")
    in_a = np.asarray(in_a, dtype=bool)
    n, na = len(values), int(in_a.sum())
    if na < 2 or n - na < 2:
        return {"t": np.nan, "p_value": np.nan, "n_perm": 0, "exact": False}
    t_obs = float(welch_t(values[in_a], values[~in_a]))
    if math.isnan(t_obs):  # every value the same: 0/0 (a t of +-inf, equal within groups only, is tested)
        return {"t": np.nan, "p_value": np.nan, "n_perm": 0, "exact": False}
    exact = math.comb(n, na) <= max(n_perm, ENUMERATE_UP_TO)
    if exact:
        masks = np.zeros((math.comb(n, na), n), dtype=bool)
        for i, idx in enumerate(combinations(range(n), na)):
            masks[i, list(idx)] = True
    else:
        rng = np.random.default_rng(seed)
        masks = np.zeros((n_perm, n), dtype=bool)
        for i in range(n_perm):
            masks[i, rng.choice(n, na, replace=False)] = True
    order = np.argsort(~masks, axis=1, kind="stable")  # group A first in each row
    perm_vals = values[order]  # (n_relabellings, n)
    t_perm = welch_t(perm_vals[:, :na], perm_vals[:, na:])
    hits = int(np.sum(np.abs(t_perm) >= abs(t_obs) - 1e-12))
    p = hits / len(masks) if exact else (1 + hits) / (1 + len(masks))
    return {"t": t_obs, "p_value": float(p), "n_perm": int(len(masks)), "exact": exact}


def no_test_why(values, in_a) -> str:
    """Why a two-group test of ``values`` gave no t (NaN): too few units in a group, or one value everywhere.

    >>> no_test_why([1.0, 2.0, 3.0], [True, False, False]), no_test_why([4.0] * 4, [True, True, False, False])
    ('needs at least 2 models per group', 'the measure is the same for every model (no t, no p)')
    """
    values, in_a = np.asarray(values, dtype="float64"), np.asarray(in_a, dtype=bool)
    if min(int(in_a.sum()), int((~in_a).sum())) < 2:
        return "needs at least 2 models per group"
    if np.isnan(values).any():
        return f"{int(np.isnan(values).sum())} model(s) have no value of the measure (NaN): no t, no p"
    if np.ptp(values) == 0:
        return "the measure is the same for every model (no t, no p)"
    return "the measure is constant within each group (no spread to test against: no t, no p)"


def mkinfer_perm_t_test(x, y, *, R: int = MKINFER_R, seed: int = 0) -> dict:
    """R ``MKinfer::perm.t.test(x, y)`` with its defaults (Welch, two-sided, symmetric).

    Returns t (x minus y), df (Welch), p_value (the parametric Welch p, R's ``$p.value``),
    perm_p_value (``max(mean(|T*| >= |t|), 1/R')``, R's ``$perm.p.value``), n_perm (R', the
    permutations drawn: all ``n!`` orderings of the pooled values when fewer than R, as R
    does, else R random ones) and exact.

    >>> r = mkinfer_perm_t_test([1.0, 2.0, 3.0], [2.0, 3.0, 4.0, 5.0])
    >>> r["exact"], r["n_perm"], round(r["p_value"], 4), round(r["perm_p_value"], 4)
    (True, 5040, 0.1443, 0.2)
    >>> mkinfer_perm_t_test([5.0] * 3, [5.0] * 4)["perm_p_value"]  # R: "data are essentially constant"
    nan
    >>> mkinfer_perm_t_test([1.0] * 3, [2.0] * 3)["p_value"]  # constant within each group: R stops too
    nan
    """
    from scipy.stats import t as tdist

    x = np.asarray(x, dtype="float64")
    y = np.asarray(y, dtype="float64")
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]  # R drops NAs silently
    nx, ny = len(x), len(y)
    if nx < 2 or ny < 2:
        return {"t": np.nan, "df": np.nan, "p_value": np.nan, "perm_p_value": np.nan,
                "n_perm": 0, "exact": False}
    t_obs = float(welch_t(x, y))
    if not math.isfinite(t_obs):  # each group constant (0/0, or a difference over 0): R's t.test stops ("data are
        # essentially constant"), so the paper's script has no p there
        return {"t": np.nan, "df": np.nan, "p_value": np.nan, "perm_p_value": np.nan, "n_perm": 0, "exact": False}
    df = welch_df(x, y)
    z = np.concatenate([x, y])
    n = nx + ny
    exact = math.factorial(n) < R if n < 20 else False
    if exact:  # R's sample.perm: every ordering of the pooled indices (not combinations)
        order = np.array(list(permutations(range(n))), dtype=np.int64)
    else:
        rng = np.random.default_rng(seed)
        order = rng.permuted(np.tile(np.arange(n), (R, 1)), axis=1)  # (R, n)
    zp = z[order]  # (R', n)
    t_perm = welch_t(zp[:, :nx], zp[:, nx:])
    perm_p = max(float(np.mean(np.abs(t_perm) >= abs(t_obs))), 1.0 / len(order))
    return {"t": t_obs, "df": df, "p_value": float(2 * tdist.sf(abs(t_obs), df)),
            "perm_p_value": perm_p, "n_perm": int(len(order)), "exact": exact}


def bonferroni(p, m: int | None = None) -> np.ndarray:
    """Bonferroni-adjusted p-values ``min(1, p·m)``; m defaults to the non-missing p's.

    >>> bonferroni([0.01, 0.2, float("nan")]).tolist()
    [0.02, 0.4, nan]
    """
    p = np.asarray(p, dtype="float64")
    m = int(np.sum(~np.isnan(p))) if m is None else m
    return np.minimum(p * m, 1.0)


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error, uniformly more powerful than Bonferroni): the k-th
    smallest of m times (m − k + 1), made monotone, capped at 1; NaN stays NaN and is not counted in m.
    statsmodels' ``multipletests(p, method="holm")``.

    >>> holm([0.01, 0.04, 0.03, float("nan")]).tolist()
    [0.03, 0.06, 0.06, nan]
    """
    p = np.asarray(p, dtype="float64")
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    out[order] = np.minimum(np.maximum.accumulate(p[order] * (m - np.arange(m))), 1.0)
    return out


__all__ = ["MKINFER_R", "N_PERM", "bonferroni", "holm", "mkinfer_perm_t_test", "permutation_test", "welch_df",
           "welch_t"]
