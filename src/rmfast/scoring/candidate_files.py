"""Text candidates read from files: one per line, or a CSV/TSV/Parquet column (:func:`read_candidates`), unique and
non-empty, with what was left out said. :func:`rmfast.scoring.pipeline.score_texts` scores them."""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..parquet_read import read_parquet

_FORMATS = {".csv": "csv", ".dicx": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass
class Candidates:
    """Response texts read from a file: unique, non-empty, in file order.

    Attributes:
        texts: the candidates (surrounding whitespace stripped; blank entries dropped).
        rows: 1-based line (text files) or data-row (CSV/Parquet) number of each text.
        source: path, format, column, sha256 of the file, and counts of what was dropped.
    """

    texts: list[str]
    rows: list[int]
    source: dict = field(default_factory=dict)


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in ("lines", "csv", "tsv", "parquet"):
            raise UserError(f"unknown candidate format {fmt!r}; use lines, csv, tsv or parquet")
        return fmt
    return _FORMATS.get(path.suffix.lower(), "lines")


def _names(cols, n: int = 30) -> str:
    """Column names for a message: all of them, or the first n and how many more."""
    names = ", ".join(repr(str(c)) for c in cols[:n])
    return names + (f", … ({len(cols) - n} more)" if len(cols) > n else "")


def read_candidates(path: str | os.PathLike, column: str | int | None = None, *, fmt: str | None = None,
                    header: bool = True) -> Candidates:
    """Read response texts from a text file (one per line), a CSV/TSV column or a Parquet column.

    Args:
        path: the file. ``.csv``/``.dicx`` are CSV, ``.tsv`` tab-separated, ``.parquet`` Parquet,
            anything else one candidate per line (UTF-8).
        column: the column holding the texts (required when a table has more than one column);
            with ``header=False`` a 0-based column number.
        fmt: override the format: "lines", "csv", "tsv" or "parquet".
        header: whether a CSV/TSV file has a header row (default True).

    Duplicates are kept once (first occurrence) and reported with a warning; blank entries are
    dropped. Raises UserError for a missing, unreadable or empty file or an unknown column.

    Example:
        >>> c = read_candidates("../shared/data/eloeverything/What, in one word, is the greatest thing ever.csv",
        ...                     column="name")
        >>> len(c.texts)
        7530
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"candidate file {p}: no such file")
    if p.is_dir():
        raise UserError(f"candidate file {p} is a directory; give a text, CSV or Parquet file")
    kind = _format_of(p, fmt)
    if kind == "lines" and column is not None:
        raise UserError(f"--column {column!r} given but {p} is read as a text file with one candidate per line; "
                        "give a .csv/.tsv/.parquet file (or its format)")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read candidate file {p}: {e.strerror}") from None
    if not raw.strip():
        raise UserError(f"candidate file {p} is empty; give one candidate per line (or a CSV/Parquet column)")
    if kind == "lines":
        values, col_used = _read_lines(p, raw), column
    else:
        values, col_used = _read_table_column(p, kind, column, header)
    texts, rows, blank, dups, trimmed = _dedupe(values)
    if not texts:
        raise UserError(f"candidate file {p} holds no candidates (only blank entries)")
    nulls = [i for i in blank if _is_null(values[i - 1])]
    # a table's row with no value (null) or only whitespace: said, not dropped silently (a text file's blank lines
    # are not news: they separate or end its lines)
    empty = [] if kind == "lines" else [i for i in blank if not _is_null(values[i - 1])]
    if nulls or empty:
        left = sorted(nulls + empty)
        shown = ", ".join(map(str, left[:5])) + (" …" if len(left) > 5 else "")
        what = " and ".join(w for w, n in (("with no value (null)", nulls), ("blank", empty)) if n)
        warnings.warn(f"rmfast: {p.name}: {len(left)} candidate row(s) {what} left out (rows {shown}; "
                      "1-based, header not counted)", stacklevel=2)
    if trimmed:  # " ever" is another response than "ever" to a BPE tokenizer: said, not done silently
        shown = ", ".join(_quote(t) for t in trimmed[:3]) + (" …" if len(trimmed) > 3 else "")  # a line of 1 MB too
        warnings.warn(f"rmfast: {p.name}: {len(trimmed)} candidate(s) had spaces around them, scored without them "
                      f"({shown}; ' ever' is scored as 'ever')", stacklevel=2)
    if dups:
        shown = ", ".join(_quote(d) for d in dups[:3]) + (" …" if len(dups) > 3 else "")
        warnings.warn(f"rmfast: {p.name}: {len(dups)} duplicate candidate(s) kept once ({shown})", stacklevel=2)
    source = {
        "path": str(p),
        "format": kind,
        "column": None if col_used is None else str(col_used),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "n_read": len(values),
        "n_blank": len(blank),
        "n_null": len(nulls),
        "n_duplicates": len(dups),
        "n_stripped": len(trimmed),
        "duplicates": sorted(set(dups))[:50],
        "n_candidates": len(texts),
    }
    return Candidates(texts, rows, source)


def _read_lines(p: Path, raw: bytes) -> list[str]:
    """A text file's lines (UTF-8, a BOM allowed); UserError for a binary or non-UTF-8 file."""
    if b"\x00" in raw:
        raise UserError(f"candidate file {p} is binary, not text; give one candidate per line in UTF-8 "
                        "(or a .csv/.parquet file)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"candidate file {p} is not UTF-8 text (bad byte at offset {e.start}); re-save it as UTF-8") from None
    return text.splitlines()


def _read_table_column(p: Path, kind: str, column: str | int | None, header: bool) -> tuple[list, str | int]:
    """One column of a CSV/TSV/Parquet file: (its values, the column used)."""
    import pandas as pd

    try:
        if kind == "parquet":
            df = read_parquet(p)
        else:
            df = pd.read_csv(p, sep="," if kind == "csv" else "\t", dtype=str, keep_default_na=False,
                             na_filter=False, header=0 if header else None, encoding="utf-8-sig",
                             quoting=3 if kind == "tsv" else 0)
    except UserError:  # damaged: said so
        raise
    except Exception as e:  # pandas/pyarrow raise many types for a malformed file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read candidate file {p} as {kind.upper()}: {msg[:200]}") from None
    cols = list(df.columns)
    if column is None:
        if len(cols) != 1:
            raise UserError(f"candidate file {p} has {len(cols)} columns ({_names(cols)}); "
                            "pick one with --column NAME (column: in a sweep config)")
        col_used = cols[0]
    else:
        key = column
        if not header and isinstance(column, str) and column.isdigit():
            key = int(column)
        if key not in cols:
            raise UserError(f"candidate file {p} has no column {column!r}; its columns are {_names(cols)}")
        col_used = key
    return df[col_used].tolist(), col_used


def _quote(text: str, n: int = 40) -> str:
    """``text`` quoted for a note, cut at ``n`` characters with a mark of the cut (a 1 MB line was quoted whole).

    >>> _quote("word " * 20, 10), _quote("Love")
    ("'word word '…", "'Love'")
    """
    return repr(text[:n]) + ("…" if len(text) > n else "")


def _is_null(v) -> bool:
    """A table's missing value (None, or NaN from a numeric column)."""
    return v is None or (isinstance(v, float) and np.isnan(v))


def _dedupe(values: list) -> tuple[list[str], list[int], list[int], list[str], list[str]]:
    """Stripped, non-blank values, each once (first occurrence): (texts, their 1-based rows, the blank (or null)
    values' 1-based rows, duplicates dropped, the values that had whitespace around them)."""
    texts: list[str] = []
    rows: list[int] = []
    seen: dict[str, int] = {}
    dups: list[str] = []
    blank: list[int] = []
    trimmed: list[str] = []
    for i, v in enumerate(values, 1):
        s = "" if _is_null(v) else str(v).strip()
        if not s:
            blank.append(i)
            continue
        if s != str(v).rstrip("\r\n"):
            trimmed.append(str(v).rstrip("\r\n"))
        if s in seen:
            dups.append(s)
            continue
        seen[s] = i
        texts.append(s)
        rows.append(i)
    return texts, rows, blank, dups, trimmed
