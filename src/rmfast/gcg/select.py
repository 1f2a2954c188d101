"""How GCG turns a token gradient into substitutions: rmfast's rule and the study's fork of nanoGCG.

The original study ran a fork of nanoGCG (github.com/thompsonj/nanoGCG, "FasterGCG" commit) with
three differences from nanoGCG, each reproduced here as an option of :class:`rmfast.gcg.GCGConfig`
(all off by default):

* an embedding-distance penalty (:func:`distance_penalty`): the score of putting token v at
  position p is the loss gradient plus ``w * ||E[cur_p] - E[v]||_2`` (``E``: the embedding weight
  rows, unscaled; the fork's w is 4.5), so swaps to far-away tokens, for which the linear
  gradient estimate is poor, are penalised;
* a deterministic candidate set (:func:`greedy_pairs`): the ``search_width`` best (position, token)
  pairs over the whole (L, V) matrix, one swap each, instead of random draws from per-position top-k
  lists; pairs already evaluated are skipped and the list is walked further down to fill the width;
* its loss: the squared error to a target of 30 (:data:`AUTHORS_TARGET`), whose gradient the fork
  takes with the target +30 in BOTH directions (:func:`loss_gradient` with ``compat="authors"``):
  when minimizing, the gradient still proposes the tokens that RAISE the reward (the sign bug),
  and only the evaluation (squared error to -30) pulls the other way. What the fork keeps is the
  candidate of least loss (``loss.argmin()``, its buffer the least losses): the reward closest to
  +30 (maximize) or -30 (minimize), not the largest or smallest (:func:`objective`).

Lower selection scores are better throughout (they estimate the change of the loss).
"""

from __future__ import annotations

import torch

AUTHORS_TARGET = 30.0  # the fork's squared-error target ("cap")
AUTHORS_PENALTY = 4.5  # the fork's distance weight w ("FasterGCG paper uses 4 or 5")


def loss_gradient(g: torch.Tensor, reward: float, sign: float, compat: str | None = None) -> torch.Tensor:
    """(L, V) gradient of the loss the search lowers, from ``g`` = d reward / d one-hot (L, V).

    rmfast: the loss is ``-sign * reward`` (sign +1 maximize, -1 minimize). ``compat="authors"``: the
    fork's ``(reward - 30)**2``, whose gradient is ``2 (reward - 30) g`` whatever the direction.

    Example:
        >>> g = torch.tensor([[1.0, -2.0]])
        >>> loss_gradient(g, 0.5, -1.0).tolist()  # minimize: lowering the loss lowers the reward
        [[1.0, -2.0]]
        >>> loss_gradient(g, 0.5, -1.0, "authors").tolist()  # 2 * (0.5 - 30) * g, as when maximizing
        [[-59.0, 118.0]]
    """
    if compat == "authors":
        return 2.0 * (reward - AUTHORS_TARGET) * g
    return -sign * g


def objective(score, sign: float, compat: str | None = None):
    """What the search keeps the most of, for a score (a float or a tensor of them): ``sign * score`` (rmfast:
    the largest reward, or the smallest); ``compat="authors"``: the fork's ``-(score - sign * 30)**2``, the
    candidate closest to +30 or -30 (its ``loss.argmin()``). The two agree while every reward stays inside
    (-30, 30); past it the fork keeps a reward of 30.1 over one of 35.

    Example:
        >>> objective(35.0, 1.0) > objective(30.1, 1.0), objective(35.0, 1.0, "authors") > objective(30.1, 1.0, "authors")
        (True, False)
        >>> objective(-2.0, -1.0, "authors") > objective(1.0, -1.0, "authors")  # minimize: closer to -30
        True
    """
    if compat == "authors":
        return -((score - sign * AUTHORS_TARGET) ** 2)
    return sign * score


def distance_penalty(W: torch.Tensor, cur: torch.Tensor, w: float) -> torch.Tensor:
    """(L, V) fp32: ``w * ||W[cur[p]] - W[v]||_2`` for every position p and token v (W: (V, D) embedding weight).

    Example:
        >>> W = torch.tensor([[0.0, 0.0], [3.0, 4.0], [3.0, 0.0]])
        >>> distance_penalty(W, torch.tensor([1]), 2.0).tolist()
        [[10.0, 0.0, 8.0]]
    """
    E = W.float()
    return w * torch.cdist(E[cur.to(E.device)][None], E[None])[0]  # (L, V)


def greedy_pairs(scores: torch.Tensor, allowed: torch.Tensor, cur: torch.Tensor):
    """(position, token) pairs by ascending ``scores`` (L, V), skipping tokens not ``allowed`` (V,)
    and the current token of each position; ties in flattened (position-major) order. A generator:
    the caller takes pairs until it has ``search_width`` new candidates.

    Example:
        >>> s = torch.tensor([[0.5, -1.0, 0.0], [-2.0, 3.0, -0.5]])
        >>> list(greedy_pairs(s, torch.tensor([True, True, False]), torch.tensor([1, 1])))
        [(1, 0), (0, 0)]
    """
    L, V = scores.shape
    masked = scores.float().masked_fill(~allowed[None, :V], float("inf"))
    masked[torch.arange(L), cur] = float("inf")  # the identity swap is the current sequence
    flat = masked.flatten()
    for i in torch.argsort(flat, stable=True).tolist():
        if flat[i] == float("inf"):
            return
        yield divmod(i, V)
