"""A user's own input files (a --token-ids file, a lexicon, a metadata CSV, a prompts YAML): read as text, or as a
CSV, with one-line errors naming the option for a missing, binary, non-UTF-8 or malformed file."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UserError


def read_text(path: str | os.PathLike, what: str) -> str:
    """A user's text file as a str (UTF-8, a BOM allowed); one-line UserError for a missing, binary or
    non-UTF-8 file. ``what`` names the option in the message, e.g. "--token-ids file".

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "ids.txt"
    >>> _ = p.write_bytes(b"\\x00\\x89PNG")
    >>> read_text(p, "--token-ids file")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    rmfast.errors.UserError: token_ids file ... is binary, not text; give a UTF-8 text file
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {what} {p}: {e.strerror}") from None
    if b"\x00" in raw:
        raise UserError(f"{what} {p} is binary, not text; give a UTF-8 text file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {p} is not UTF-8 text (bad byte at offset {e.start}); re-save it as UTF-8") from None


def read_csv(path: str | os.PathLike, what: str, **kw):
    """A user's CSV as a DataFrame (``pandas.read_csv`` keywords); one-line UserError for a missing,
    binary, non-UTF-8, empty or malformed file (rows with the wrong number of fields)."""
    import io

    import pandas as pd

    text = read_text(path, what)
    try:
        return pd.read_csv(io.StringIO(text), **kw)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"{what} {path} is not a well-formed CSV ({msg[:160]}); fix the file") from None
