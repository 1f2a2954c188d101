"""Bootstrap intervals of the similarity measures (:mod:`.similarity`): the median-recentred percentile interval
(the default), Efron's BCa interval (its acceleration from a grouped jackknife), the plain percentile and the basic
interval. What a resample leaves out (the pairs of copies of a candidate) is in :func:`.similarity._finish`;
in-memory replicates for coverage simulations in :mod:`.similarity_replicates`."""

from __future__ import annotations

import math

import numpy as np

from ...errors import UserError

#: Replicates below which the notes warn that the interval ends are Monte-Carlo noise (the
#: 2.5 % end of 200 replicates is their 5th smallest); also the default.
MIN_TRUSTED_BOOTSTRAP = 200
#: the intervals offered: the default first
INTERVALS = ("recentred", "bca", "percentile", "basic")
#: blocks of the grouped jackknife that estimates BCa's acceleration: each is one more pass over the states (a
#: leave-one-out jackknife would be n passes); the blocks are a seeded random partition of the candidates. The
#: acceleration is then a skewness of 20 values: noisy (a referee's case, n = 40: SD 0.017 over partitions, where
#: leave-one-out gives ~0), which moves BCa's 2.5/97.5 % levels by about a point at most
JACKKNIFE_BLOCKS = 20


def check_interval(interval: str) -> None:
    """A known interval method, and for ``bca`` scipy (its normal quantiles), checked before any work: a missing scipy
    met at the first interval lost every replicate already run (minutes to hours)."""
    if interval not in INTERVALS:
        raise UserError(f"interval {interval!r}: give one of {', '.join(INTERVALS)}")
    if interval == "bca":
        from ..data.deps import require

        require("scipy.special", "--interval bca (the default --interval recentred does not)")


def jackknife_count(n: int, blocks: int = JACKKNIFE_BLOCKS) -> int:
    """How many blocks the grouped jackknife of n candidates has (each a pass): ``blocks``, or n if fewer."""
    return min(blocks, n)


def jackknife_blocks(n: int, seed: int, blocks: int = JACKKNIFE_BLOCKS) -> list[np.ndarray]:
    """The grouped jackknife's blocks: a random partition of rows 0..n-1 (``default_rng([seed, 3])``) into
    :func:`jackknife_count` nearly equal parts, each (m,) sorted.

    >>> [b.tolist() for b in jackknife_blocks(5, 0, blocks=2)]
    [[0, 2, 3], [1, 4]]
    """
    order = np.random.default_rng([seed, 3]).permutation(n)  # (n,)
    return [np.sort(b) for b in np.array_split(order, jackknife_count(n, blocks))]


def acceleration(jack: np.ndarray) -> float:
    """BCa's acceleration from jackknife values (θ_(g): the estimate without block g): a = Σ u³ / (6 (Σ u²)^1.5),
    u = mean(θ_(·)) − θ_(g) (Efron & Tibshirani 1993, eq. 14.15; with blocks in place of single rows the ratio
    estimates the same skewness of the influence values). NaN when fewer than 2 values are finite or all agree.

    >>> round(acceleration(np.array([1.0, 2.0, 4.0])), 4)
    -0.0367
    """
    jack = np.asarray(jack, dtype="float64")
    if np.count_nonzero(np.isfinite(jack)) < 2 or not np.isfinite(jack).all():
        return math.nan
    u = jack.mean() - jack  # (G,)
    s2 = float(u @ u)
    return float((u ** 3).sum() / (6.0 * s2 ** 1.5)) if s2 > 0 else math.nan


def bca_levels(obs: float, boot: np.ndarray, a: float, level: float) -> tuple[float, float]:
    """BCa's quantile levels (α1, α2) of the replicates: z0 = Φ⁻¹(share of replicates below the estimate, ties
    counted half), α_i = Φ(z0 + (z0 + z_i) / (1 − a (z0 + z_i))) for z_i = Φ⁻¹(α), Φ⁻¹(1 − α). NaN where z0 is
    infinite (every replicate on one side of the estimate: no BCa interval) or a is NaN."""
    from ..data.deps import require

    sp = require("scipy.special", "--interval bca")  # the standard normal's CDF and its inverse
    ndtr, ndtri = sp.ndtr, sp.ndtri

    below = (np.count_nonzero(boot < obs) + 0.5 * np.count_nonzero(boot == obs)) / len(boot)
    if not 0 < below < 1 or not np.isfinite(a):
        return math.nan, math.nan
    z0, alpha = float(ndtri(below)), (1 - level) / 2
    out = []
    for z in (float(ndtri(alpha)), float(ndtri(1 - alpha))):
        d = 1.0 - a * (z0 + z)
        out.append(float(ndtr(z0 + (z0 + z) / d)) if d > 0 else math.nan)
    return out[0], out[1]


def bootstrap_interval(obs: float, boot: np.ndarray, level: float = 0.95, method: str = "recentred",
                       jack: np.ndarray | None = None) -> tuple[float, float]:
    """A bootstrap interval of the estimate ``obs`` from its replicates ``boot``; α = (1 − level) / 2.

    - ``recentred`` (the default): the percentile interval recentred on the estimate, ``[q(α) − s, q(1 − α) − s]``
      with s = median(boot) − obs. It contains ``obs`` by construction and has the replicates' width; it does not
      correct a bias of the estimator itself (plain CKA's small-n inflation), it only places the spread around
      the estimate.
    - ``bca``: Efron's bias-corrected and accelerated interval: the replicates' quantiles at the levels of
      :func:`bca_levels`, its acceleration from ``jack`` (the grouped jackknife's values, :func:`acceleration`).
      NaN where every replicate lies on one side of the estimate.
    - ``percentile``: ``[q(α), q(1 − α)]``; ``basic``: ``[2·obs − q(1 − α), 2·obs − q(α)]``.

    Since resamples leave out the pairs of copies of a candidate (:func:`.similarity._finish`), replicates straddle
    the estimate (about half below) and these intervals are close to one another; their coverage is measured by
    ``tests/test_similarity_intervals.py`` and tabled in docs/representations.md. NaN replicates are dropped; none
    left (or a NaN estimate) gives (nan, nan).

    >>> bootstrap_interval(0.19, np.array([0.20, 0.25, 0.30, 0.35, 0.50]), level=0.5)
    (0.14, 0.24)
    >>> [round(x, 4) for x in bootstrap_interval(0.19, np.array([0.20, 0.25, 0.30, 0.35, 0.50]), 0.5, "basic")]
    [0.03, 0.13]
    """
    check_interval(method)
    boot = np.asarray(boot, dtype="float64")
    boot = boot[np.isfinite(boot)]
    if not len(boot) or not np.isfinite(obs):
        return math.nan, math.nan
    alpha = (1 - level) / 2
    q_lo, q_hi = float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))
    if method == "percentile":
        return q_lo, q_hi
    if method == "basic":
        return 2 * obs - q_hi, 2 * obs - q_lo
    if method == "bca":
        if jack is None:
            raise ValueError("a BCa interval needs the jackknife values (jack=)")
        a1, a2 = bca_levels(obs, boot, acceleration(jack), level)
        if not (np.isfinite(a1) and np.isfinite(a2)):
            return math.nan, math.nan
        return float(np.quantile(boot, a1)), float(np.quantile(boot, a2))
    bias = float(np.median(boot)) - obs
    lo, hi = q_lo - bias, q_hi - bias
    return min(lo, obs), max(hi, obs)  # rounding must not push obs a hair outside


_WHAT = {"recentred": "median-recentred percentile bootstrap intervals (the replicates' percentiles shifted by "
                      "median(replicates) − estimate, so each contains its estimate; not Efron's bias-corrected "
                      "interval)",
         "bca": "BCa bootstrap intervals (Efron's bias-corrected and accelerated percentile interval; the "
                "acceleration from a grouped jackknife over {blocks} random blocks of candidates, {blocks} more "
                "passes; NaN where every replicate lies on one side of the estimate)",
         "percentile": "percentile bootstrap intervals (the replicates' own quantiles)",
         "basic": "basic bootstrap intervals (2·estimate − the replicates' quantiles)"}


def interval_note(method: str, level: float, bootstrap: int, seed: int, blocks: int = JACKKNIFE_BLOCKS) -> str:
    """The result's note on its intervals: which, how many replicates, what they cover and when they are too few."""
    return (f"{level:.0%} {_WHAT[method].format(blocks=blocks)} over candidates ({bootstrap} replicates, seed {seed}): "
            "they cover resampling the candidates (other tokens of the same vocabulary), not other models or "
            "prompts. Every measure of a resample leaves out the pairs of copies of a candidate (copies counted as "
            "distinct items inflated CKA and debiased CKA). Measured coverage at 95 % (docs/representations.md): "
            "debiased CKA at or above nominal (too wide, about 1.25-1.5x, where the candidates are fewer than ~5x "
            "the hidden size: 98-100 % there); RV2 too with the default recentred interval, but where the "
            "candidates are about as many as the hidden size its replicates run high and its BCa, percentile and "
            "basic intervals cover 27-79 %; plain CKA/RV below nominal, because the estimate itself is biased "
            "upward at small n"
            + ("" if bootstrap >= MIN_TRUSTED_BOOTSTRAP else
               f"; {bootstrap} replicates are too few for {level:.0%} interval ends (their Monte-Carlo error is "
               f"large): use at least {MIN_TRUSTED_BOOTSTRAP}"))


def rv2_note(method: str, n: int, hidden: int) -> str | None:
    """The note where RV2's interval is one that under-covers at these sizes: BCa, percentile or basic with fewer
    than 5x as many candidates as the larger hidden size (measured: 27-79 % at n = d, 98-99 % at n = 5d; the
    default recentred interval 97-98 % at n = d), else None.

    >>> rv2_note("recentred", 100, 100) is None, rv2_note("bca", 500, 100) is None, rv2_note("bca", 100, 100)[:24]
    (True, True, "RV2's bca intervals unde")
    """
    if method == "recentred" or n >= 5 * hidden:
        return None
    return (f"RV2's {method} intervals under-cover at {n:,} candidates against a hidden size of {hidden:,} (fewer than "
            "5x: its replicates run high; measured 27-79 % coverage at 95 % where the two are equal): read RV2's "
            "interval with --interval recentred (the default, 97-98 % there), or debiased CKA's")


def lost_note(lost: dict, bootstrap: int) -> str | None:
    """The note where replicates came out NaN and :func:`bootstrap_interval` left them out (``lost``: per measure,
    the most of one layer pair), else None: an interval end may rest on fewer replicates than the note names.

    >>> lost_note({"cka": 0, "rv2": 3}, 200)
    'replicates undefined (NaN) were left out of the intervals: up to 3 of 200 for rv2 in a layer pair'
    """
    said = [f"{v} of {bootstrap} for {m}" for m, v in lost.items() if v]
    return ("replicates undefined (NaN) were left out of the intervals: up to " + ", ".join(said) + " in a layer pair"
            if said else None)


def permutation_note(permutations: int, seed: int, pairs: int) -> str:
    """The note on the permutation p-values: their floor, and Holm's over the layer pairs where it is .05 or more
    (no adjusted p can then reach .05: with 19 permutations, any two pairs).

    >>> "is 0.2: no pair can reach .05; give at least 80 permutations" in permutation_note(19, 0, 4)
    True
    """
    floor = 1 / (1 + permutations)
    return (f"p_<measure>: {permutations} permutations of B's rows (seed {seed}); smallest possible p = {floor:.3g}; "
            f"p_<measure>_holm: Holm over the {pairs} layer pairs"
            + (f" (its smallest possible is {min(1.0, floor * pairs):.3g}: no pair can reach .05; give at least "
               f"{20 * pairs} permutations where a p matters)" if floor * pairs >= 0.05 else ""))


def bca_gaps_note(pairs) -> str | None:
    """The note where a BCa interval is NaN beside a finite estimate (every replicate on one side of it, or a
    jackknife block whose measure is undefined: no acceleration), else None."""
    from .similarity_guards import MEASURES

    gaps = sum(int((np.isfinite(pairs[m]) & ~np.isfinite(pairs[f"{m}_lo"])).sum()) for m in MEASURES)
    return (f"{gaps} BCa interval(s) are NaN beside a finite estimate: every replicate lies on one side of it, or a "
            "jackknife block's measure is undefined (a layer constant on those candidates); read the default "
            "(--interval recentred) there") if gaps else None


__all__ = ["INTERVALS", "bca_gaps_note", "lost_note", "permutation_note", "rv2_note", "JACKKNIFE_BLOCKS", "MIN_TRUSTED_BOOTSTRAP", "acceleration", "bca_levels",
           "bootstrap_interval", "check_interval", "interval_note", "jackknife_blocks", "jackknife_count"]
