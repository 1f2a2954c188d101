"""Figures of the papers' own statistics (``rmfast reproduce``): rank-gap bars (paper A Fig.
5B/A7), a grid of small heatmaps (Fig. A6) and p-value significance heatmaps.

Built on :mod:`.plots` (Agg canvas, no pyplot state, :func:`~.plots.new_figure`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .plots import new_figure, wrap

#: Significance levels of the p-value heatmaps (paper A's analysis_support.pvalue_subplot).
SIG_LEVELS = [(0.001, "***"), (0.01, "**"), (0.05, "*")]
_SIG_COLORS = ["#91BFDB", "#4575B4", "#D73027", "#A50026"]  # ns, *, **, ***


def significance(p: float) -> str:
    """Stars for a p-value: *** < 0.001, ** < 0.01, * < 0.05, else "ns".

    >>> [significance(p) for p in (0.0, 0.0009, 0.005, 0.04, 0.05)]
    ['***', '***', '**', '*', 'ns']
    """
    for cut, stars in SIG_LEVELS:
        if p < cut:
            return stars
    return "ns"


def rank_gap_bars(diffs: pd.DataFrame, prompts: list[str], title: str):
    """Per prompt: the items humans rank most above the models (top) and below (bottom),
    bars of model rank − human rank (``human_comparison(...).differences``)."""
    fig = new_figure(4.2 * len(prompts) + 0.6, 7.5)
    axes = fig.subplots(1, len(prompts), squeeze=False)[0]
    for ax, p in zip(axes, prompts):
        sub = diffs[diffs["prompt"] == p]
        up = sub[sub["direction"] == "humans rank higher"].sort_values("position")
        dn = sub[sub["direction"] == "models rank higher"].sort_values("position",
                                                                       ascending=False)
        rows = pd.concat([up, dn])
        y = np.arange(len(rows))[::-1]
        colors = ["#1b7837" if v > 0 else "#762a83" for v in rows["rank_diff"]]
        ax.barh(y, rows["rank_diff"], color=colors)
        ax.set_yticks(y, [wrap(t, 28) for t in rows["text"]], fontsize=7)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel("model rank − human rank", fontsize=8)
        ax.set_title(wrap(p, 44), fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def heatmap_grid(matrices: dict[str, pd.DataFrame], title: str, ncols: int = 2,
                 vmin: float = 0.0, vmax: float = 1.0):
    """Small annotated heatmaps, one per key (e.g. one prompt × prompt matrix per model)."""
    n = len(matrices)
    nrows = int(np.ceil(n / ncols))
    fig = new_figure(3.2 * ncols + 0.8, 2.9 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    im = None
    for ax, (name, mat) in zip(axes, matrices.items()):
        im = ax.imshow(mat.to_numpy(dtype="float64"), vmin=vmin, vmax=vmax, cmap="viridis")
        ax.set_xticks(range(mat.shape[1]), list(mat.columns), fontsize=7)
        ax.set_yticks(range(mat.shape[0]), list(mat.index), fontsize=7)
        for (i, j), v in np.ndenumerate(mat.to_numpy(dtype="float64")):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if v > 0.7 else "white")
        ax.set_title(name, fontsize=9)
    for ax in axes[n:]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=list(axes[:n]), shrink=0.6, label="Kendall tau-b")
    fig.suptitle(title, fontsize=10)
    return fig


def pvalue_heatmap(pvalues: pd.DataFrame, title: str):
    """Significance category (ns, *, **, ***) of each cell of a p-value matrix."""
    from matplotlib.colors import ListedColormap

    p = pvalues.to_numpy(dtype="float64")
    level = np.vectorize(lambda v: [s for _, s in SIG_LEVELS][::-1].index(significance(v)) + 1
                         if significance(v) != "ns" else 0)(p)
    n = len(pvalues)
    fig = new_figure(0.55 * n + 2.5, 0.5 * n + 1.6)
    ax = fig.subplots()
    ax.imshow(level, cmap=ListedColormap(_SIG_COLORS), vmin=0, vmax=3)
    for (i, j), v in np.ndenumerate(p):
        ax.text(j, i, significance(v), ha="center", va="center", fontsize=6, color="white")
    ax.set_xticks(range(n), list(pvalues.columns), rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(n), list(pvalues.index), fontsize=7)
    ax.set_title(wrap(title, 70), fontsize=9)
    return fig
