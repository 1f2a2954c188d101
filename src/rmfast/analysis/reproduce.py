"""``rmfast reproduce``: regenerate every table and figure the papers' published data allows.

:func:`run` collects findings from the per-paper modules (:func:`.paper_a.reproduce.reproduce_paper_a`,
:func:`.paper_b.reproduce.reproduce_paper_b`), each a list of dicts::

    id           "A-fig5b-a7"
    title        what the finding is
    paper_claim  the paper's statement of the result
    holds        True / False / None (None: nothing to judge, or not available)
    summary      one computed line ("holds: top-10 overlap with the paper's list 10/10 ...")
    files        CSVs and PNGs written, relative to the output folder

and writes them with an index (``index.md``, ``index.html``: each figure beside the paper's
statement and the verdict) into one folder, atomically: everything is built in a temporary
folder beside it and renamed into place, so an interrupted run leaves no half-written output.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import UserError
from ..io import check_output
from . import registry

PAPERS = tuple(registry.PAPERS)
INDEX_KEYS = ("id", "title", "paper_claim", "holds", "summary", "files")

#: The papers' figures that no published file allows, and why (listed in the index). A figure
#: whose files are missing from a given data folder is a finding saying "not available" instead.
NOT_REPRODUCIBLE = {
    "a": [
        ("Fig. 1-2 (score distributions; Kendall tau, MDS and RSA between models over the "
         "vocabulary)", "need each model's score for every vocabulary token; the authors published "
         "only the EloEverything item scores. `rmfast scan` + `rmfast analyze distributions / "
         "agreement` compute them from new scans"),
        ("Fig. 3 (AFINN sentiment, mere exposure)", "need the per-token scores above; the lexicons "
         "alone give only the BNC join difference (A-methods)"),
        ("Fig. 4 (best vs worst prompt per token)", "need the per-token scores under both prompts"),
        ("GCG sequences (longer optimal / pessimal responses)", "need the reward models themselves "
         "(`rmfast gcg`)"),
    ],
    "b": [
        ("Implicit reward of language-model pairs (MWLR, log ratio) and base vs instruction-tuned "
         "log-probabilities", "need the language models' next-token log-probabilities, which are not "
         "in the published data (`rmfast implicit`, `rmfast logprobs` compute them)"),
        ("Fig. 4a as drawn from per-token ranks", "the per-token parquet behind it is not in the "
         "published snapshot; B-fig4a is drawn from the published per-category medians "
         "(rank_results_*.csv) instead"),
    ],
}


def default_data_dir() -> Path:
    """The papers' data folder (:func:`rmfast.analysis.data.shared.shared_data_dir`: ``$RMFAST_SHARED_DATA``, then
    ``../shared/data`` from the working directory or beside a checkout), or one UserError naming what was tried."""
    from .data.shared import shared_data_dir

    return shared_data_dir("--data DIR")


def _paper_functions(papers, *, allow_skipped: bool = False) -> dict:
    """Paper letter → its reproduce function (the registry's :data:`~.registry.PAPERS`)."""
    from functools import partial

    out = {p: registry.load_paper(p) for p in papers}
    if "b" in out:
        out["b"] = partial(out["b"], allow_skipped=allow_skipped)
    return out


def run(data_dir, out_dir, papers=PAPERS, *, overwrite: bool = False,
        allow_skipped: bool = False) -> list[dict]:
    """Reproduce ``papers`` from ``data_dir`` into the folder ``out_dir``; return the findings.

    Refuses an existing ``out_dir`` unless ``overwrite`` (then it is replaced whole).
    ``allow_skipped``: paper B goes on when a skipped score file drops a model.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    bad = [p for p in papers if p not in PAPERS]
    if bad or not papers:
        raise UserError(f"unknown paper(s) {bad or list(papers)}; choose among {list(PAPERS)}")
    if not data_dir.is_dir():
        raise UserError(f"data folder {data_dir} does not exist; pass --data DIR (the folder "
                        "holding eloeverything/ and iclr2026/)")
    check_output(out_dir, folder=True)
    if out_dir.exists() and not overwrite:  # the folder is replaced whole
        raise UserError(f"output {out_dir} already exists; pass --overwrite to replace it or "
                        "choose another --out")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        findings = []
        for paper, fn in _paper_functions(papers, allow_skipped=allow_skipped).items():
            if isinstance(fn, str):
                findings.append({"id": f"{paper.upper()}-build", "title": f"Paper {paper.upper()}",
                                 "paper_claim": "", "holds": None, "summary": fn, "files": []})
                continue
            findings += [_checked(f) for f in fn(data_dir, tmp)]
        if findings and all(f["holds"] is None and str(f["summary"]).startswith("not available") for f in findings):
            raise UserError(f"{data_dir} holds none of the papers' data (paper A: eloeverything/, paper B: "
                            "iclr2026/); pass --data DIR, the folder that holds them (the project's shared data)")
        (tmp / "index.md").write_text(index_markdown(findings, data_dir, papers), encoding="utf-8")
        (tmp / "index.html").write_text(index_html(findings, data_dir, papers), encoding="utf-8")
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return findings


def _checked(f: dict) -> dict:
    missing = [k for k in INDEX_KEYS if k not in f]
    if missing:
        raise ValueError(f"finding {f.get('id')!r} lacks {missing}")  # a programming error
    return f


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename the finished folder into place; an old one is moved aside first, then removed."""
    os.chmod(tmp, 0o777 & ~_umask())
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old.{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def verdict(holds) -> str:
    """Word for a finding's ``holds``.

    >>> [verdict(h) for h in (True, False, None)]
    ['holds', 'does not hold', '—']
    """
    return {True: "holds", False: "does not hold"}.get(holds, "—")


def _not_reproducible(papers) -> list[tuple[str, str, str]]:
    return [(p.upper(), fig, why) for p in papers for fig, why in NOT_REPRODUCIBLE.get(p, [])]


def index_markdown(findings: list[dict], data_dir: Path, papers=PAPERS) -> str:
    """The index as Markdown: a summary table, then each finding with its files, then what the
    published data does not allow."""
    lines = ["# rmfast reproduce", "", f"Data: `{data_dir}`", "",
             "| id | finding | verdict | summary |", "|---|---|---|---|"]
    for f in findings:
        lines.append(f"| {f['id']} | {f['title']} | {verdict(f['holds'])} | "
                     f"{f['summary'].replace('|', '/')} |")
    for f in findings:
        lines += ["", f"## {f['id']}: {f['title']}", "", f"**Paper:** {f['paper_claim']}", "",
                  f"**rmfast:** {f['summary']} (**{verdict(f['holds'])}**)", ""]
        for name in f["files"]:
            lines.append(f"![{name}]({name})" if name.endswith(".png") else f"- [{name}]({name})")
    lines += ["", "## What the published data does not allow", "", "| paper | figure | why |",
              "|---|---|---|"]
    lines += [f"| {p} | {fig} | {why} |" for p, fig, why in _not_reproducible(papers)]
    return "\n".join(lines) + "\n"


def index_html(findings: list[dict], data_dir: Path, papers=PAPERS) -> str:
    """The index as one HTML page: the summary table (each row links to its finding), then each
    figure beside the paper's statement and the verdict, then what the data does not allow."""
    e = html.escape
    color = {True: "#1a7f37", False: "#cf222e"}
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>rmfast reproduce</title>"
             "<style>body{font-family:sans-serif;max-width:1300px;margin:auto;padding:0 1em}"
             ".f{display:flex;gap:1em;border-top:1px solid #ccc;padding:1em 0}"
             ".t{flex:0 0 380px}.i{flex:1 1 0;min-width:0}.i img{max-width:100%;height:auto}"
             "table.s{border-collapse:collapse;font-size:14px;margin:1em 0}"
             "table.s td,table.s th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;"
             "text-align:left}table.s td.v{white-space:nowrap;font-weight:bold}"
             # a figure never widens the page: it shrinks to the space beside its text, or below it
             "@media (max-width:900px){.f{flex-direction:column}.t{flex:none}}</style></head><body>",
             f"<h1>rmfast reproduce</h1><p>Data: <code>{e(str(data_dir))}</code></p>",
             "<h2>Summary</h2><table class='s'><tr><th>id</th><th>finding</th><th>verdict</th>"
             "<th>summary</th></tr>"]
    for f in findings:
        short = f["summary"] if len(f["summary"]) <= 240 else f["summary"][:237] + "..."
        parts.append(f"<tr><td><a href='#{e(f['id'])}'>{e(f['id'])}</a></td><td>{e(f['title'])}"
                     f"</td><td class='v' style='color:{color.get(f['holds'], '#555')}'>"
                     f"{e(verdict(f['holds']))}</td><td>{e(short)}</td></tr>")
    parts.append("</table>")
    for f in findings:
        v = verdict(f["holds"])
        imgs = "".join(f"<img src='{e(n)}' alt='{e(n)}'>" for n in f["files"] if n.endswith(".png"))
        links = " ".join(f"<a href='{e(n)}'>{e(n)}</a>" for n in f["files"] if not n.endswith(".png"))
        parts.append(f"<div class='f' id='{e(f['id'])}'><div class='t'><h3>{e(f['id'])}: "
                     f"{e(f['title'])}</h3><p><b>Paper:</b> {e(f['paper_claim'])}</p>"
                     + (f"<p><b style='color:{color[f['holds']]}'>{e(v)}</b>: " if f["holds"]
                        in color else "<p>")  # no verdict: the summary alone, no "—:"
                     + f"{e(f['summary'])}</p><p>{links}</p></div><div class='i'>{imgs}</div></div>")
    parts.append("<h2 id='not-reproducible'>What the published data does not allow</h2>"
                 "<table class='s'><tr><th>paper</th><th>figure</th><th>why</th></tr>")
    parts += [f"<tr><td>{e(p)}</td><td>{e(fig)}</td><td>{e(why)}</td></tr>"
              for p, fig, why in _not_reproducible(papers)]
    parts.append("</table></body></html>")
    return "\n".join(parts)
