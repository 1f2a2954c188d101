"""The analyses, one line each: name (as ``rmfast analyze NAME``), function, the papers' figure, one line.

A new analysis is one module and one line here. The function is named as ``"module:function"`` under
:mod:`rmfast.analysis` and imported when first used, so the CLI builds its parser (``rmfast analyze
--help``) from this list without importing pandas or any analysis. ``rmfast analyze NAME`` runs an
analysis that takes only the scans (and ``models``/``prompts``) with no further wiring; the CLI, the report
(section titles) and the ``rmfast.analysis`` docstring's table read this list, and ``rmfast reproduce``
reads :data:`PAPERS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Analysis:
    """One registered analysis."""

    name: str  # the CLI name: rmfast analyze NAME
    function: str  # "module:function" under rmfast.analysis
    figure: str  # the papers' figure it reproduces ("" if none)
    title: str  # one line: what it shows (the report's section title)

    def load(self):
        """The function itself (imports its module)."""
        return _load(self.function)


def _load(ref: str):
    """``"module:function"`` under rmfast.analysis -> the function."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), attr)


ANALYSES = (
    Analysis("distributions", "paper_a.distributions:distributions", "A Fig. 1 (violins)", "Score distributions"),
    Analysis("agreement", "paper_a.agreement:agreement", "A Fig. 2 (tau, MDS, RSA)", "Agreement between models"),
    Analysis("sentiment", "paper_a.sentiment:sentiment", "A Fig. 3A–C (framing)", "Sentiment and framing"),
    Analysis("exposure", "paper_a.exposure:exposure", "A Fig. 3D (mere exposure)", "Mere exposure"),
    Analysis("best-worst", "paper_a.best_worst:best_worst", "A Fig. 4", "Best vs worst prompt"),
    Analysis("human", "paper_a.human:human_comparison", "A Fig. 5 (EloEverything)", "Comparison with human preferences"),
    Analysis("categories", "paper_b.categories:categories", "B Fig. 1 (Big Two, MFD 2.0)", "Dictionary categories"),
    Analysis("extremes", "paper_a.extremes:extremes", "A/B top/bottom tables", "Top and bottom tokens per model × prompt"),
    Analysis("trajectory", "paper_b.trajectory:trajectory", "B Figs. 4-5 (training runs)", "Value trajectories over training checkpoints"),
    Analysis("similarity", "representations.similarity:similarity", "", "Layer × layer similarity of hidden states"),
    Analysis("lens", "representations.lens:lens", "", "The reward lens: the depth at which the top and bottom form"),
)

BY_NAME = {a.name: a for a in ANALYSES}

#: ``rmfast reproduce``: paper letter -> "module:function" regenerating its figures from the published data
PAPERS = {"a": "paper_a.reproduce:reproduce_paper_a", "b": "paper_b.reproduce:reproduce_paper_b"}


def names() -> tuple[str, ...]:
    """The registered analyses' names, in registry order."""
    return tuple(a.name for a in ANALYSES)


def load_paper(letter: str):
    """The reproduce function of paper ``letter`` (imports its module)."""
    return _load(PAPERS[letter])


def table(rst: bool = True) -> str:
    """The registry as a table: reStructuredText (the package docstring's) or plain text (CLI help)."""
    rows = [(a.name, *([f":func:`~{__package__}.{a.function.replace(':', '.')}`"] if rst else []),
             a.figure or "—", a.title) for a in ANALYSES]
    head = ("name (CLI)", *(["function"] if rst else []), "papers' figure", "what it shows")
    widths = [max(len(r[i]) for r in [*rows, head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    rule = "  ".join("=" * w for w in widths)
    body = [line(head), *(line(r) for r in rows)]
    return "\n".join([rule, body[0], rule, *body[1:], rule] if rst else body)
