"""Figures for the analyses (matplotlib, Agg canvas, no pyplot state).

Every function returns a :class:`matplotlib.figure.Figure`; :func:`to_png` renders it.
Models keep one colour throughout a report: hues by base family (Gemma blues, Llama
oranges, others greens/purples), shades within a family, models ordered by leaderboard
rank when metadata gives one.
"""

from __future__ import annotations

import io
import re
import textwrap
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..data import deps
from ..data.metadata import model_families, model_labels, model_order

_FAMILY_MAPS = {"Gemma": "Blues", "Llama": "Oranges", "Qwen": "Greens", "Mistral": "Purples"}
_OTHER_MAPS = ["Greens", "Purples", "Greys", "RdPu", "YlGn"]
MAX_POINTS = 20_000  # per violin / scatter panel; larger sets are subsampled (seeded)
#: PNG resolution (:func:`to_png`) and the widest figure (inches): 11 in × 110 dpi = 1,210 px, so
#: every figure fits the report's 1,280 px column (and a 1,280-1,400 px window) unscaled.
PNG_DPI = 110
MAX_WIDTH_IN = 11.0


def _mpl():
    deps.require("matplotlib", "plotting")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def new_figure(w: float, h: float):
    """A constrained-layout Figure on an Agg canvas, at most :data:`MAX_WIDTH_IN` wide."""
    Figure, Canvas = _mpl()
    fig = Figure(figsize=(min(w, MAX_WIDTH_IN), h), dpi=100, layout="constrained")
    Canvas(fig)
    return fig


def to_png(fig, dpi: int = PNG_DPI) -> bytes:
    """PNG bytes of a figure.

    Token labels hold characters the plotting font lacks (CJK, emoji); matplotlib warns once per
    character, a screenful for a vocabulary's tokens. They are drawn as boxes either way, so the
    warnings become one line naming the characters; any other warning passes through as it is.
    """
    buf = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(buf, format="png", dpi=dpi)
    missing = []
    for w in caught:
        m = _GLYPH.match(str(w.message))
        if m is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif m.group(1) not in missing:
            missing.append(m.group(1))
    if missing:
        shown = " ".join(chr(int(c)) for c in missing[:12]) + (" ..." if len(missing) > 12 else "")
        warnings.warn(f"rmfast: {len(missing)} character(s) of the figure's labels are not in its font and are drawn "
                      f"as boxes: {shown}", UserWarning, stacklevel=2)
    return buf.getvalue()


#: matplotlib's warning for a character its font lacks: "Glyph 20516 (\\N{...}) missing from font(s) DejaVu Sans."
_GLYPH = re.compile(r"Glyph (\d+) .*missing from (?:current )?font")


def wrap(text: str, width: int = 48) -> str:
    """Wrap a long label (prompts) onto several lines."""
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)

#: Significance levels of the papers' p-value marks (paper A's analysis_support.pvalue_subplot).
SIG_LEVELS = [(0.001, "***"), (0.01, "**"), (0.05, "*")]


def significance(p: float) -> str:
    """Stars for a p-value: *** < 0.001, ** < 0.01, * < 0.05, else "ns".

    >>> [significance(p) for p in (0.0, 0.0009, 0.005, 0.04, 0.05)]
    ['***', '***', '**', '*', 'ns']
    """
    for cut, stars in SIG_LEVELS:
        if p < cut:
            return stars
    return "ns"


@dataclass
class Styles:
    """Display order, label and colour per model."""

    order: list[str]
    label: dict[str, str]
    color: dict[str, tuple]
    family: dict[str, str]

    @classmethod
    def build(cls, models, meta: pd.DataFrame | None = None) -> "Styles":
        """Styles for ``models`` from optional metadata (see :mod:`..data.metadata`)."""
        import matplotlib

        order = model_order(models, meta)
        labels = model_labels(order, meta)
        fams = model_families(order, meta)
        colors = {}
        fam_names = list(dict.fromkeys(fams[m] for m in order))
        others = iter(_OTHER_MAPS)
        for fam in fam_names:
            members = [m for m in order if fams[m] == fam]
            cmap_name = _FAMILY_MAPS.get(fam) or next(others, "Greys")
            cmap = matplotlib.colormaps[cmap_name]
            shades = np.linspace(0.95, 0.55, len(members)) if len(members) > 1 else [0.7]
            for m, s in zip(members, shades):
                colors[m] = cmap(float(s))
        return cls(order=order, label=labels, color=colors, family=fams)

    def legend_handles(self):
        """One patch per family (for figure legends)."""
        from matplotlib.patches import Patch

        fams = list(dict.fromkeys(self.family[m] for m in self.order))
        out = []
        for f in fams:
            first = next(m for m in self.order if self.family[m] == f)
            out.append(Patch(color=self.color[first], label=f"{f}-based"))
        return out


def _sample(x: np.ndarray, n: int = MAX_POINTS, seed: int = 0) -> np.ndarray:
    if len(x) <= n:
        return x
    return np.random.default_rng(seed).choice(x, n, replace=False)


# ------------------------------------------------------------------ distributions
def violins(scans: pd.DataFrame, styles: Styles, standardize: bool = False):
    """Violin plot of scores per model, one panel per prompt (papers' Figure 1)."""
    prompts = list(pd.unique(scans["prompt"]))
    fig = new_figure(max(7.0, 0.75 * len(styles.order) + 2), 3.2 * len(prompts) + 0.6)
    axes = fig.subplots(len(prompts), 1, squeeze=False)[:, 0]
    for ax, p in zip(axes, prompts):
        sub = scans[scans["prompt"] == p]
        ms = [m for m in styles.order if m in set(sub["model"])]
        data = []
        for m in ms:
            x = sub.loc[sub["model"] == m, "score"].to_numpy(dtype="float64")
            if standardize and x.std() > 0:
                x = (x - x.mean()) / x.std()
            data.append(_sample(x))
        parts = ax.violinplot(data, showmedians=True, showextrema=True, widths=0.8)
        for body, m in zip(parts["bodies"], ms):
            body.set_facecolor(styles.color[m])
            body.set_edgecolor("black")
            body.set_linewidth(0.5)
            body.set_alpha(0.85)
        for key in ("cmedians", "cmins", "cmaxes", "cbars"):
            parts[key].set_color("black")
            parts[key].set_linewidth(0.7)
        ax.set_xticks(np.arange(1, len(ms) + 1), [styles.label[m] for m in ms], rotation=30,
                      ha="right", fontsize=9)
        ax.set_ylabel("score (z)" if standardize else "score")
        ax.set_title(wrap(p, 90), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.legend(handles=styles.legend_handles(), loc="outside upper right", fontsize=8,
               ncols=len(styles.legend_handles()))
    return fig


# ------------------------------------------------------------------ agreement
def heatmap(matrix: pd.DataFrame, styles: Styles, title: str, vmin: float = -1.0,
            vmax: float = 1.0, cmap: str = "RdBu_r", ax=None, row_labels: bool = True):
    """Annotated model × model matrix (papers' Figure 2A); draws into ``ax`` if given.
    ``row_labels=False`` leaves the rows unlabelled (a panel right of one with the same rows)."""
    ms = [m for m in styles.order if m in matrix.index]
    mat = matrix.loc[ms, ms].to_numpy(dtype="float64")
    n = len(ms)
    fig = None
    if ax is None:
        fig = new_figure(1.0 + 0.62 * n + 1.6, 0.8 + 0.55 * n + 1.2)
        ax = fig.subplots()
    im = ax.imshow(mat, vmin=vmin, vmax=vmax, cmap=cmap)
    labels = [styles.label[m] for m in ms]
    ax.set_xticks(range(n), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), labels if row_labels else [], fontsize=8)
    for t, m in zip(ax.get_xticklabels(), ms):
        t.set_color(_dark(styles.color[m]))
    for t, m in zip(ax.get_yticklabels(), ms):
        t.set_color(_dark(styles.color[m]))
    fs = 7 if n <= 10 else 5
    cm = im.get_cmap()
    for i in range(n):
        for j in range(n):
            v = mat[i, j]
            if not np.isfinite(v):
                continue
            r, g, b, _ = cm(im.norm(v))
            light = 0.299 * r + 0.587 * g + 0.114 * b > 0.55
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=fs,
                    color="black" if light else "white")
    # an inset colour bar: exactly as tall as the (square) matrix, whatever the layout gives it
    ax.figure.colorbar(im, cax=ax.inset_axes([1.03, 0.0, 0.045, 1.0]))
    ax.set_title(wrap(title, 60), fontsize=10)
    return fig if fig is not None else ax


def agreement_panel(result, prompt: str, styles: Styles):
    """Kendall tau-b, Spearman and RBO heatmaps plus the MDS map of one prompt (2 × 2);
    one row of three heatmaps when the prompt has no MDS (fewer than 3 models)."""
    n = len(result.matrix("kendall_tau_b", prompt))
    sub = result.mds[result.mds["prompt"] == prompt]
    if len(sub):  # two rows as subfigures: the MDS map's margins do not follow a heatmap's
        fig = new_figure(MAX_WIDTH_IN, 2 * (0.25 * n + 3.0) + 0.6)
        axes = [ax for row in fig.subfigures(2, 1) for ax in row.subplots(1, 2)]
    else:
        fig = new_figure(MAX_WIDTH_IN, 0.25 * n + 4.2)
        axes = fig.subplots(1, 3)
    heatmap(result.matrix("kendall_tau_b", prompt), styles, "Kendall tau-b", ax=axes[0])
    heatmap(result.matrix("spearman_rho", prompt), styles, "Spearman rho (rows as left)",
            ax=axes[1], row_labels=False)
    heatmap(result.matrix("rbo", prompt), styles, f"Rank-biased overlap (p = {result.rbo_p})",
            vmin=0.0, vmax=1.0, cmap="viridis", ax=axes[2], row_labels=bool(len(sub)))
    n_shared = int(result.pairs.loc[result.pairs["prompt"] == prompt, "n_shared"].iloc[0])
    fig.suptitle(f"{wrap(prompt, 100)}\n{n_shared:,} shared strings ({result.join} join)",
                 fontsize=11)
    if len(sub):  # last: its labels are placed on the finished layout
        mds_map(sub, styles, "MDS of 1 − Kendall tau", ax=axes[3])
    return fig


def _dark(color):
    r, g, b = color[:3]
    return (r * 0.75, g * 0.75, b * 0.75)


def mds_map(mds: pd.DataFrame, styles: Styles, title: str, ax=None):
    """2-D MDS of 1 − tau; points coloured by model, labelled (papers' Figure 2B).

    Labels are pushed apart from each other, from the points and from the legend
    (:func:`repel_labels`) on the figure's finished layout, which is then frozen: draw this
    panel last.
    """
    fig = None
    if ax is None:
        fig = new_figure(6.4, 5.4)
        ax = fig.subplots()
    ms = [m for m in styles.order if m in set(mds["model"])]
    pts = mds.set_index("model").loc[ms, ["x", "y"]].to_numpy(dtype="float64")
    span = np.ptp(pts, axis=0).max() or 1.0
    size = 90  # marker area, pt²
    for (x, y), m in zip(pts, ms):
        ax.scatter([x], [y], s=size, color=styles.color[m], edgecolor="black", zorder=3)
    pad = 0.35 * span
    ax.set_xlim(pts[:, 0].min() - pad, pts[:, 0].max() + pad)
    ax.set_ylim(pts[:, 1].min() - pad * 0.6, pts[:, 1].max() + pad * 0.6)
    ax.set_xlabel("MDS 1")
    ax.set_ylabel("MDS 2")
    stress = float(mds["stress1"].iloc[0]) if "stress1" in mds else np.nan
    ax.set_title(wrap(title, 60) + f" (stress-1 = {stress:.2f})", fontsize=10)
    ax.grid(alpha=0.3)
    legend = ax.legend(handles=styles.legend_handles(), fontsize=8, loc="best")
    _label_points(ax, pts, [styles.label[m] for m in ms], marker_pt=np.sqrt(size) / 2 + 1,
                  obstacles=[legend])
    return fig if fig is not None else ax


def _label_points(ax, pts: np.ndarray, labels: list[str], *, marker_pt: float, fontsize=8,
                  obstacles=()) -> None:
    """Annotate ``pts`` with ``labels``, placed by :func:`repel_labels` in display space."""
    fig = ax.figure.figure  # the root figure (ax.figure may be a subfigure)
    for _ in range(2):  # constrained layout settles over passes (subfigures, colour bars)
        fig.draw_without_rendering()
    fig.set_layout_engine("none")  # then freeze it: the labels are placed on these positions
    renderer = fig.canvas.get_renderer()
    px_per_pt = fig.dpi / 72.0
    probes = [ax.text(0, 0, t, fontsize=fontsize) for t in labels]
    sizes = np.array([[b.width, b.height] for b in (p.get_window_extent(renderer) for p in probes)])
    for p in probes:
        p.remove()
    xy = ax.transData.transform(pts)
    box = ax.get_window_extent(renderer)
    blocks = [o.get_window_extent(renderer) for o in obstacles]
    centers = repel_labels(xy, sizes, marker_pt * px_per_pt,
                           bounds=(box.x0 + 2, box.y0 + 2, box.x1 - 2, box.y1 - 2),
                           obstacles=[(b.x0, b.y0, b.x1, b.y1) for b in blocks])
    for (x, y), (cx, cy), (px, py), t in zip(pts, centers, xy, labels):
        ann = ax.annotate(t, (x, y), xytext=((cx - px) / px_per_pt, (cy - py) / px_per_pt),
                          textcoords="offset points", ha="center", va="center", fontsize=fontsize,
                          arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6,
                                      "shrinkA": 0, "shrinkB": marker_pt})
        ann.set_in_layout(False)  # placed inside the axes: the layout must not move for them


def repel_labels(points: np.ndarray, sizes: np.ndarray, radius: float, *, bounds=None,
                 obstacles=(), pad: float = 3.0, reach: int = 8) -> np.ndarray:
    """Label centres (display units) near their points, off every other label, every point's
    marker (a square of half-side ``radius``) and the ``obstacles`` ((x0, y0, x1, y1) boxes),
    inside ``bounds`` (x0, y0, x1, y1) when given. No dependency: labels are placed one at a
    time, most crowded first, each at the nearest of a grid of offsets (beside the point, left or
    right, up to three half-widths out; above or below it; up to ``reach`` label heights up or
    down) that overlaps nothing placed so far, or, failing that, at the one that overlaps least.

    >>> c = repel_labels(np.zeros((2, 2)), np.array([[20.0, 8], [20, 8]]), 4.0)
    >>> bool(abs(c[0, 1] - c[1, 1]) >= 8 or abs(c[0, 0] - c[1, 0]) >= 20)
    True
    """
    pts = np.asarray(points, dtype="float64").reshape(-1, 2)
    half = np.asarray(sizes, dtype="float64").reshape(-1, 2) / 2
    n = len(pts)
    blocks = [((x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2) for x0, y0, x1, y1 in obstacles]
    blocks += [(x, y, radius, radius) for x, y in pts]
    fixed = np.array(blocks, dtype="float64").reshape(-1, 4)
    d = np.hypot(*(pts[:, None, :] - pts[None, :, :]).transpose(2, 0, 1))
    crowd = (d < 2 * half[:, :1] + radius).sum(1)
    centers = np.zeros((n, 2))
    placed: list[tuple] = []
    for i in sorted(range(n), key=lambda k: (-crowd[k], k)):
        w, h = half[i]
        step = 2 * h + pad
        side = radius + pad + w
        xs = np.array([0.0] + [sgn * (side + m * w) for sgn in (1, -1) for m in range(3)])
        ys = np.arange(-2 * reach, 2 * reach + 1) * step / 2
        off = np.array([(x, y) for x in xs for y in ys])
        off = off[(off[:, 0] != 0) | (np.abs(off[:, 1]) >= radius + pad + h)]
        cand = pts[i] + off
        others = np.vstack([fixed, np.array(placed).reshape(-1, 4)])
        ox = np.clip(w + others[:, 2] + pad - np.abs(cand[:, :1] - others[:, 0]), 0, None)
        oy = np.clip(h + others[:, 3] + pad - np.abs(cand[:, 1:] - others[:, 1]), 0, None)
        cost = (ox * oy).sum(1)
        if bounds is not None:
            x0, y0, x1, y1 = bounds
            out_x = np.clip(x0 - (cand[:, 0] - w), 0, None) + np.clip(cand[:, 0] + w - x1, 0, None)
            out_y = np.clip(y0 - (cand[:, 1] - h), 0, None) + np.clip(cand[:, 1] + h - y1, 0, None)
            cost = cost + 10 * (out_x * 2 * h + out_y * 2 * w)
        best = np.lexsort((np.hypot(off[:, 0], off[:, 1]), np.round(cost, 6)))[0]
        centers[i] = cand[best]
        placed.append((*cand[best], w, h))
    return centers


def rsa_title(sides: str, tests: int) -> str:
    """The RSA figure's title: what its stars are (the p-values' sides, and that they are not corrected over the
    figure's tests: 11 of 15 had stars on EloEverything with collinear predictors, and the figure said neither).

    >>> rsa_title("one-sided (greater)", 15).splitlines()[1]
    '(* p<.05, ** p<.01, *** p<.001: permutation p, one-sided (greater), each of 15 tests uncorrected)'
    """
    return ("RSA: model agreement vs model metadata\n(* p<.05, ** p<.01, *** p<.001: permutation p, "
            f"{sides}, each of {tests} tests uncorrected)")


def rsa_bars(rsa: pd.DataFrame):
    """RSA correlation per metadata predictor (bars) per prompt, with permutation p-values."""
    prompts = list(pd.unique(rsa["prompt"]))
    preds = list(pd.unique(rsa["predictor"]))
    fig = new_figure(max(6.5, 1.3 * len(preds) + 2.5), 4.2)
    ax = fig.subplots()
    width = 0.8 / max(1, len(prompts))
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    for k, p in enumerate(prompts):
        sub = rsa[rsa["prompt"] == p].set_index("predictor").reindex(preds)
        x = np.arange(len(preds)) + (k - (len(prompts) - 1) / 2) * width
        ax.bar(x, sub["r"], width=width * 0.95, color=cmap(k / max(1, len(prompts) - 1) * 0.85),
               label=wrap(p, 60))
        for xi, r, pv in zip(x, sub["r"], sub["p_value"]):
            if np.isfinite(r):
                stars = "***" if pv < 0.001 else "**" if pv < 0.01 else "*" if pv < 0.05 else ""
                ax.text(xi, r + (0.02 if r >= 0 else -0.02), stars, ha="center",
                        va="bottom" if r >= 0 else "top", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(preds)), [p.replace("_", " ") for p in preds], fontsize=9)
    ax.set_ylabel("Spearman r (tau matrix vs predictor)")
    alt = str(rsa["alternative"].iloc[0]) if "alternative" in rsa and len(rsa) else "greater"
    sides = "two-sided" if alt == "two-sided" else f"one-sided ({alt})"
    ax.set_title(rsa_title(sides, int(rsa["r"].notna().sum())), fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center")
    ax.grid(axis="y", alpha=0.3)
    return fig


# ------------------------------------------------------------------ sentiment / exposure
def framing_plot(slopes: pd.DataFrame, styles: Styles):
    """Valence slopes by prompt framing × valence sign; dots = model × prompt, diamonds =
    mean ± SE over models (papers' Figure 3C)."""
    framings = [f for f in ("positive", "negative", "unknown") if f in set(slopes["framing"])]
    fig = new_figure(max(5.5, 3.2 * len(framings) + 1.8), 4.4)
    axes = fig.subplots(1, len(framings), squeeze=False, sharey=True)[0]
    for ax, fr in zip(axes, framings):
        sub = slopes[(slopes["framing"] == fr) & slopes["slope"].notna()]
        for k, sign in enumerate(("negative", "positive")):
            s = sub[sub["sign"] == sign]
            if s.empty:
                continue
            per_model = s.groupby("model")["slope"].mean()
            jitter = np.linspace(-0.18, 0.18, len(per_model)) if len(per_model) > 1 else [0]
            for (m, v), j in zip(per_model.items(), jitter):
                ax.scatter([k + j], [v], color=styles.color.get(m, "grey"), s=30,
                           edgecolor="black", linewidth=0.4, zorder=3)
            mean = per_model.mean()
            se = per_model.std(ddof=1) / np.sqrt(len(per_model)) if len(per_model) > 1 else 0
            ax.errorbar([k + 0.32], [mean], yerr=[se], fmt="D", color="black", ms=7,
                        capsize=4, zorder=4)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks([0, 1], ["negative\nwords", "positive\nwords"])
        ax.set_xlim(-0.5, 1.6)
        n_prompts = sub["prompt"].nunique()
        ax.set_title(f"{fr} prompts ({n_prompts})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    units = slopes["units"].iloc[0] if "units" in slopes and len(slopes) else "score"
    axes[0].set_ylabel(f"slope of score on AFINN valence\n[{units} per valence point]")
    fig.legend(handles=styles.legend_handles(), loc="outside lower center", fontsize=8,
               ncols=4)
    fig.suptitle("Framing: sensitivity to positive vs negative words "
                 "(dots: models; ◆ mean ± SE)", fontsize=10)
    return fig


def valence_scatter(tokens: pd.DataFrame, model: str, styles: Styles):
    """Score against AFINN valence for one model, one panel per prompt (Figure 3A/B)."""
    sub = tokens[tokens["model"] == model]
    prompts = list(pd.unique(sub["prompt"]))
    fig = new_figure(3.6 * len(prompts) + 0.6, 3.6)
    axes = fig.subplots(1, len(prompts), squeeze=False)[0]
    rng = np.random.default_rng(0)
    for ax, p in zip(axes, prompts):
        s = sub[sub["prompt"] == p]
        ax.scatter(s["valence"] + rng.uniform(-0.2, 0.2, len(s)), s["value"], s=6, alpha=0.4,
                   color=styles.color.get(model, "grey"), rasterized=True)
        for sign in (-1, 1):
            part = s[np.sign(s["valence"]) == sign]
            if part["valence"].nunique() > 1:
                b, a = np.polyfit(part["valence"], part["value"], 1)
                xs = np.array([part["valence"].min(), part["valence"].max()])
                ax.plot(xs, a + b * xs, color="black", lw=1.5)
        ax.set_xlabel("AFINN valence")
        ax.set_title(wrap(p, 40), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score (z)")
    fig.suptitle(styles.label.get(model, model), fontsize=10)
    return fig


def exposure_plot(slopes: pd.DataFrame, styles: Styles):
    """Frequency slope (± SE) per model, one column of dots per prompt (Figure 3D)."""
    prompts = list(pd.unique(slopes["prompt"]))
    ms = [m for m in styles.order if m in set(slopes["model"])]
    fig = new_figure(max(6.0, 2.2 * len(prompts) + 3.0), 4.6)
    ax = fig.subplots()
    offs = np.linspace(-0.3, 0.3, len(ms)) if len(ms) > 1 else [0.0]
    for k, p in enumerate(prompts):
        sub = slopes[slopes["prompt"] == p].set_index("model")
        for m, o in zip(ms, offs):
            if m in sub.index and np.isfinite(sub.loc[m, "slope_log_freq_per_sd"]):
                sd_scale = sub.loc[m, "slope_log_freq_per_sd"] / sub.loc[m, "slope_log_freq"] \
                    if sub.loc[m, "slope_log_freq"] else 1.0
                ax.errorbar([k + o], [sub.loc[m, "slope_log_freq_per_sd"]],
                            yerr=[abs(sub.loc[m, "se_log_freq"] * sd_scale)], fmt="o",
                            color=styles.color[m], ms=6, mec="black", mew=0.4, capsize=2,
                            label=styles.label[m] if k == 0 else None)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(prompts)), [wrap(p, 28) for p in prompts], fontsize=8)
    units = slopes["units"].iloc[0] if len(slopes) else "score"
    ax.set_ylabel(f"frequency slope ± SE\n[{units} per SD of ln frequency]")
    ax.set_title("Mere exposure: score ~ ln(frequency) + valence", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="outside right upper")
    ax.grid(axis="y", alpha=0.3)
    return fig


# ------------------------------------------------------------------ best vs worst
def best_worst_grid(scores: pd.DataFrame, styles: Styles, best: str, worst: str,
                    annotate: int = 2, units: str = "score"):
    """Best-prompt vs worst-prompt score per token, one panel per model (Figure 4)."""
    ms = [m for m in styles.order if m in set(scores["model"])]
    ncol = min(4, len(ms))
    nrow = int(np.ceil(len(ms) / ncol))
    fig = new_figure(2.65 * ncol + 0.4, 2.65 * nrow + 0.9)
    axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False)).ravel()
    for ax, m in zip(axes, ms):
        g = scores[scores["model"] == m]
        s = g if len(g) <= MAX_POINTS else g.sample(MAX_POINTS, random_state=0)
        ax.scatter(s["best"], s["worst"], s=2, alpha=0.4, color=styles.color[m], rasterized=True)
        span = np.array([np.ptp(g["best"]) or 1.0, np.ptp(g["worst"]) or 1.0])
        placed: list[np.ndarray] = []
        for col, asc in (("sum", False), ("sum", True), ("diff", False), ("diff", True)):
            n_done = 0
            for _, r in g.sort_values(col, ascending=asc).head(4 * annotate).iterrows():
                xy = np.array([r["best"], r["worst"]])
                if any((np.abs(xy - q) / span < [0.22, 0.07]).all() for q in placed):
                    continue
                placed.append(xy)
                ax.annotate(_short(r["text"]), tuple(xy), fontsize=6.5, xytext=(3, 2),
                            textcoords="offset points",
                            ha="right" if r["best"] > g["best"].median() else "left")
                ax.scatter([xy[0]], [xy[1]], s=8, color="black", zorder=3)
                n_done += 1
                if n_done >= annotate:
                    break
        ax.set_title(styles.label[m], fontsize=9, color=_dark(styles.color[m]))
        ax.grid(alpha=0.3)
    for ax in axes[len(ms):]:
        ax.set_visible(False)
    fig.supxlabel(f"{units}: {wrap(best, 70)}", fontsize=9)
    fig.supylabel(f"{units}: {wrap(worst, 40)}", fontsize=9)
    return fig


def _short(text: str, n: int = 14) -> str:
    t = repr(str(text))[1:-1]
    return t if len(t) <= n else t[: n - 1] + "…"


# ------------------------------------------------------------------ human comparison
def human_bars(corr: pd.DataFrame, styles: Styles):
    """Spearman rho with human scores per model, grouped by prompt."""
    prompts = list(pd.unique(corr["prompt"]))
    ms = [m for m in styles.order if m in set(corr["model"])]
    fig = new_figure(max(7.0, 0.5 * len(ms) * len(prompts) / 2 + 4), 4.2)
    ax = fig.subplots()
    width = 0.8 / max(1, len(ms))
    for j, m in enumerate(ms):
        sub = corr[corr["model"] == m].set_index("prompt").reindex(prompts)
        x = np.arange(len(prompts)) + (j - (len(ms) - 1) / 2) * width
        ax.bar(x, sub["spearman_rho"], width=width * 0.95, color=styles.color[m],
               edgecolor="black", linewidth=0.3, label=styles.label[m])
    ax.set_xticks(range(len(prompts)), [wrap(p, 36) for p in prompts], fontsize=8)
    ax.set_ylabel("Spearman rho with human score")
    ax.set_title("Agreement with human preferences", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="outside right upper")
    ax.grid(axis="y", alpha=0.3)
    return fig


def rank_trajectories(traj: pd.DataFrame, corr: pd.DataFrame, styles: Styles, prompt: str):
    """Human and model ranks of selected items (papers' Figure 5C), log rank axis."""
    import matplotlib

    sub = traj[traj["prompt"] == prompt]
    ms = [m for m in styles.order if m in set(sub["rater"])]
    raters = ["human"] + ms
    fig = new_figure(max(8.0, 0.85 * len(raters) + 4.5), 6.0)
    ax = fig.subplots()
    # colour-blind-safe hues: blue / orange / purple ramps (no red-green pair)
    cmaps = {"human top": "Blues", "human bottom": "Oranges", "model #1": "Purples"}
    for group, cmap_name in cmaps.items():
        items = list(dict.fromkeys(sub.loc[sub["group"] == group, "text"]))
        cmap = matplotlib.colormaps[cmap_name]
        for i, t in enumerate(items):
            c = cmap(0.9 - 0.5 * i / max(1, len(items) - 1))
            r = sub[sub["text"] == t].set_index("rater").reindex(raters)["rank"]
            hr = r.loc["human"]
            ax.plot(range(len(raters)), r.to_numpy(), "-o", color=c, ms=4, lw=1.5,
                    label=f"{_short(t, 26)} (#{hr:.0f})")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.invert_yaxis()
    rho = corr[corr["prompt"] == prompt].set_index("model")["spearman_rho"]
    ax.set_xticks(range(len(raters)), ["Human"] + [
        f"{styles.label[m]}\nρ={rho.get(m, np.nan):.2f}" for m in ms], rotation=40,
        ha="right", fontsize=8)
    ax.set_ylabel("rank (1 = best, log scale)")
    ax.set_title(wrap(prompt, 90) + "\nblue: human top 5 · orange: human bottom 5 · "
                 "purple: items some model ranks #1", fontsize=10)
    ax.grid(alpha=0.3, which="both", axis="y")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="outside right upper",
               title="item (#human rank)", title_fontsize=8)
    return fig


# ------------------------------------------------------------------ categories
def category_plot(medians: pd.DataFrame, styles: Styles, measure: str = "median_rank"):
    """Per category: each model's median rank (mean over prompts), grouped by model group;
    one panel per framing."""
    framings = list(pd.unique(medians["framing"]))
    cats = sorted(medians["category"].unique())
    groups = sorted(medians["group"].unique())
    fig = new_figure(max(6.0, 0.9 * len(cats) * len(framings) + 3.0), 4.8)
    axes = fig.subplots(1, len(framings), squeeze=False, sharey=True)[0]
    gw = 0.7 / max(1, len(groups))
    for ax, fr in zip(axes, framings):
        sub = medians[medians["framing"] == fr]
        per = sub.groupby(["category", "model", "group"])[measure].mean().reset_index()
        for gi, grp in enumerate(groups):
            for ci, cat in enumerate(cats):
                pts = per[(per["category"] == cat) & (per["group"] == grp)]
                x0 = ci + (gi - (len(groups) - 1) / 2) * gw
                jit = np.linspace(-gw * 0.3, gw * 0.3, len(pts)) if len(pts) > 1 else [0]
                for (_, r), j in zip(pts.iterrows(), jit):
                    ax.scatter([x0 + j], [r[measure]], color=styles.color.get(r["model"], "grey"),
                               s=28, edgecolor="black", linewidth=0.4, zorder=3)
                if len(pts):
                    ax.hlines(pts[measure].mean(), x0 - gw * 0.4, x0 + gw * 0.4, color="black",
                              lw=2, zorder=4)
        centers = [ci + (gi - (len(groups) - 1) / 2) * gw for ci in range(len(cats))
                   for gi in range(len(groups))]
        ax.set_xticks(centers, [g for _ in cats for g in groups], minor=True, fontsize=7,
                      color="0.3")
        ax.set_xticks(range(len(cats)), [c.replace("_", " ") for c in cats], fontsize=8,
                      rotation=30 if len(cats) > 4 else 0, ha="right" if len(cats) > 4 else "center")
        ax.tick_params(axis="x", which="major", pad=14, length=0)
        ax.set_xlim(-0.5, len(cats) - 0.5)
        ax.set_title(f"{fr} prompts", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].invert_yaxis()
    axes[0].set_ylabel(measure.replace("_", " ") + " (lower = preferred)")
    fig.legend(handles=styles.legend_handles(), loc="outside lower center", fontsize=8,
               ncols=4)
    fig.suptitle("Dictionary categories: median rank per model (bar: group mean)",
                 fontsize=10)
    return fig
