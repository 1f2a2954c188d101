"""The reward lens and the layer × layer similarity of hidden states, as the report and the explorer show them.

Issue 24 §6. Nothing is computed here that :mod:`rmfast.analysis.representations.lens` and
:mod:`rmfast.analysis.representations.similarity` do not compute: this module finds what the inputs hold and
calls them.

- **Lens**: every model × prompt of a scan frame with ``lens_<layer>`` columns (a scan run with
  ``--lens``) gets :func:`~rmfast.analysis.representations.lens.lens` (:func:`lens_by_scan`).
- **Similarity**: the states folders beside the scan files (``<stem>.states/``,
  :func:`states_beside`) are compared pairwise with :func:`~rmfast.analysis.representations.similarity.similarity`,
  no bootstrap and no permutations, on at most ``max_layers`` layers per set (evenly spaced, the
  first and the last included: :func:`pick_layers`) and at most ``max_rows`` shared candidates (a
  seeded sample), so a report of 8B models does not run for hours; one set alone is compared with
  itself (its layer × layer map). A CSV written by ``rmfast analyze similarity --out`` can be
  given instead (:func:`similarity_from_csv`), with every layer it holds.
- :func:`report_section` writes the report's section from these.

Example:
    >>> import tempfile; from rmfast.states import write_states
    >>> rng = np.random.default_rng(0); d = Path(tempfile.mkdtemp())
    >>> X = rng.normal(size=(50, 4)).astype("float32")
    >>> _ = write_states(d / "a.states", np.arange(50), {"0": X, "last_prenorm": X + rng.normal(size=(50, 4))})
    >>> panels, notes = similarity_panels({"a": d / "a.states"})
    >>> p = panels[0]; (p.a, p.b, p.layers_a, heat_matrix(p.pairs, "cka")[2].shape)
    ('a', 'a', ['0', 'last_prenorm'], (2, 2))
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...io import states_dir
from ...states import MANIFEST, is_states_folder, open_states
from .lens import LensResult, lens, lens_columns, lens_figure
from ..render.report_html import img_html, table_html
from .similarity import MEASURES, similarity

#: the measures the heatmaps show (debiased CKA and RV are in the tables)
HEAT_MEASURES = ("cka", "rv2")
MAX_LAYERS = 6  # per set, for a computed map
MAX_ROWS = 4096  # shared candidates, for a computed map
MAX_SETS = 4  # states sets compared pairwise (6 pairs)


def layer_key(name: str) -> tuple:
    """Depth order of layer names: 0, 1, ..., last_prenorm (or the old last; the lens's last), last_normed,
    then any other name.

    >>> sorted(["last_prenorm", "10", "2", "last_normed", "0"], key=layer_key)
    ['0', '2', '10', 'last_prenorm', 'last_normed']
    """
    s = str(name)
    if s.isdigit():
        return (0, int(s), "")
    return (1 if s in ("last_prenorm", "last") else 2 if s == "last_normed" else 3, 0, s)


# ---------------------------------------------------------------- the lens
def lens_by_scan(scans: pd.DataFrame, k: int = 10) -> list[tuple[str, str, LensResult]]:
    """(model, prompt, :func:`~rmfast.analysis.representations.lens.lens` result) of every model × prompt with lens values.

    In a frame of several scans a scan's lens columns are those it fills (another model may have
    more layers); they are taken in depth order. Empty without lens columns.
    """
    cols = lens_columns(scans)
    if not cols:
        return []
    out = []
    for (model, prompt), g in scans.groupby(["model", "prompt"], sort=False):
        have = sorted((c for c in cols if g[c].notna().any()), key=lambda c: layer_key(c[len("lens_"):]))
        if not have:
            continue
        keep = [c for c in ("token_id", "text", "score") if c in g.columns] + have
        out.append((str(model), str(prompt), lens(g[keep].reset_index(drop=True), k=k)))
    return out


# ---------------------------------------------------------------- states and the similarity maps
def states_beside(paths) -> dict[str, Path]:
    """Label -> states folder, for every scan Parquet among ``paths`` (files or folders of them) that has a
    ``<stem>.states/`` folder beside it, and every states folder given itself. Labels: the manifest's model
    (:attr:`rmfast.states.StatesSet.name`), with the folder name added where two sets share one."""
    paths = [paths] if isinstance(paths, (str, PathLike)) else list(paths or [])
    found: list[Path] = []
    for p in map(Path, paths):
        if is_states_folder(p):  # not any folder with a manifest.json: a sweep store's index has that name
            found.append(p)
        elif p.is_dir():
            found += [states_dir(f) for f in sorted(p.rglob("*.parquet")) if (states_dir(f) / MANIFEST).is_file()]
        elif p.suffix == ".parquet" and (states_dir(p) / MANIFEST).is_file():
            found.append(states_dir(p))
    found = list(dict.fromkeys(found))
    names = [open_states(f).name for f in found]
    return {(n if names.count(n) == 1 else f"{n} ({f.name})"): f for n, f in zip(names, found)}


def pick_layers(layers: list[str], most: int | None = MAX_LAYERS) -> list[str]:
    """At most ``most`` of ``layers``, evenly spaced, the first and the last kept (all of them when they fit).

    >>> pick_layers([str(i) for i in range(10)] + ["last_prenorm"], 4)
    ['0', '3', '7', 'last_prenorm']
    """
    if most is None or len(layers) <= most:
        return list(layers)
    idx = np.unique(np.round(np.linspace(0, len(layers) - 1, max(2, most))).astype(int))
    return [layers[i] for i in idx]


@dataclass
class SimilarityPanel:
    """One layer × layer map: set a against set b (the same set: its own layers against each other).

    pairs: the similarity table (one row per layer pair, the columns of ``rmfast analyze similarity``);
    layers_a/b: the layers shown, of all_a/all_b the set has; source: "computed" or the CSV's path.
    """

    a: str
    b: str
    pairs: pd.DataFrame
    layers_a: list[str]
    layers_b: list[str]
    all_a: int
    all_b: int
    source: str = "computed"
    notes: list[str] = field(default_factory=list)


def similarity_panels(states: Mapping[str, object], *, max_layers: int | None = MAX_LAYERS,
                      max_rows: int | None = MAX_ROWS, seed: int = 0,
                      max_sets: int = MAX_SETS) -> tuple[list[SimilarityPanel], list[str]]:
    """Every pair of the first ``max_sets`` state sets (label -> folder or scan Parquet), or one set against
    itself: :func:`~rmfast.analysis.representations.similarity.similarity` with no bootstrap or permutations on
    :func:`pick_layers` of each set and at most ``max_rows`` shared candidates. Returns (panels, notes)."""
    sets = {label: open_states(p) for label, p in states.items()}
    labels = list(sets)
    notes = []
    if len(labels) > max_sets:
        notes.append(f"{len(labels)} state sets; the maps compare the first {max_sets} "
                     f"({', '.join(labels[:max_sets])}); rmfast analyze similarity compares any two")
        labels = labels[:max_sets]
    pairs = list(combinations(labels, 2)) if len(labels) > 1 else [(labels[0], labels[0])] if labels else []
    panels = []
    for a, b in pairs:
        la, lb = pick_layers(sets[a].layers, max_layers), pick_layers(sets[b].layers, max_layers)
        try:
            res = similarity(sets[a], sets[b], layers_a=la, layers_b=lb, bootstrap=0, permutations=0, seed=seed,
                             max_rows=max_rows)
        except UserError as e:  # this pair only (no shared candidates): the others are still shown
            notes.append(f"{a} × {b} not compared ({sets[a].path} and {sets[b].path}): {e.cli_message()}")
            continue
        panels.append(SimilarityPanel(a, b, res.pairs, la, lb, len(sets[a].layers), len(sets[b].layers),
                                      notes=list(res.notes)))
    return panels, notes


def similarity_from_csv(path) -> SimilarityPanel:
    """A panel from a CSV of ``rmfast analyze similarity --out`` (every layer pair it holds)."""
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype={"layer_a": str, "layer_b": str})
    except FileNotFoundError:
        raise UserError(f"{path}: no such similarity CSV") from None
    except Exception as e:
        raise UserError(f"{path}: not a readable CSV ({type(e).__name__})") from None
    missing = [c for c in ("layer_a", "layer_b", *HEAT_MEASURES) if c not in df.columns]
    if missing:
        raise UserError(f"{path}: lacks column(s) {missing}; give a CSV of rmfast analyze similarity --out")
    la, lb = list(pd.unique(df["layer_a"])), list(pd.unique(df["layer_b"]))
    return SimilarityPanel("A", "B", df, la, lb, len(la), len(lb), source=str(path))


def heat_matrix(pairs: pd.DataFrame, measure: str) -> tuple[list[str], list[str], np.ndarray]:
    """(layers of A, layers of B, (len A, len B) values of ``measure``; NaN where a pair is missing), in the
    table's order."""
    la, lb = list(pd.unique(pairs["layer_a"].astype(str))), list(pd.unique(pairs["layer_b"].astype(str)))
    wide = pairs.assign(layer_a=pairs["layer_a"].astype(str), layer_b=pairs["layer_b"].astype(str)).pivot(
        index="layer_a", columns="layer_b", values=measure)
    return la, lb, wide.reindex(index=la, columns=lb).to_numpy(np.float64)


def similarity_figure(panel: SimilarityPanel, measures=HEAT_MEASURES):
    """One heatmap per measure (rows: layers of A, columns: layers of B), values printed on small maps."""
    from ..render.plots import new_figure

    fig = new_figure(min(11.0, 4.2 * len(measures)), 4.0)
    for i, m in enumerate(measures):
        la, lb, v = heat_matrix(panel.pairs, m)
        ax = fig.add_subplot(1, len(measures), i + 1)
        lo = min(0.0, float(np.nanmin(v))) if np.isfinite(v).any() else 0.0
        im = ax.imshow(v, vmin=lo, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(lb)), lb, rotation=90 if len(lb) > 8 else 0, fontsize=7)
        ax.set_yticks(range(len(la)), la, fontsize=7)
        ax.set_xlabel(f"layer of {panel.b}"[:60], fontsize=8)
        ax.set_ylabel(f"layer of {panel.a}"[:60], fontsize=8)
        ax.set_title(m, fontsize=9)
        if len(la) * len(lb) <= 64:
            for (r, c), x in np.ndenumerate(v):
                if np.isfinite(x):
                    ax.text(c, r, f"{x:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if x > lo + 0.6 * (1 - lo) else "white")
        fig.colorbar(im, ax=ax, shrink=0.8)
    return fig


# ---------------------------------------------------------------- as JSON (the explorer's header)
def _num(v):
    """A JSON number, None for NaN/inf."""
    v = float(v)
    return v if np.isfinite(v) else None


def lens_payload(res: LensResult) -> dict:
    """A lens result as JSON-able lists (NaN as None): layers, n, k, spearman, top_k_overlap, bottom_k_overlap."""
    t = res.layers
    out = {"layers": [str(x) for x in t["layer"]], "n": int(t["n"].iloc[0]), "k": int(t["k"].iloc[0]),
           "notes": list(res.notes)}
    out.update({c: [_num(v) for v in t[c]] for c in ("spearman", "top_k_overlap", "bottom_k_overlap")})
    return out


def similarity_payload(panel: SimilarityPanel) -> dict:
    """A panel as JSON-able lists: a, b, source, layers_a/b, all_a/b, n, notes, measures {name: rows of values}."""
    n = pd.to_numeric(panel.pairs.get("n"), errors="coerce") if "n" in panel.pairs else pd.Series([np.nan])
    out = {"a": panel.a, "b": panel.b, "source": panel.source, "all_a": panel.all_a, "all_b": panel.all_b,
           "n": int(n.max()) if n.notna().any() else None, "notes": list(panel.notes), "measures": {}}
    for m in MEASURES:
        if m in panel.pairs.columns:
            la, lb, v = heat_matrix(panel.pairs, m)
            out["layers_a"], out["layers_b"] = la, lb
            out["measures"][m] = [[_num(x) for x in row] for row in v]
    return out


# ---------------------------------------------------------------- the report's section
def _figure_or_line(make, alt: str) -> str:
    """The figure as an <img>, or one line saying why there is none (matplotlib missing)."""
    try:
        return img_html(make(), alt)
    except UserError as exc:
        return f'<p class="skip">No figure: {html.escape(str(exc))}</p>'


def _lens_html(x) -> list[str]:
    """The lens part: per model × prompt the figure, the per-layer table and the rows it left out."""
    found = lens_by_scan(x.scans, x.k)
    if not found:
        return ['<p class="note">No scan here has lens columns (scan with <code>--lens</code>).</p>']
    out = []
    for model, prompt, res in found:
        label = x.styles.label.get(model, model)
        left = [f"{int(r.rows):,} rows left out: {r.reason}" for r in
                res.dropped.groupby("reason", as_index=False)["rows"].sum().itertuples()] if len(res.dropped) else []
        out.append(f"<details open><summary>{html.escape(label)} — {html.escape(prompt)}</summary>"
                   + _figure_or_line(lambda r=res, t=f"reward lens: {label}": lens_figure(r, t), "reward lens")
                   + table_html(res.layers, max_rows=200)
                   + "".join(f'<p class="note">{html.escape(n)}</p>' for n in left + list(res.notes)) + "</details>")
    return out


def _any_why(pairs: pd.DataFrame) -> bool:
    """Whether some pair's measures are undefined with a reason (the column ``undefined``; empty in a CSV: NaN)."""
    return any(isinstance(v, str) and v for v in pairs["undefined"])


def _similarity_html(x) -> list[str]:
    """The similarity part: per panel the heatmaps, the table and what was computed."""
    panels, notes = similarity_panels(x.states or {}, max_layers=x.states_layers, max_rows=x.states_rows)
    if x.similarity_csv is not None:
        panels.append(similarity_from_csv(x.similarity_csv))
    if not panels:
        return ['<p class="note">' + (html.escape(" ".join(notes)) if notes else "No states folder beside these scans "
                "(scan with <code>--states</code>) and no similarity CSV given.") + "</p>"]
    out = []
    for p in panels:
        head = f"{p.a} × {p.b}" if p.source == "computed" else f"{p.source} (A × B)"
        how = (f"{len(p.layers_a)} of {p.all_a} layers of {p.a} × {len(p.layers_b)} of {p.all_b} of {p.b} "
               "(evenly spaced, first and last kept); no bootstrap or permutations; "
               "rmfast analyze similarity gives every layer with intervals and p-values"
               if p.source == "computed" else "every layer pair of the CSV")
        out.append(f"<details open><summary>{html.escape(head)}</summary>"
                   f'<p class="note">{html.escape(how)}. {html.escape(" ".join(p.notes))}</p>'
                   + _figure_or_line(lambda q=p: similarity_figure(q), "layer by layer similarity")
                   + table_html(p.pairs[[c for c in ("layer_a", "layer_b", "n", *MEASURES, "rv_null_mean", "undefined")
                                         if c in p.pairs.columns and (c != "undefined" or _any_why(p.pairs))]],
                                max_rows=100) + "</details>")
    if notes:
        out.append('<p class="note">' + html.escape(" ".join(notes)) + "</p>")
    return out


def report_section(sec, x) -> None:
    """The report's representations section (``sec``: a report Section; ``x``: its inputs, with ``states``,
    ``similarity_csv``, ``states_layers``, ``states_rows``). A part whose inputs are bad (a states folder
    of another run, a CSV without the columns) says why in one line; the other part stays."""
    for title, part in (("Reward lens", _lens_html), ("Layer × layer similarity of hidden states", _similarity_html)):
        sec.body.append(f"<h3>{title}</h3>")
        try:
            sec.body.extend(part(x))
        except UserError as exc:
            sec.body.append(f'<p class="skip">Not shown: {html.escape(str(exc))}</p>')


def has_representations(scans: pd.DataFrame, states, similarity_csv) -> bool:
    """Whether the report has anything for the section: lens columns, a states folder, or a similarity CSV."""
    return bool(lens_columns(scans)) or bool(states) or similarity_csv is not None
