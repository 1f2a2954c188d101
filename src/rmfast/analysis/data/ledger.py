"""The ledger: every row an analysis leaves out, with how many and why.

Analyses never drop data silently. Each step that removes rows (missing scores,
duplicated decoded strings, tokens not in a lexicon, ...) writes one line to a
:class:`Ledger`; the result carries it as a tidy ``dropped`` table, the CLI prints it to
stderr and the HTML report shows it under the analysis.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pandas as pd

log = logging.getLogger("rmfast.analysis")

#: Columns of :meth:`Ledger.frame`.
DROP_COLUMNS = ["step", "model", "prompt", "rows", "reason"]


@dataclass
class Ledger:
    """Drops (counted rows with a reason) and free-text notes collected by one analysis.

    >>> led = Ledger()
    >>> led.drop("join", 3, "decoded string occurs more than once", model="m")
    >>> led.frame()[["step", "rows"]].values.tolist()
    [['join', 3]]
    """

    drops: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def drop(self, step: str, rows: int, reason: str, *, model: str | None = None,
             prompt: str | None = None) -> None:
        """Record ``rows`` rows removed at ``step`` (nothing is recorded for 0 rows)."""
        rows = int(rows)
        if rows <= 0:
            return
        self.drops.append({"step": step, "model": model, "prompt": prompt, "rows": rows,
                           "reason": reason})
        where = "/".join(x for x in (model, prompt) if x)
        log.info("%s: dropped %d rows%s: %s", step, rows, f" ({where})" if where else "", reason)

    def note(self, message: str) -> None:
        """Record a message about the data (a model left out, a test not run, ...)."""
        if message not in self.notes:
            self.notes.append(message)
            log.info("%s", message)

    def extend(self, other: "Ledger") -> "Ledger":
        """Append another ledger's drops and notes; returns self."""
        self.drops.extend(other.drops)
        for n in other.notes:
            self.note(n)
        return self

    def frame(self) -> pd.DataFrame:
        """Tidy table of the drops: columns step, model, prompt, rows, reason."""
        return pd.DataFrame(self.drops, columns=DROP_COLUMNS)

    def summary(self) -> list[str]:
        """One line per reason: how many rows were left out, and from how many model × prompt scans.

        >>> led = Ledger(); led.drop("validate", 2, "score is missing or not finite", model="a", prompt="p")
        >>> led.drop("validate", 1, "score is missing or not finite", model="b", prompt="p"); led.summary()
        ['3 rows left out (validate: score is missing or not finite; in 2 scans)']
        """
        by: dict = {}
        for d in self.drops:
            n, scans = by.get((d["step"], d["reason"]), (0, set()))
            by[(d["step"], d["reason"])] = (n + d["rows"], scans | {(d["model"], d["prompt"])})
        return [f"{n:,} rows left out ({step}: {reason}; in {len(scans)} scan{'s' if len(scans) > 1 else ''})"
                for (step, reason), (n, scans) in by.items()]

    def total(self) -> int:
        """Total rows dropped."""
        return int(sum(d["rows"] for d in self.drops))
