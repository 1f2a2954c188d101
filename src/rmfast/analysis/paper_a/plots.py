"""Figures of the papers' own statistics (``rmfast reproduce``): rank-gap bars (paper A Fig.
5B/A7), Kendall tau heatmaps (Fig. A5, and a grid of small ones for Fig. A6) and p-value
significance heatmaps.

Built on :mod:`..render.plots` (Agg canvas, no pyplot state, :func:`~..render.plots.new_figure`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..render.plots import SIG_LEVELS, new_figure, significance, wrap

_SIG_COLORS = ["#F0F0F0", "#C6DBEF", "#6BAED6", "#08519C"]  # ns, *, **, ***: one blue ramp


#: Okabe–Ito colours of the two gap directions (colour-blind safe).
GAP_COLOURS = {"humans rank higher": "#0072B2", "models rank higher": "#E69F00"}


def rank_gap_bars(diffs: pd.DataFrame, prompts: list[str], title: str, n_items: int | None = None):
    """Per prompt: the items humans rank most above the models (top) and below (bottom),
    bars of model rank − human rank (``human_comparison(...).differences``), with a key."""
    from matplotlib.patches import Patch

    from matplotlib.ticker import MaxNLocator

    width = min(11.0, 3.6 * len(prompts) + 0.6)  # 11 in: the widest figure the index shows whole
    fig = new_figure(width, 8.0)
    axes = fig.subplots(1, len(prompts), squeeze=False)[0]
    for ax, p in zip(axes, prompts):
        sub = diffs[diffs["prompt"] == p]
        up = sub[sub["direction"] == "humans rank higher"].sort_values("position")
        dn = sub[sub["direction"] == "models rank higher"].sort_values("position",
                                                                       ascending=False)
        rows = pd.concat([up, dn])
        y = np.arange(len(rows))[::-1]
        ax.barh(y, rows["rank_diff"], color=[GAP_COLOURS[d] for d in rows["direction"]])
        ax.set_yticks(y, [wrap(t, 28) for t in rows["text"]], fontsize=8)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel("model rank − human rank\n(ranks among "
                      + (f"{n_items:,} items)" if n_items else "the items)"), fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(3))
        ax.set_title(wrap(p, 36), fontsize=9)
    fig.legend(handles=[Patch(color=c, label=f"{d}: the {'largest' if d.startswith('humans') else 'smallest'}"
                              " model rank − human rank") for d, c in GAP_COLOURS.items()],
               loc="outside lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle(wrap(title, int(width * 11)), fontsize=11)
    return fig


def tau_heatmap(mat: pd.DataFrame, colours: dict[str, str], title: str, n_items: int):
    """One prompt's Kendall tau-b matrix (paper A Fig. A5): readable cells, a labelled colour
    bar; the diagonal (1 by definition) left blank."""
    m = mat.to_numpy(dtype="float64").copy()  # (k, k)
    np.fill_diagonal(m, np.nan)
    k = len(mat)
    fig = new_figure(0.62 * k + 3.2, 0.55 * k + 2.4)
    ax = fig.subplots()
    im = ax.imshow(m, vmin=0.0, vmax=1.0, cmap="viridis")
    for (i, j), v in np.ndenumerate(m):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=9,
                    color="black" if v > 0.6 else "white")
    labels = list(mat.index)
    ax.set_xticks(range(k), labels, rotation=45, ha="right", fontsize=9)
    ax.set_yticks(range(k), labels, fontsize=9)
    for t in (*ax.get_xticklabels(), *ax.get_yticklabels()):
        t.set_color(colours.get(t.get_text(), "black"))
    fig.colorbar(im, ax=ax, shrink=0.8, label=f"Kendall τ-b over {n_items:,} items (diagonal: 1)")
    ax.set_title(wrap(title, 70), fontsize=10)
    return fig


def heatmap_grid(matrices: dict[str, pd.DataFrame], title: str, ncols: int = 2,
                 vmin: float = 0.0, vmax: float = 1.0):
    """Small annotated heatmaps, one per key (e.g. one prompt × prompt matrix per model)."""
    n = len(matrices)
    nrows = int(np.ceil(n / ncols))
    fig = new_figure(3.2 * ncols + 0.8, (2.9 if ncols <= 3 else 2.4) * nrows + 1.0)
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
    width = min(11.0, 3.2 * ncols + 0.8)
    fig.suptitle(wrap(title, int(width * 12)), fontsize=10)
    return fig


def pvalue_heatmap(pvalues: pd.DataFrame, title: str, n_items: int | None = None):
    """Significance level (ns, *, **, ***) of each pair of a p-value matrix: the lower triangle
    (each pair once, no diagonal), a colour key, the p in every cell."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    p = pvalues.to_numpy(dtype="float64")  # (k, k)
    n = len(pvalues)
    names = ["ns"] + [s for _, s in SIG_LEVELS][::-1]  # ns, *, **, ***
    level = np.full(p.shape, np.nan)
    for i in range(n):
        for j in range(i):
            level[i, j] = names.index(significance(p[i, j]))
    fig = new_figure(0.6 * n + 3.6, 0.55 * n + 2.4)
    ax = fig.subplots()
    # rows 2..n × columns 1..n−1: the strict lower triangle without an empty first row / last column
    ax.imshow(level[1:, :-1], cmap=ListedColormap(_SIG_COLORS), vmin=-0.5, vmax=3.5)
    for i in range(1, n):
        for j in range(i):
            ax.text(j, i - 1, f"{significance(p[i, j])}\n{p[i, j]:.0e}" if p[i, j] > 0 else
                    f"{significance(p[i, j])}\n< 1e-300", ha="center", va="center", fontsize=7,
                    color="white" if level[i, j] >= 2 else "black")
    ax.set_xticks(range(n - 1), list(pvalues.columns)[:-1], rotation=45, ha="right", fontsize=9)
    ax.set_yticks(range(n - 1), list(pvalues.index)[1:], fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.legend(handles=[Patch(color=c, label=lab) for c, lab in zip(_SIG_COLORS, (
        "ns: p ≥ 0.05", "*: p < 0.05", "**: p < 0.01", "***: p < 0.001"))],
        loc="outside right upper", fontsize=9, title="Kendall p (two-sided)"
        + (f"\nn = {n_items:,} items" if n_items else ""), title_fontsize=9)
    ax.set_title(wrap(title, 70), fontsize=10)
    return fig
