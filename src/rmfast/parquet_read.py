"""Reading a result Parquet back, checked: its pages against their checksums (:func:`rmfast.io.write_parquet` writes
them), its text as UTF-8, its footer's two copies of the column names against each other. A flipped byte was read
as another score without a word, or as a traceback deep in the explorer; it is a one-line UserError here."""

from __future__ import annotations

import os

from .errors import UserError


def read_parquet(path: str | os.PathLike, columns=None):
    """A Parquet file as a DataFrame, its pages checked against their checksums (:func:`write_parquet` writes them;
    files without any are read unchecked) and its text checked to be UTF-8: a flipped byte was read as another
    score without a word, or as a traceback deep in the explorer. A damaged file is a one-line UserError; what
    is no Parquet at all raises as pyarrow does (the callers name it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def damaged(e):
        return UserError(f"{path} is damaged ({str(e).splitlines()[0][:200]}): its bytes changed after it was "
                         "written; rerun the job that wrote it")

    try:
        table = pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:  # a page's checksum, or a footer no longer one between intact magic
        if "checksum" in str(e) or (_parquet_magic(path) and "FieldRef" not in str(e)):  # (not: a column absent)
            raise damaged(e) from None
        raise
    try:
        table.validate(full=True)
        meta = table.schema.pandas_metadata  # the column names twice in the footer: a flip in one shows
        if columns is None and meta and _renamed(meta["columns"], table.schema.names):
            raise ValueError("a column's name differs between its schema and its pandas metadata")
        return table.to_pandas()
    except Exception as e:  # noqa: BLE001 - invalid UTF-8; a schema's pandas metadata no longer JSON, or its keys
        raise damaged(e) from None


def _renamed(meta_columns: list, names: list) -> bool:
    """Whether a name was changed in one of the footer's two copies: a string-named column whose metadata ``name``
    is not its ``field_name``, or a schema name missing from the metadata while a metadata field is missing from
    the schema (an index's ``name`` is None, and a table pyarrow edited may hold stale extra metadata: neither is)."""
    fields = {c.get("field_name", c["name"]) for c in meta_columns}
    if any(isinstance(c["name"], str) and c["name"] != c.get("field_name", c["name"]) for c in meta_columns):
        return True
    return bool(fields - set(names)) and bool(set(names) - fields)


def _parquet_magic(path) -> bool:
    """Whether ``path`` begins and ends with Parquet's magic bytes (a file cut short does not end with them)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            return head == b"PAR1" and f.read(4) == b"PAR1"
    except OSError:
        return False
