"""Spearman's footrule and NDCG between two score vectors over the same items.

Both come from paper A's ``analysis_support.py`` (neither is in a published figure; the
authors marked both "needs to be double-checked"). ``method="paper"`` computes them as that
code does; ``method="rmfast"`` fixes what is wrong:

* footrule similarity 1 − Σ|r_a − r_b| / M (ranks with ties averaged). Paper: M = n²/2;
  rmfast: M = ⌊n²/2⌋, the largest footrule of two rankings of n items, so a reversed
  ranking scores exactly 0 for odd n too.
* NDCG of ``pred``'s ranking with ``true``'s scores as gains 2^rel − 1. Paper: the ideal
  DCG of a top-k is built from the *first k items in input order*, not the k best (a bug
  whenever k is given); rmfast uses the k best. Both take raw scores as relevance: the value
  depends on the score scale (a model scoring −20..+12 puts nearly all gain on its top item),
  so NDCG between reward models is a weak statistic; prefer Kendall tau or RBO.
"""

from __future__ import annotations

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
    """Footrule similarity of two score vectors (1 = same order, 0 = reversed).

    >>> footrule([1, 2, 3, 4], [4, 3, 2, 1])  # D = 3+1+1+3 = 8 = 4²/2
    0.0
    >>> footrule([1, 2, 3], [3, 2, 1]), round(footrule([1, 2, 3], [3, 2, 1], method="paper"), 4)
    (0.0, 0.1111)
    """
    check_method(method)
    a, b = _pair(a, b)
    n = len(a)
    dist = float(np.abs(pd.Series(a).rank().to_numpy() - pd.Series(b).rank().to_numpy()).sum())
    most = n * n / 2 if method == "paper" else float(n * n // 2)
    return 1.0 - dist / most if most > 0 else float("nan")


def ndcg(true, pred, k: int | None = None, method: str = "rmfast") -> float:
    """NDCG@k of the order of ``pred`` with gains 2^g − 1 (``k=None``: every item). ``method="paper"``: g = ``true``
    as it is, the paper's code (a negative score is a negative gain: with an ideal DCG <= 0, 0.0 even for identical
    rankings, which reward scores below zero give; scores past ~1000 overflow to NaN). ``"rmfast"``: g = ``true``
    min-max scaled to [0, 1], so any score scale and sign ranks alike (NaN when ``true`` is constant).

    Items keep their input order among tied ``pred`` scores as pandas' default sort leaves
    them (the paper's order when the input is in its token-id order).

    >>> ndcg([3.0, 2.0, 1.0], [3.0, 2.0, 1.0]), ndcg([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0])
    (1.0, 1.0)
    >>> ndcg([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], method="paper")  # the paper's gains: all negative
    0.0
    >>> round(ndcg([1.0, 3.0], [1.0, 3.0], k=1, method="paper"), 3)  # ideal from item 1 only
    7.0
    """
    check_method(method)
    true, pred = _pair(true, pred)
    if method != "paper":
        span = float(np.ptp(true)) if true.size else 0.0
        if not span > 0:
            return float("nan")
        true = (true - true.min()) / span
    order = pd.Series(pred).sort_values(ascending=False).index.to_numpy()
    if k:
        order = order[:k]
    rel = true[order]
    discounts = np.log2(np.arange(1, len(rel) + 1) + 1)
    ideal_pool = true[:k] if (k and method == "paper") else true
    ideal = np.sort(ideal_pool)[::-1][: len(rel)]
    with np.errstate(over="ignore", invalid="ignore"):  # scores > ~1000: inf / inf = NaN
        dcg = float(np.sum((2.0 ** rel - 1) / discounts))
        idcg = float(np.sum((2.0 ** ideal - 1) / discounts[: len(ideal)]))
        return dcg / idcg if idcg > 0 else 0.0
