"""Rank-biased overlap (Webber, Moffat & Zobel 2010), extrapolated form, from scores.

RBO weights agreement at the top of two rankings: at depth d the overlap
A_d = |top_d(a) ∩ top_d(b)| / d gets weight (1 − p) p^(d−1). For two complete rankings
of the same k items the extrapolated value is

    RBO_ext = A_k p^k + (1 − p)/p · Σ_{d=1..k} A_d p^d,

which is 1 for identical rankings. With p = 0.9 the top 10 ranks carry ~86% of the weight.
Ties are broken by the items' order in the input (stable sort), so the value is
deterministic; with many tied scores, say so when reporting it.
"""

from __future__ import annotations

import numpy as np

from ...errors import UserError


def _positions(scores: np.ndarray) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")
    pos = np.empty(len(scores), dtype=np.int64)
    pos[order] = np.arange(1, len(scores) + 1)
    return pos


def n_tied(scores) -> int:
    """How many items share their score with another item: those whose order RBO breaks by input order (a missing
    score, NaN, ties with nothing).

    >>> n_tied([3.0, 1.0, 1.0, 2.0, 1.0, float("nan"), float("nan")])
    3
    """
    scores = np.asarray(scores, dtype="float64")
    _, counts = np.unique(scores[~np.isnan(scores)], return_counts=True)
    return int(counts[counts > 1].sum())


def rbo(a, b, p: float = 0.9, depth: int | None = None) -> float:
    """Extrapolated RBO of two score vectors over the same items (higher score = better).

    >>> rbo([3, 2, 1], [3, 2, 1])
    1.0
    >>> round(rbo([3, 2, 1, 0], [0, 1, 2, 3], p=0.5), 4)
    0.2083
    """
    a = np.asarray(a, dtype="float64")
    b = np.asarray(b, dtype="float64")
    if a.shape != b.shape or a.ndim != 1:
        raise UserError("rbo needs two 1-D score arrays over the same items")
    if not 0 < p < 1:
        raise UserError(f"rbo persistence p={p} must lie strictly between 0 and 1")
    k = len(a) if depth is None else min(int(depth), len(a))
    if k == 0:
        return float("nan")
    deepest = np.maximum(_positions(a), _positions(b))  # depth at which an item is in both
    overlap = np.cumsum(np.bincount(deepest, minlength=len(a) + 1)[1:])[:k]  # X_d, d=1..k
    d = np.arange(1, k + 1)
    agree = overlap / d
    weights = np.power(p, d)
    value = agree[-1] * p**k + (1 - p) / p * float(np.sum(agree * weights))
    return float(min(value, 1.0)) if value > 1 - 1e-12 else float(value)


def paper_ranking(scores, items) -> list:
    """Items best first, ordered as paper A's scripts did: pandas ``sort_values(ascending=False)``
    (its default sort, not stable) over the items in the order given, so tied scores come out
    in pandas' order for that input order.

    >>> paper_ranking([1.0, 3.0, 2.0], ["a", "b", "c"])
    ['b', 'c', 'a']
    """
    import pandas as pd

    return list(pd.Series(np.asarray(scores, dtype="float64"), index=list(items))
                .sort_values(ascending=False).index)


def rbo_truncated(ranked_a, ranked_b, p: float = 0.9, threshold: float = 1e-6) -> float:
    """Paper A's RBO: Σ_{d=1..D} (1 − p) p^(d−1) |A_:d ∩ B_:d| / d over two ranked lists,
    truncated at D = int(ln threshold / ln p) + 1 (132 for p = 0.9), no extrapolation, so
    identical rankings score 1 − p^D (0.999999...), not 1.

    >>> round(rbo_truncated(list("abc"), list("abc")), 6)  # depth 3 < 132: 1 − 0.9³
    0.271
    >>> round(rbo_truncated(list("abcd"), list("dcba"), p=0.5), 4)  # ½(¼·⅔ + ⅛·1)
    0.1458
    """
    if not 0 < p < 1:
        raise UserError(f"rbo persistence p={p} must lie strictly between 0 and 1")
    max_depth = min(max(len(ranked_a), len(ranked_b)), int(np.log(threshold) / np.log(p)) + 1)
    depth = min(len(ranked_a), len(ranked_b), max_depth)
    seen_a, seen_b, both, total = set(), set(), 0, 0.0
    for d in range(depth):  # |A_:d ∩ B_:d| grows by the items that are now in both prefixes
        x, y = ranked_a[d], ranked_b[d]
        seen_a.add(x)
        both += x in seen_b
        seen_b.add(y)
        both += y in seen_a  # x == y counts once: x was checked before y joined seen_b
        total += (1 - p) * p**d * both / (d + 1)
    return float(total)
