"""Ordinary least squares with classical and heteroskedasticity-robust (HC3) standard errors (numpy + scipy's t
distribution).

Small and dependency-light so that hundreds of model × prompt fits stay fast; tests
check it against statsmodels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class OLSFit:
    """Coefficients (intercept first), classical standard errors, t, two-sided p, n, R²; and the HC3 standard errors
    and p (MacKinnon & White 1985: robust to residuals whose variance changes with the predictor, as a reward's
    does across valence levels; statsmodels' ``cov_type="HC3"``). NaN for the coefficients a row of leverage 1
    (alone at its predictor level) moves, where HC3 is undefined (statsmodels returns a rounding artefact there)."""

    coef: np.ndarray
    se: np.ndarray
    t: np.ndarray
    p: np.ndarray
    n: int
    r2: float
    se_hc3: np.ndarray
    p_hc3: np.ndarray


def ols(y, *columns) -> OLSFit | None:
    """Fit y ~ 1 + columns. Returns None when there are too few rows or a column is constant.

    >>> fit = ols([1.0, 3.0, 5.0, 7.1], [0.0, 1.0, 2.0, 3.0])
    >>> round(float(fit.coef[1]), 2)
    2.03
    """
    from scipy.stats import t as tdist

    y = np.asarray(y, dtype="float64")
    x = np.column_stack([np.ones(len(y))] + [np.asarray(c, dtype="float64") for c in columns])
    n, k = x.shape
    if n <= k or np.linalg.matrix_rank(x) < k:
        return None
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    dof = n - k
    sigma2 = float(resid @ resid) / dof
    xtx_inv = np.linalg.inv(x.T @ x)  # (k, k)
    se = np.sqrt(np.diag(sigma2 * xtx_inv))
    lev = np.einsum("ij,jk,ik->i", x, xtx_inv, x)  # (n,) the hat matrix's diagonal
    # a row alone at its level (leverage 1) fits itself: 1 - h and its residual are rounding noise, their ratio an
    # arbitrary number. It adds nothing to the coefficients it cannot move; those it moves have no HC3 value (NaN)
    lone = lev > 1.0 - 1e-8  # (n,)
    infl = xtx_inv @ x.T  # (k, n): how each row moves each coefficient
    moved = (np.abs(infl[:, lone]) > 1e-9 * np.abs(infl).max()).any(axis=1)  # (k,)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(lone, 0.0, resid**2 / (1.0 - lev) ** 2)  # (n,)
        se_hc3 = np.where(moved, np.nan, np.sqrt(np.diag((infl * w) @ infl.T)))
        t, t_hc3 = coef / se, coef / se_hc3
    p = 2 * tdist.sf(np.abs(t), dof)
    p_hc3 = 2 * tdist.sf(np.abs(t_hc3), dof)
    tss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(resid @ resid) / tss if tss > 0 else np.nan
    return OLSFit(coef=coef, se=se, t=t, p=p, n=n, r2=r2, se_hc3=se_hc3, p_hc3=p_hc3)
