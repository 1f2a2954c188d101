"""Bootstrap intervals of the similarity measures (:mod:`.similarity`): the median-recentred percentile interval.
What a resample leaves out (the pairs of copies of a candidate) is in :func:`.similarity._finish`; in-memory
replicates for coverage simulations in :mod:`.similarity_replicates`."""

from __future__ import annotations

import math

import numpy as np


#: Replicates below which the notes warn that the interval ends are Monte-Carlo noise (the
#: 2.5 % end of 200 replicates is their 5th smallest); also the default.
MIN_TRUSTED_BOOTSTRAP = 200


def bootstrap_interval(obs: float, boot: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval recentred on the estimate: a median-recentred percentile interval (NOT
    Efron's bias-corrected BCa interval, which moves the quantile levels by z0 and an acceleration).

    The replicates' percentiles shifted by median(boot) − obs: ``[q(α) − s, q(1 − α) − s]``. It contains ``obs``
    by construction (q(α) ≤ median ≤ q(1 − α)) and has the replicates' width. It does not correct a bias of the
    estimator itself (plain CKA's small-n inflation): it only places the spread around the estimate. Since
    resamples leave out the pairs of copies of a candidate (:func:`_finish`), replicates straddle the estimate
    (about half below) and this interval is close to the plain percentile one; the coverage of both is measured
    by ``tests/test_similarity_intervals.py`` and tabled in docs/representations.md. NaN replicates are dropped;
    none left (or a NaN estimate) gives (nan, nan).

    >>> bootstrap_interval(0.19, np.array([0.20, 0.25, 0.30, 0.35, 0.50]), level=0.5)
    (0.14, 0.24)
    """
    boot = np.asarray(boot, dtype="float64")
    boot = boot[np.isfinite(boot)]
    if not len(boot) or not np.isfinite(obs):
        return math.nan, math.nan
    alpha = (1 - level) / 2
    bias = float(np.median(boot)) - obs
    lo, hi = (float(np.quantile(boot, alpha)) - bias, float(np.quantile(boot, 1 - alpha)) - bias)
    return min(lo, obs), max(hi, obs)  # rounding must not push obs a hair outside


__all__ = ["MIN_TRUSTED_BOOTSTRAP", "bootstrap_interval"]
