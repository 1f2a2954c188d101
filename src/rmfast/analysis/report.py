"""One self-contained HTML report of every analysis that the inputs allow.

``rmfast report INPUTS... --out report.html`` (or :func:`build_report` +
:func:`write_report`) runs the analyses of :mod:`rmfast.analysis` and writes one HTML
file: figures embedded as base64 PNG, tables as HTML, no external resources, so it opens
offline. An analysis whose inputs are missing (no AFINN file, no negative prompt, ...)
is listed with the reason instead of failing the report; so is a part of an analysis the
inputs do not allow (no MDS map below 3 models, no RSA without metadata). Figures are at
most 1,210 px wide and scale down with the window. The file is written atomically
(temporary file in the same folder, then rename). With ``progress=True`` each section is
announced on stderr (a tqdm bar on a terminal, one line per section otherwise).
"""

from __future__ import annotations

import datetime as _dt
import html
import importlib.util
import sys
from dataclasses import dataclass, field
from functools import partial
from os import PathLike
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ..errors import UserError
from ..io import atomic_write
from . import registry
from .data.ledger import Ledger
from .render.report_html import img_html, table_html, visible

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1280px;
color:#222;line-height:1.45;padding:0 16px}
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:2em}
h3{font-size:1.05em;margin-top:1.4em}
table{border-collapse:collapse;font-size:12px;margin:6px 0 14px}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td.t,th.t{text-align:left}
.scroll{overflow-x:auto;max-width:100%}
img{max-width:100%;height:auto}
.figs{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.figs>div{min-width:0;max-width:100%}
.figs img{border:1px solid #eee}
.note{color:#555;font-size:13px}.skip{color:#a33}
details{margin:6px 0}summary{cursor:pointer;color:#225}
code{background:#f6f6f6;padding:0 3px}
nav a{margin-right:12px}
"""


@dataclass
class Section:
    """One analysis in the report."""

    key: str
    title: str
    intro: str
    body: list[str] = field(default_factory=list)
    skipped: str | None = None
    result: object = None


def _notes_html(res) -> str:
    parts = []
    dropped = getattr(res, "dropped", None)
    notes = getattr(res, "notes", [])
    if dropped is not None and len(dropped):
        summary = dropped.groupby(["step", "reason"], dropna=False)["rows"].sum().reset_index()
        parts.append(f"<details><summary>Rows left out: {int(dropped['rows'].sum()):,} "
                     "(by step and reason; per model × prompt inside)</summary>"
                     + table_html(summary, max_rows=40)
                     + table_html(dropped, max_rows=200) + "</details>")
    if notes:
        parts.append("<details><summary>Notes</summary><ul>" + "".join(
            f"<li>{html.escape(n)}</li>" for n in notes) + "</ul></details>")
    return "".join(parts)


def _label_models(df: pd.DataFrame, styles, cols=("model", "model_a", "model_b", "rater")):
    df = df.copy()
    for c in cols:
        if c in df.columns:
            df[c] = df[c].map(lambda m: styles.label.get(m, m))
    return df


@dataclass
class _Inputs:
    """What the section functions read: the validated scans, their styles and the optional inputs."""

    scans: pd.DataFrame
    styles: object
    meta: object
    prompts: list
    human: pd.DataFrame | None
    afinn: object
    frequencies: object
    dictionaries: tuple
    framing: object
    join: str
    k: int
    n_perm: int
    best: str | None
    worst: str | None
    scores_source: str = ""
    human_source: str = ""
    states: dict | None = None  # label -> states folder (the representations section)
    similarity_csv: object = None
    states_layers: int | None = 6
    states_rows: int | None = 4096


# 1. distributions ------------------------------------------------------------------


def _distributions(sec: Section, x: _Inputs) -> None:
    from .paper_a.distributions import distributions
    from .render import plots

    res = distributions(x.scans)
    sec.result = res
    sec.body.append(img_html(plots.violins(x.scans, x.styles), "violin plot of scores"))
    sec.body.append("<details><summary>Standardised (z within model × prompt): shapes "
                    "side by side</summary>" + img_html(
                        plots.violins(x.scans, x.styles, standardize=True),
                        "violin plot of z-scores") + "</details>")
    sec.body.append(table_html(_label_models(res.moments, x.styles)))


# 2. agreement ----------------------------------------------------------------------


def _agreement(sec: Section, x: _Inputs) -> None:
    from .paper_a.agreement import agreement
    from .render import plots

    res = agreement(x.scans, join=x.join, metadata=x.meta, n_perm=x.n_perm)
    sec.result = res
    compared = list(dict.fromkeys(res.pairs["prompt"]))
    for p in x.prompts:
        if p not in compared:
            why = _prompt_notes(res, p) or "no pair of models to compare"
            sec.body.append(f'<p class="skip">Not compared: {html.escape(p)}: {html.escape(why)}</p>')
            continue
        sec.body.append(img_html(plots.agreement_panel(res, p, x.styles),
                                 "agreement heatmaps and MDS"))
        if not (res.mds["prompt"] == p).any():
            why = _prompt_notes(res, p, "MDS") or "MDS not computed"
            sec.body.append(f'<p class="skip">No MDS map for this prompt: {html.escape(why)}</p>')
    sec.body.append("<h3>RSA against model metadata</h3>")
    if len(res.rsa):
        sec.body.append(img_html(plots.rsa_bars(res.rsa), "RSA"))
        sec.body.append(table_html(res.rsa))
    else:
        why = ("no model metadata given (--metadata FILE)" if x.meta is None else
               _rsa_reason(res, x.prompts))
        sec.body.append(f'<p class="skip">Not run: {html.escape(why)}</p>')
    sec.body.append("<h3>Shared vocabulary</h3>" + table_html(
        _label_models(res.vocabulary, x.styles)))
    sec.body.append("<h3>All pairs</h3>" + table_html(_label_models(res.pairs, x.styles),
                                                     max_rows=30))


def _rsa_reason(res, prompts) -> str:
    """Why there is no RSA row: the RSA notes, once each (per-prompt wording folded)."""
    notes = []
    for n in res.notes:
        if n.startswith("RSA"):
            for p in prompts:
                n = n.replace(f" for {p!r}", "")
            notes.append(n)
    return "; ".join(dict.fromkeys(notes)) or "no RSA result"


def _prompt_notes(res, prompt: str, topic: str = "") -> str:
    """The result's notes about ``prompt`` (and ``topic``), without the prompt prefix, joined."""
    out = []
    for n in res.notes:
        for head in (f"prompt {prompt!r}: ", f"prompt {prompt!r} "):
            if n.startswith(head) and n[len(head):].startswith(topic):
                out.append(n[len(head):])
                break
    return "; ".join(out)


# 3. human --------------------------------------------------------------------------


def _human(sec: Section, x: _Inputs) -> None:
    from .paper_a.human import human_comparison
    from .render import plots

    if x.human is None:
        raise UserError("no human scores given (--eloeverything DIR or --human CSV)")
    styles = x.styles
    res = human_comparison(x.scans, x.human, k=15)
    sec.result = res
    sec.body.append(f'<p class="note"><b>Model scores:</b> {html.escape(x.scores_source)}. '
                    f'<b>Human scores:</b> {html.escape(x.human_source)}. Items are joined on '
                    "their text.</p>")
    sec.body.append(img_html(plots.human_bars(res.correlations, styles), "rho bars"))
    wide = res.correlations.pivot(index="model", columns="prompt", values="spearman_rho")
    wide = wide.reindex([m for m in styles.order if m in wide.index])
    wide.index = [styles.label[m] for m in wide.index]
    sec.body.append("<h3>Spearman rho with the human score</h3>" + table_html(
        wide.reset_index(names="model")))
    for p in dict.fromkeys(res.correlations["prompt"]):
        sec.body.append(f"<h3>{html.escape(p)}</h3>")
        sec.body.append(img_html(plots.rank_trajectories(res.trajectories, res.correlations,
                                                           styles, p), "rank trajectories"))
        d = res.differences[res.differences["prompt"] == p].drop(columns="prompt")
        parts = [table_html(g.drop(columns="direction"), max_rows=15)
                 for _, g in d.groupby("direction", sort=False)]
        heads = list(pd.unique(d["direction"]))
        sec.body.append('<div class="figs">' + "".join(
            f"<div><b>{html.escape(h)} than models</b>{t}</div>" if h.startswith("humans")
            else f"<div><b>{html.escape(h)} than humans</b>{t}</div>"
            for h, t in zip(heads, parts)) + "</div>")
    sec.body.append("<h3>All correlations</h3>" + table_html(
        _label_models(res.correlations, styles)))


# 4. sentiment ----------------------------------------------------------------------


def _afinn(sec: Section, x: _Inputs, what: str):
    """The AFINN lexicon a section reads: --afinn, else the afinn package's AFINN-111 (load_afinn(None); a one-line
    reason when it is absent), said in the section as its ``what`` (Lexicon, Valence)."""
    from .data.lexicons import load_afinn

    if x.afinn is not None:
        return x.afinn
    lexicon = load_afinn(None)
    sec.body.append(f"<p class='note'>{what}: AFINN-111 from the <code>afinn</code> package "
                    "(the default; <code>--afinn FILE</code> gives another).</p>")
    return lexicon


def _sentiment(sec: Section, x: _Inputs) -> None:
    from .paper_a.sentiment import sentiment
    from .render import plots

    afinn = _afinn(sec, x, "Lexicon")
    res = sentiment(x.scans, afinn, framing=x.framing)
    sec.result = res
    if res.slopes["slope"].isna().all():
        raise UserError("no valence slope could be fitted (too few AFINN words or one "
                        "valence level per sign); see the analysis notes")
    sec.body.append(img_html(plots.framing_plot(res.slopes, x.styles), "framing plot"))
    top = res.tokens.groupby("model").size().sort_values().index[-1]
    sec.body.append(img_html(plots.valence_scatter(res.tokens, top, x.styles), "scatter"))
    sec.body.append(table_html(res.summary))
    sec.body.append(table_html(_label_models(res.slopes, x.styles)))


# 5. exposure -----------------------------------------------------------------------


def _exposure(sec: Section, x: _Inputs) -> None:
    from .paper_a.exposure import exposure
    from .render import plots

    freqs = x.frequencies
    if freqs is None:  # no --frequencies: wordfreq's English list when the package is installed
        if importlib.util.find_spec("wordfreq") is None:
            raise UserError("no word-frequency list given: --frequencies FILE (BNC list or word,frequency), "
                            "or pip install wordfreq")
        freqs = "wordfreq"
    # valence controlled for, as the section says and `rmfast analyze exposure` does (the sentiment section's lexicon)
    res = exposure(x.scans, freqs, _afinn(sec, x, "Valence"), framing=x.framing)
    sec.result = res
    if x.frequencies is None:
        sec.body.append("<p class='note'>Frequencies: the <code>wordfreq</code> package's English list "
                        "(the default; <code>--frequencies FILE</code> gives another, e.g. the BNC).</p>")
    sec.body.append(img_html(plots.exposure_plot(res.slopes, x.styles), "exposure"))
    sec.body.append(table_html(_label_models(res.slopes, x.styles)))


# 6. best vs worst ------------------------------------------------------------------


def _best_worst(sec: Section, x: _Inputs) -> None:
    from .paper_a.best_worst import best_worst
    from .render import plots

    res = best_worst(x.scans, best=x.best, worst=x.worst, join=x.join, k=x.k, framing=x.framing)
    sec.result = res
    sec.body.append(img_html(plots.best_worst_grid(
        res.scores, x.styles, res.best_prompt, res.worst_prompt,
        units="z-score" if res.units.startswith("z") else "score"), "best vs worst"))
    sec.body.append(table_html(_label_models(res.correlations, x.styles)))
    for measure in ("best+worst", "best-worst"):
        sub = res.extremes[res.extremes["measure"] == measure]
        sec.body.append(f"<h3>{measure}</h3>" + _wide_extremes(sub, x.styles, "value"))


# 7. categories ---------------------------------------------------------------------


def _categories(sec: Section, x: _Inputs, dpath) -> None:
    from .paper_b.categories import categories
    from .render import plots

    res = categories(x.scans, dpath, metadata=x.meta, framing=x.framing, n_perm=x.n_perm)
    sec.result = res
    sec.body.append(img_html(plots.category_plot(res.medians, x.styles), "categories"))
    sec.body.append("<h3>Group permutation tests</h3>" + table_html(res.permutation))
    if len(res.mixed):
        sec.body.append("<h3>Mixed model</h3>" + table_html(res.mixed))
    sec.body.append("<h3>Median ranks</h3>" + table_html(
        _label_models(res.medians, x.styles)))


# 8. extremes -----------------------------------------------------------------------


def _extremes(sec: Section, x: _Inputs) -> None:
    from .paper_a.extremes import extremes

    for shared in (False, True):
        try:
            res = extremes(x.scans, k=x.k, shared_vocab=shared, join=x.join)
        except UserError as exc:
            sec.body.append(f'<p class="skip">shared vocabulary: {html.escape(str(exc))}</p>')
            continue
        sec.result = res if not shared else sec.result
        label = "shared vocabulary (papers’ rule)" if shared else "everything scored"
        for p in x.prompts:
            sub = res.extremes[res.extremes["prompt"] == p]
            if sub.empty:
                continue
            sec.body.append(f"<details{' open' if not shared else ''}><summary>"
                            f"{html.escape(p)} — {label}</summary>"
                            + _wide_extremes(sub, x.styles, "score") + "</details>")


def _section_specs(x: _Inputs) -> list[tuple]:
    """(key, title, intro, fn(sec, inputs)) of every section, in report order; titles from the registry."""
    title = {a.name: a.title for a in registry.ANALYSES}
    rule = ("decoded text, strings occurring more than once within a model dropped "
            "(papers’ rule)" if x.join == "text" else "token id and decoded text")
    specs = [
        ("distributions", title["distributions"],
         "Moments of every model's scores per prompt (variance ddof=1; skew and excess "
         "kurtosis bias-corrected). Violins show each model's raw score scale (each violin "
         "from at most 20,000 scores, sampled with a fixed seed).", _distributions),
        ("agreement", title["agreement"],
         f"Models joined per prompt on the shared vocabulary ({rule}); "
         "Kendall tau-b, Spearman rho and rank-biased overlap per pair; MDS of 1 − tau; "
         "RSA of the tau matrix against metadata similarity (Spearman, label permutation).",
         _agreement),
        ("human", title["human"],
         "Items with a human score (EloEverything Elo) against the models' scores of the same "
         "items: Spearman and Kendall tau-b per model × prompt; the consensus model rank (mean "
         "of the models' ranks, ranked again) against the human rank, largest differences "
         "both ways (rank 1 = best).", _human),
        ("sentiment", title["sentiment"],
         "Tokens (stripped, lower-cased) joined to AFINN-111; per model × prompt × valence sign "
         "the OLS slope of the z-scored score on valence (± SE).", _sentiment),
        ("exposure", title["exposure"],
         "Per model × prompt: OLS of the z-scored score on ln(word frequency per million) and "
         "AFINN valence, over tokens found in both lists.", _exposure),
        ("best-worst", title["best-worst"],
         "The same tokens under the positive and the negative prompt (z-scores within model × "
         "prompt). best+worst: good (or bad) under both frames; best−worst: the framing axis.",
         _best_worst),
    ]
    for dpath in x.dictionaries or ():
        name = Path(str(dpath)).name
        specs.append((f"categories-{name}", f"{title['categories']}: {name}",
                      "Dictionary words ranked within model × prompt; median rank per category; models "
                      "grouped by base family (permutation Welch t, Bonferroni) and a mixed model with a "
                      "random intercept per model.", partial(_categories, dpath=dpath)))
    specs.append(("extremes", f"Top and bottom {x.k} per model × prompt",  # the registry's title, with k
                  "Highest and lowest scored strings per model (score in brackets), over everything "
                  "scored and over the vocabulary all models share.", _extremes))
    from .representations.views import has_representations, report_section

    if has_representations(x.scans, x.states, x.similarity_csv):
        specs.append(("representations", "Representations: the reward lens and layer × layer similarity",
                      "The reward lens (scans run with --lens): per layer, the Spearman correlation of the head "
                      "read through the final norm with the final scores, and the overlap of its top-k and "
                      "bottom-k with the final ones (rmfast analyze lens). The similarity of hidden states "
                      "(scans run with --states, or a CSV of rmfast analyze similarity): linear CKA and RV2 per "
                      "layer pair; read RV2 (and debiased CKA) where n is small against the width.", report_section))
    return specs


def _run_section(key: str, title: str, intro: str, fn, x: _Inputs) -> Section:
    """Run one section; a UserError (a missing input) becomes its reason for not running, and any other
    error ends only this section (its reason, and one line on stderr), never the whole report."""
    sec = Section(key, title, intro)
    try:
        fn(sec, x)
    except UserError as exc:
        sec.skipped = str(exc)
    except Exception as exc:  # noqa: BLE001 - one failing analysis must not lose the others
        sec.body = []
        sec.skipped = f"failed: {type(exc).__name__}: {exc}"
        print(f"rmfast: report section '{title}' failed ({type(exc).__name__}: {exc}); the others are kept",
              file=sys.stderr)
    return sec


def build_report(scans: pd.DataFrame, *, human: pd.DataFrame | None = None, metadata=None,
                 afinn=None, frequencies=None, dictionaries=(), join: str = "text", k: int = 10,
                 n_perm: int = 2000, best: str | None = None, worst: str | None = None,
                 framing=None, title: str = "rmfast report", source: str = "",
                 scores_source: str | None = None, human_source: str | None = None,
                 progress: bool = False, explorer: str | None = None, states=None, similarity_csv=None,
                 states_layers: int | None = 6, states_rows: int | None = 4096, left_out=None) -> str:
    """Run every applicable analysis on ``scans`` and return the report's HTML. ``left_out``: a
    :class:`~rmfast.analysis.data.ledger.Ledger` of the rows the caller left out when reading the scans (a NaN
    score); the page lists them with the rows left out here, before any section.

    ``human``: items with human scores (text, human_score) for the human comparison;
    ``metadata``: model metadata file/frame (labels, colours, RSA, groups);
    ``afinn``/``frequencies``/``dictionaries``: lexicon paths (see :mod:`rmfast.analysis`);
    ``scores_source``/``human_source``: where the model and the human scores come from, in
    words, shown by the human comparison (default: what the loaders recorded in
    ``scans.attrs`` — EloEverything CSVs or rmfast scan files — and "given as a frame");
    ``progress``: announce each section on stderr;
    ``explorer``: the address of an ``rmfast explore`` page to link from the header (relative to
    the report, e.g. what :func:`explorer_beside` finds);
    ``states``: label -> states folder (or scan Parquet with one beside it;
    :func:`rmfast.analysis.representations.views.states_beside` finds them), compared pairwise in the
    representations section on at most ``states_layers`` layers per set and ``states_rows`` shared
    candidates (None: all); ``similarity_csv``: a CSV of ``rmfast analyze similarity --out`` to show.
    The section appears when these are given or the scans have lens columns (``--lens``).

    >>> import tempfile
    >>> from rmfast.analysis import load_eloeverything
    >>> d = load_eloeverything("../shared/data/eloeverything")
    >>> one = d.scans[d.scans["prompt"] == "What, in one word, is the greatest thing ever?"]
    >>> three = one[one["model"].isin(one["model"].unique()[:3])]  # 3 models: a quick example
    >>> out = write_report(Path(tempfile.mkdtemp()) / "report.html", build_report(three, human=d.human, n_perm=200))
    >>> html_text = out.read_text(encoding="utf-8")
    >>> html_text.startswith("<!DOCTYPE html>"), 'id="human"' in html_text
    (True, True)
    >>> "Not run:" in html_text  # no negative prompt and no model metadata given: those sections say why
    True
    """
    from .data.metadata import load_model_metadata
    from .data.scans import SOURCE_ATTR, validate_scans
    from .render.plots import Styles

    scores_source = scores_source or getattr(scans, "attrs", {}).get(SOURCE_ATTR) or \
        "the scan frame given to build_report (source not stated)"
    human_source = human_source or (getattr(human, "attrs", {}).get(SOURCE_ATTR) if human is not None
                                    else None) or "the human frame given to build_report"
    led = Ledger().extend(left_out) if left_out is not None else Ledger()
    scans = validate_scans(scans, ledger=led)
    meta = load_model_metadata(metadata) if metadata is not None else None
    styles = Styles.build(scans["model"].unique(), meta)
    prompts = list(pd.unique(scans["prompt"]))
    _check_prompt_options(prompts, best, worst, framing)
    x = _Inputs(scans, styles, meta, prompts, human, afinn, frequencies, dictionaries, framing, join, k, n_perm,
                best, worst, scores_source, human_source, dict(states or {}), similarity_csv, states_layers,
                states_rows)
    sections = _run_sections(_section_specs(x), x, progress)
    return _page(title, source, scans, styles, sections, explorer, led)


def _check_prompt_options(prompts: list[str], best, worst, framing) -> None:
    """The prompts that best/worst/framing name are the scans', and best is not worst: refused before any
    section runs (a section that cannot use them would only say so in the page, and the report exit 0)."""
    from .data.framing import check_named_prompts, framing_map

    check_named_prompts(prompts, [("--best", best), ("--worst", worst)] + [("--framing", p) for p in framing or {}])
    framing_map(prompts, framing)  # the values: positive or negative
    if best is not None and best == worst:
        raise UserError("--best and --worst name the same prompt; name two different prompts")


def _run_sections(specs: list[tuple], x: _Inputs, progress: bool) -> list[Section]:
    """Run the sections in order; with ``progress`` a tqdm bar on stderr when it is a terminal,
    else one line per section (``rmfast: report 2/8: Agreement between models``)."""
    if not progress:
        return [_run_section(key, title, intro, fn, x) for key, title, intro, fn in specs]
    sections = []
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        with tqdm(total=len(specs), desc="report", unit="section", file=sys.stderr,
                  dynamic_ncols=True) as bar:
            for key, title, intro, fn in specs:
                bar.set_postfix_str(key)
                sections.append(_run_section(key, title, intro, fn, x))
                bar.update()
        return sections
    for i, (key, title, intro, fn) in enumerate(specs, 1):
        print(f"rmfast: report {i}/{len(specs)}: {title}", file=sys.stderr, flush=True)
        sections.append(_run_section(key, title, intro, fn, x))
    return sections


def _wide_extremes(sub: pd.DataFrame, styles, value: str) -> str:
    out = []
    for end in ("top", "bottom"):
        e = sub[sub["end"] == end]
        if e.empty:
            continue
        cell = e.assign(cell=[f"{visible(t)} ({v:.3g})" for t, v in zip(e["text"], e[value])])
        wide = cell.pivot(index="position", columns="model", values="cell")
        order = [m for m in styles.order if m in wide.columns] + \
            [m for m in wide.columns if m not in styles.order]
        wide = wide[order]
        wide.columns = [styles.label.get(m, m) for m in order]
        out.append(f"<b>{end}</b>" + table_html(wide.reset_index(), max_rows=200, text_cols=()))
    return "".join(out)


def explorer_beside(report_path: str | PathLike) -> str | None:
    """The explorer page beside a report, as a link relative to it: ``<stem>.explorer.html`` or
    ``explorer.html`` in the report's folder (the first that exists), else None.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "explorer.html").write_text("")
    >>> explorer_beside(d / "report.html")
    'explorer.html'
    """
    path = Path(report_path)
    for name in (f"{path.stem}.explorer.html", "explorer.html"):
        if (path.parent / name).is_file():
            return name
    return None


def _page(title, source, scans, styles, sections, explorer=None, left_out=None) -> str:
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    models = ", ".join(styles.label[m] for m in styles.order)
    n_p = scans["prompt"].nunique()
    head = (f"<h1>{html.escape(title)}</h1><p class='note'>Generated {now} by rmfast"
            f"{' from ' + html.escape(source) if source else ''}. {len(styles.order)} model"
            f"{'s' * (len(styles.order) != 1)} ({html.escape(models)}); {n_p} prompt{'s' * (n_p != 1)}; "
            f"{len(scans):,} scored rows.</p>")
    if left_out is not None and (left_out.drops or left_out.notes):  # before any section: every section lacks them
        head += ("<p class='note'>Left out before any analysis (every section's counts are without them):</p>"
                 + _notes_html(SimpleNamespace(dropped=left_out.frame(), notes=left_out.notes)))
    if explorer:  # the explorer page (rmfast explore): every token, searchable
        head += (f'<p class="note">Browse every token, search and compare columns: <a href="{html.escape(explorer)}">'
                 f"{html.escape(explorer)}</a> (rmfast explore).</p>")
    nav = "<nav>" + "".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>'
                            for s in sections) + "</nav>"
    body = []
    for s in sections:
        body.append(f'<h2 id="{s.key}">{html.escape(s.title)}</h2>'
                    f'<p class="note">{html.escape(s.intro)}</p>')
        if s.skipped:
            body.append(f'<p class="skip">Not run: {html.escape(s.skipped)}</p>')
            continue
        body.extend(s.body)
        body.append(_notes_html(s.result))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
            + head + nav + "".join(body) + "</body></html>")


def write_report(path: str | PathLike, html_text: str) -> Path:
    """Write the report atomically (temporary file beside it, then rename)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(f"folder {path.parent} does not exist; create it or choose another --out")
    atomic_write(path, lambda tmp: Path(tmp).write_text(html_text, encoding="utf-8"))
    return path
