"""The common shape of every analysis result.

A result is a dataclass of tidy DataFrames. ``table`` is the main one (what
``rmfast analyze NAME --out x.csv`` writes); :meth:`Result.tables` lists them all by name
(``--table NAME`` picks another). ``dropped`` and ``notes`` come from the analysis'
:class:`~rmfast.analysis.data.ledger.Ledger`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pandas as pd

from .ledger import DROP_COLUMNS, Ledger


@dataclass(kw_only=True)
class Result:
    """Base class: subclasses add DataFrame fields; the first one is the main table."""

    dropped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DROP_COLUMNS))
    notes: list[str] = field(default_factory=list)

    def tables(self) -> dict[str, pd.DataFrame]:
        """All DataFrame fields by name, main table first, ``dropped`` last."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if isinstance(getattr(self, f.name), pd.DataFrame) and f.name != "dropped"}
        out["dropped"] = self.dropped
        return out

    @classmethod
    def table_names(cls) -> list[str]:
        """The names :meth:`tables` gives, from the class alone (its DataFrame fields): what ``--table`` may
        name, checked before the analysis runs.

        >>> from rmfast.analysis.representations.similarity import SimilarityResult
        >>> SimilarityResult.table_names()[-1]
        'dropped'
        """
        names = [f.name for f in fields(cls) if "DataFrame" in str(f.type) and f.name != "dropped"]
        return names + ["dropped"]

    @classmethod
    def check_table(cls, name: str | None, what: str) -> None:
        """One line where ``name`` is not one of :meth:`table_names` (None: the main table)."""
        names = cls.table_names()
        if name is not None and name not in names:
            from ...errors import UserError

            raise UserError(f"{what} has no table {name!r}; choose one of {names}")

    @property
    def table(self) -> pd.DataFrame:
        """The main tidy table."""
        return next(iter(self.tables().values()))

    def take_ledger(self, ledger: Ledger) -> None:
        self.dropped = ledger.frame()
        self.notes = list(ledger.notes)
