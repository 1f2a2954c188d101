"""Spearman's footrule and NDCG between two score vectors over the same items.

Both come from paper A's ``analysis_support.py`` (neither is in a published figure; the
authors marked both "needs to be double-checked"). ``method="paper"`` computes them as that
code does; ``method="rmfast"`` fixes what is wrong:

* footrule similarity 1 − Σ|r_a − r_b| / M (ranks with ties averaged). Paper: M = n²/2;
  rmfast: M = ⌊n²/2⌋, the largest footrule of two rankings of n items, so a reversed
  ranking scores exactly 0 for odd n too.
* NDCG of ``pred``'s ranking with ``true``'s scores as gains 2^rel − 1. Paper: the ideal
  DCG of a top-k is built from the *first k items in input order*, not the k best (a bug
  whenever k is given); rmfast uses the k best. The paper takes raw scores as gains: a negative
  ideal DCG leaves NDCG undefined (NaN, counted; the paper's code said 0.0). rmfast min-max scales
  the gains, which has little range on reward scores (a random order scores ~0.93–0.97), so every
  NDCG is reported beside :func:`ndcg_baselines` (random and reversed order on the same scores);
  prefer Kendall tau or RBO. Ties are broken deterministically (see :func:`ndcg`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data.methods import check_method


def _pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype="float64")
    b = np.asarray(b, dtype="float64")
    if a.shape != b.shape or a.ndim != 1:
        raise UserError("footrule/NDCG need two 1-D score arrays over the same items")
    return a, b


def footrule(a, b, method: str = "rmfast") -> float:
    """Footrule similarity of two score vectors (1 = same order, 0 = reversed); NaN where either is constant (no
    order to compare: average ranks gave it 0.5, more than an unrelated model's ~1/3, while tau and rho were NaN).

    >>> footrule([1, 2, 3, 4], [4, 3, 2, 1])  # D = 3+1+1+3 = 8 = 4²/2
    0.0
    >>> footrule([1, 2, 3], [3, 2, 1]), round(footrule([1, 2, 3], [3, 2, 1], method="paper"), 4)
    (0.0, 0.1111)
    >>> footrule([1, 2, 3], [5, 5, 5])
    nan
    """
    check_method(method)
    a, b = _pair(a, b)
    n = len(a)
    if n and (np.ptp(a) == 0 or np.ptp(b) == 0):
        return float("nan")
    dist = float(np.abs(pd.Series(a).rank().to_numpy() - pd.Series(b).rank().to_numpy()).sum())
    most = n * n / 2 if method == "paper" else float(n * n // 2)
    return 1.0 - dist / most if most > 0 else float("nan")


def _gains_and_discounts(true, k, method):
    """(gains per item, discounts per rank position 1..n, zero past k) of :func:`ndcg`."""
    if method != "paper":
        span = float(np.ptp(true)) if true.size else 0.0
        if not span > 0:
            return None, None
        true = (true - true.min()) / span
    disc = 1.0 / np.log2(np.arange(1, len(true) + 1) + 1)  # (n,)
    if k:
        disc[k:] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        return 2.0 ** true - 1, disc


def _dcg(gain, disc, pred, ties: str) -> float:
    """DCG of the order of ``pred`` (descending). ``ties="average"``: every item of a run of equal ``pred`` scores
    gets the run's mean gain (McSherry & Najork 2008), so the value does not depend on the input order;
    ``"pandas"``: tied items in the order pandas' default ``sort_values(ascending=False)`` leaves them, as the
    paper's code sorts (deterministic for a given input order, but not stable)."""
    if ties == "pandas":
        order = pd.Series(pred).sort_values(ascending=False).index.to_numpy()
    else:
        order = np.argsort(-pred, kind="stable")  # (n,)
    g = gain[order]
    if ties == "average":
        p = pred[order]
        starts = np.r_[0, np.flatnonzero(p[1:] != p[:-1]) + 1]  # first position of each run of equal scores
        sums = np.add.reduceat(g, starts)
        sizes = np.diff(np.r_[starts, len(g)])
        g = np.repeat(sums / sizes, sizes)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.sum(g * disc))


def ndcg(true, pred, k: int | None = None, method: str = "rmfast") -> float:
    """NDCG@k of the order of ``pred`` with gains 2^g − 1 (``k=None``: every item). ``method="paper"``: g = ``true``
    as it is, the paper's code: a negative score is a negative gain, so where the ideal DCG is <= 0 (reward scores
    mostly below zero: 70 % of paper A's model pairs) NDCG is UNDEFINED and returned as NaN (the paper's code
    gave 0.0), and values above 1 occur (a negative-gain ideal); scores past ~1000 overflow to NaN.
    ``"rmfast"``: g = ``true`` min-max scaled to [0, 1], so any score scale and sign ranks alike (NaN when
    ``true`` is constant). Min-max scaled NDCG has little range on reward scores: read it beside
    :func:`ndcg_baselines` (a random and a reversed order on the same scores).

    Ties in ``pred``, deterministically: ``"rmfast"`` averages the gains over each run of tied items (the value
    does not depend on the input order; pandas' order of ties moved values by up to 3.1e-4 on the 7,530
    EloEverything items, GE prompt, and by up to 7.6e-4 in issue 52's measurement); ``"paper"`` orders ties as the paper's code does, by pandas' default (unstable) sort of the
    input order, so it reproduces the authors' values exactly.

    >>> ndcg([3.0, 2.0, 1.0], [3.0, 2.0, 1.0]), ndcg([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0])
    (1.0, 1.0)
    >>> ndcg([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], method="paper")  # the paper's gains: all negative
    nan
    >>> round(ndcg([1.0, 3.0], [1.0, 3.0], k=1, method="paper"), 3)  # ideal from item 1 only
    7.0
    >>> ndcg([1.0, 0.0, 0.5], [1.0, 1.0, 0.0]) == ndcg([0.0, 1.0, 0.5], [1.0, 1.0, 0.0])  # ties: input order moot
    True
    """
    check_method(method)
    true, pred = _pair(true, pred)
    gain, disc = _gains_and_discounts(true, k, method)
    if gain is None:
        return float("nan")
    dcg = _dcg(gain, disc, pred, "pandas" if method == "paper" else "average")
    if k and method == "paper":  # the paper's ideal: the first k items in input order, sorted
        ideal_gain = np.sort(gain[:k])[::-1]
        with np.errstate(over="ignore", invalid="ignore"):
            idcg = float(np.sum(ideal_gain * disc[: len(ideal_gain)]))
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            idcg = float(np.sum(np.sort(gain)[::-1] * disc))
    return dcg / idcg if idcg > 0 else float("nan")


def ndcg_baselines(true, k: int | None = None, method: str = "rmfast") -> dict[str, float]:
    """Two reference values of :func:`ndcg` on the same gains ``true``: ``random``, the expected NDCG of a uniformly
    random order (exactly: mean gain × Σ discounts / ideal DCG), and ``reversed``, the NDCG of the reversed order
    (``pred = −true``). A model pair's NDCG means something only against these: on reward scores a random order
    already scores ~0.93–0.97 with min-max gains.

    >>> b = ndcg_baselines([3.0, 2.0, 1.0, 0.0]); round(b["random"], 3), round(b["reversed"], 3)
    (0.788, 0.592)
    """
    check_method(method)
    true = np.asarray(true, dtype="float64")
    gain, disc = _gains_and_discounts(true, k, method)
    if gain is None:
        return {"random": float("nan"), "reversed": float("nan")}
    with np.errstate(over="ignore", invalid="ignore"):
        idcg = float(np.sum(np.sort(gain)[::-1] * disc))
        rnd = float(gain.mean() * disc.sum()) / idcg if idcg > 0 else float("nan")
    rev = ndcg(true, -true, k=k, method=method)
    return {"random": rnd, "reversed": rev}


#: pairs of up to this many items get Spearman's exact permutation p (every ordering: 8! = 40,320 of them)
SPEARMAN_EXACT_N = 8


def spearman_p(x, y) -> float:
    """Two-sided p of Spearman's rho between ``x`` and ``y``: exact for n <= :data:`SPEARMAN_EXACT_N` (every
    ordering of ``y``'s average ranks against ``x``'s), scipy's t approximation above it, except for a perfect
    correlation, where the exact count of orderings that reach it (2 / n! without ties; the approximation gave 0 or
    1e-24 there at any n). Three items in
    one order printed p = 0 and were called an underflow; their exact p is 1/3, as Kendall's column said.

    >>> spearman_p([1, 2, 3], [10, 20, 30]), spearman_p(range(12), range(12)) == 2 / math.factorial(12)
    (0.3333333333333333, True)
    """
    from itertools import permutations

    from scipy import stats

    x, y = np.asarray(x, dtype="float64"), np.asarray(y, dtype="float64")
    n = len(x)
    sp = stats.spearmanr(x, y)
    if n < 3 or not np.isfinite(sp.statistic):
        return float(sp.pvalue)
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    if n <= SPEARMAN_EXACT_N:
        perms = ry[np.array(list(permutations(range(n))))]  # (n!, n) y's ranks in every order
        dx, dp = rx - rx.mean(), perms - perms.mean(axis=1, keepdims=True)
        rho = dp @ dx / np.sqrt((dp * dp).sum(axis=1) * (dx @ dx))  # (n!,)
        return float(np.mean(np.abs(rho) >= abs(sp.statistic) - 1e-12))
    if abs(sp.statistic) > 1 - 1e-12:  # every ordering of y that keeps its tie groups reaches it: prod(t!) of n!, and
        groups = list(np.unique(ry, return_counts=True)[1])  # as many reversed where the groups read the same reversed
        ways = math.prod(math.factorial(int(t)) for t in groups) * (1 + (groups == groups[::-1]))
        return ways / math.factorial(n)  # 0.0 past n = 170 without ties: an underflow, as the note says
    return float(sp.pvalue)


def note_underflow(table: pd.DataFrame, columns, ledger) -> None:
    """Say, on ``ledger``, how many of ``table``'s p-values in ``columns`` are printed as 0: below ~1e-308, the
    smallest number a double holds (an asymptotic p of a strong correlation over thousands of items), not 0."""
    under = int((table[list(columns)] == 0).sum().sum()) if len(table) else 0
    if under:
        ledger.note(f"{under} p-value(s) printed as 0 are below ~1e-308, the smallest number a double holds "
                    "(floating-point underflow): read them as p < 1e-300, not p = 0")

