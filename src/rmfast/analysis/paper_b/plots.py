"""Paper B's figures as ``rmfast reproduce`` draws them: Fig. 1 / 1b (median ranks by base model,
with the paper's test marked), Fig. 4a (one training run over checkpoints) and Fig. 4b (the
data-size ablation at the final checkpoint).

Colours are the Okabe–Ito colour-blind-safe pair (Gemma vermillion, Llama blue), and every
figure has a title naming what it shows, axes with units and a key. Built on :mod:`..render.plots`
(Agg canvas, no pyplot state).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..render.plots import new_figure, significance, wrap

#: Okabe–Ito colours per base model (distinct under the common colour-vision deficiencies).
BASE_COLOURS = {"Gemma": "#D55E00", "Llama": "#0072B2", "Qwen": "#009E73"}
BASE_MARKERS = {"Gemma": "o", "Llama": "s", "Qwen": "^"}


def _colour(base: str, i: int) -> str:
    return BASE_COLOURS.get(base, ["#CC79A7", "#E69F00", "#56B4E9"][i % 3])


def _rows_per_panel(med: pd.DataFrame) -> str:
    """n of the paper's test: the model × prompt rows per framing × category panel (a range when they differ)."""
    n = med.groupby(["framing", "category"]).size()
    return f"{n.min():,}" if n.min() == n.max() else f"{n.min():,}–{n.max():,}"


def _row_limits(med: pd.DataFrame, framing: str) -> tuple[float, float, float]:
    """One y-range for a framing row (the paper shares it within a row): (top, bottom, the
    y of the p-value bracket above the data). Ranks are drawn inverted: top < bottom."""
    v = med.loc[med["framing"] == framing, "median_rank"].to_numpy(dtype="float64")
    lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
    span = max(hi - lo, 1.0)
    return lo - 0.24 * span, hi + 0.05 * span, lo - 0.06 * span


def fig1_figure(med: pd.DataFrame, tests: pd.DataFrame, *, fig_id: str, dictionary: str,
                n_words: int | None = None):
    """Fig. 1 / 1b: per framing (rows) × category (columns), each model × prompt median rank
    (dots), each model's mean over prompts (rings) and the group mean ± SE (diamonds); the
    paper's Bonferroni-corrected test per panel as a bracket with stars and p.

    ``tests``: the paper's permutation table (framing, category, p_bonferroni, correction).
    """
    from matplotlib.lines import Line2D

    cats = sorted(med["category"].unique())
    groups = sorted(med["group"].unique())
    framings = [f for f in ("positive", "negative") if f in set(med["framing"])]
    width = min(11.0, max(8.5, 2.2 * len(cats) + 1.2))  # 11 in: the report's widest figure
    fig = new_figure(width, 3.3 * len(framings) + 2.0)
    axes = fig.subplots(len(framings), len(cats), squeeze=False)
    p = tests.set_index(["framing", "category"])["p_bonferroni"] if len(tests) else pd.Series()
    for i, fr in enumerate(framings):
        top, bottom, mark = _row_limits(med, fr)
        for j, cat in enumerate(cats):
            ax = axes[i, j]
            sub = med[(med["framing"] == fr) & (med["category"] == cat)]
            for x, base in enumerate(groups):
                c = _colour(base, x)
                vals = sub.loc[sub["group"] == base, "median_rank"].to_numpy()
                jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(vals))
                ax.scatter(x + jitter, vals, s=5, alpha=0.3, color=c, linewidths=0)
                per_model = sub[sub["group"] == base].groupby("model")["median_rank"].mean()
                ax.scatter(np.full(len(per_model), x + 0.3), per_model, s=22, marker="o",
                           facecolors="none", edgecolors=c, linewidths=1.2)
                if len(vals):
                    se = vals.std(ddof=1) / np.sqrt(len(vals)) if len(vals) > 1 else 0.0
                    ax.errorbar(x, vals.mean(), yerr=se, fmt="D", color="black", ms=5, capsize=3)
            ax.set_xticks(range(len(groups)), groups, fontsize=10)
            ax.set_xlim(-0.5, len(groups) - 0.5)
            ax.set_ylim(bottom, top)  # inverted: rank 1 (best) at the top
            ax.tick_params(labelsize=9)
            ax.set_title(f"{cat}, {fr}" if len(cats) > 3 else f"{cat}, {fr} prompts", fontsize=10)
            if (fr, cat) in p.index and len(groups) == 2:
                pv, tick = float(p[(fr, cat)]), 0.25 * (mark - top)
                ax.plot([0, 0, 1, 1], [mark + tick, mark, mark, mark + tick], color="black", lw=0.8)
                ax.text(0.5, mark - 0.1 * tick, f"{significance(pv)}  p(Bonf.) = {pv:.2g}", ha="center",
                        va="bottom", fontsize=9 if len(cats) <= 3 else 8)
            if j == 0:
                ax.set_ylabel(f"{fr} prompts: median rank\nof the category's words (1 = best"
                              + (f" of {n_words:,})" if n_words else ")"), fontsize=9)
    corr = tests["correction"].iloc[0] if "correction" in tests and len(tests) else "Bonferroni"
    fig.suptitle(wrap(f"Paper B Fig. {fig_id}: {dictionary} words ranked by ten reward models, "
                      "by base model (lower rank = preferred)", int(width * 9)), fontsize=12)
    handles = [Line2D([], [], ls="", marker="o", ms=4, color=_colour(g, k), alpha=0.6,
                      label=f"{g}: one model × prompt (median over its words)")
               for k, g in enumerate(groups)]
    handles += [
        Line2D([], [], ls="", marker="o", ms=6, mfc="none", mec="grey",
               label="one model: mean over prompts of those medians"),
        Line2D([], [], ls="", marker="D", ms=5, color="black",
               label="group: mean of the model × prompt medians ± SE over those rows (the paper's; "
                     "over models: 2-4.5x wider)"),
        Line2D([], [], ls="-", color="black", lw=0.8,
               label=f"paper's test: Welch t of {' − '.join(groups[::-1])} over the "
               f"{_rows_per_panel(med)} model × prompt rows per panel, {corr} "
               "(*** p < .001, ** < .01, * < .05)"),
    ]
    fig.legend(handles=handles, loc="outside lower center", fontsize=9,
               ncol=2 if len(cats) > 3 else 1, frameon=False)
    return fig


def fig4a_figure(cat: pd.DataFrame, run: str, label: str, n_ranked: int):
    """Fig. 4a: one training run, each category's median rank over checkpoints, per base model."""
    sub = cat[(cat["run"] == run) & cat["base"].isin(["Gemma", "Llama"])]
    cats = sorted(sub["category"].unique())
    fig = new_figure(9.0, 4.2)
    axes = fig.subplots(1, len(cats), squeeze=False, sharey=True)[0]
    for ax, c in zip(axes, cats):
        for k, base in enumerate(["Gemma", "Llama"]):
            s = sub[(sub["category"] == c) & (sub["base"] == base)].sort_values("step")
            ax.plot(s["step"], s["median_rank"], marker=BASE_MARKERS[base], ms=5,
                    color=_colour(base, k), label=f"{base} RM", lw=1.8)
        ax.set_title(f"{c} words", fontsize=11)
        ax.set_xlabel("training step (checkpoint)", fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
    axes[0].invert_yaxis()
    axes[0].set_ylabel(f"median rank of the category's words\n(1 = best of {n_ranked:,})",
                       fontsize=10)
    axes[-1].legend(fontsize=10, title="base model", title_fontsize=10)
    fig.suptitle(f"Paper B Fig. 4a: reward models trained from Gemma and Llama on the same "
                 f"data\n({label}); lower rank = preferred", fontsize=11)
    return fig


def fig4b_figure(final: pd.DataFrame, same: dict[str, str], n_ranked: int):
    """Fig. 4b: the final checkpoint of each distinct run, median rank by preference-data size.

    ``final``: one row per run (run, data_size, method, <Category>_<Base> columns, same_as);
    ``same``: run → the run whose file it repeats (drawn once, named on the figure).
    """
    distinct = final[final["same_as"].isna()].sort_values("data_size")
    cats = sorted({c.rsplit("_", 1)[0] for c in final.columns
                   if c.endswith(("_Gemma", "_Llama"))})
    fig = new_figure(9.5, 4.6)
    axes = fig.subplots(1, len(cats), squeeze=False, sharey=True)[0]
    bt = distinct[distinct["method"] == "BT"]
    other = distinct[distinct["method"] != "BT"]
    twins = {b: [a for a, x in same.items() if x == b] for b in set(same.values())}
    for ax, c in zip(axes, cats):
        for k, base in enumerate(["Gemma", "Llama"]):
            col, colour = f"{c}_{base}", _colour(base, k)
            for src, ls in (("uf", "-"), ("skywork", "--")):
                s = bt[bt["data_source"] == src]
                if len(s):
                    ax.plot(s["data_size"], s[col], ls=ls, marker=BASE_MARKERS[base], ms=6,
                            color=colour, lw=1.6)
            ax.scatter(other["data_size"], other[col], marker="*", s=120, color=colour,
                       edgecolors="black", linewidths=0.5, zorder=3)
        for r in distinct.itertuples():
            name = "=".join([r.run, *twins.get(r.run, [])])
            ax.annotate(name, (r.data_size, min(getattr(r, f"{c}_Gemma"), getattr(r, f"{c}_Llama"))),
                        textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        sizes = sorted(distinct["data_size"].dropna().unique())
        ax.set_xticks(sizes, [f"{v:g}k" for v in sizes], rotation=45)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(min(sizes) / 1.6, max(sizes) * 1.6)
        ax.set_xlabel("preference pairs (thousands, log scale)", fontsize=10)
        ax.margins(y=0.15)  # room for the run labels above the points
        ax.set_title(f"{c} words", fontsize=11)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
    axes[0].invert_yaxis()
    axes[0].set_ylabel(f"median rank at the final checkpoint\n(1 = best of {n_ranked:,})",
                       fontsize=10)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=_colour(b, k), marker=BASE_MARKERS[b], label=f"{b} RM")
               for k, b in enumerate(["Gemma", "Llama"])]
    handles += [Line2D([], [], color="grey", ls="-", label="UltraFeedback subsets (BT)"),
                Line2D([], [], color="grey", ls="", marker="o", label="Skywork (BT), one run"),
                Line2D([], [], color="grey", ls="", marker="*", ms=10,
                       label="GRM (UltraFeedback + Skywork), one checkpoint")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    dup = "; ".join(f"{a} is the same file as {b} (drawn once, at {b}'s size)"
                    for a, b in same.items())
    fig.suptitle("Paper B Fig. 4b: data-size ablation, final checkpoints; lower = preferred"
                 + (f"\npublished duplicates: {dup}" if dup else ""), fontsize=11)
    return fig


__all__ = ["BASE_COLOURS", "fig1_figure", "fig4a_figure", "fig4b_figure"]
