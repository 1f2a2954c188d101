"""Atomic file writes and output-path checks. Nothing half-written is ever left under the final name."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from .errors import UserError


def check_output(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an existing output (unless overwrite) or an unwritable location, before any work is done."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise UserError(f"output {p} already exists; pass --overwrite to replace it or choose another --out")
    if p.exists() and p.is_dir():
        raise UserError(f"output {p} is a directory; give a file path such as {p}/scan.parquet")
    parent = p.parent if str(p.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output folder {parent}: {e.strerror}; choose a writable --out") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"cannot write to {parent}: permission denied; choose a writable --out")
    return p


def _temp_beside(path: Path) -> Path:
    """Create an empty, new temporary file in ``path``'s folder, mode 0666 & ~umask (as ``open`` would).

    ``tempfile.mkstemp`` would make it 0600, and the rename would carry that onto the result.
    """
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write(path: str | os.PathLike, write) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file in the same folder, which
    is then renamed over ``path``. Nothing half-written is ever left under the final name, and the
    temporary file is removed if ``write`` fails (or Ctrl-C). The folder is created if missing.

    The file is created as any program would create it: mode 0666 & ~umask (0644 under the
    usual umask 022), not the 0600 of ``tempfile.mkstemp``.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> atomic_write(d / "out" / "a.txt", lambda tmp: Path(tmp).write_text("hello")).read_text()
        'hello'
        >>> def broken(tmp):
        ...     raise ValueError("disk full")
        >>> atomic_write(d / "out" / "a.txt", broken)
        Traceback (most recent call last):
        ...
        ValueError: disk full
        >>> sorted(p.name for p in (d / "out").iterdir())  # the old file, no temporary left
        ['a.txt']
        >>> import shutil; shutil.rmtree(d)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        write(str(tmp))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


#: The former private name; still used by modules being moved (implicit.py, gcg.py, sweep.py, scan.py).
_atomic = atomic_write


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically (temp file in the same folder + rename)."""

    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")

    atomic_write(path, w)


def write_parquet(path: str | os.PathLike, df) -> None:
    """Write a DataFrame to Parquet atomically."""
    atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))


def manifest_path(parquet_path: str | os.PathLike) -> Path:
    """The JSON manifest beside a results Parquet: ``<file>.json``."""
    return Path(str(parquet_path) + ".json")


def write_result(path: str | os.PathLike, df, manifest: dict, overwrite: bool = False) -> Path:
    """A results table: ``path`` (Parquet) and ``path.json`` (manifest), each atomically; refuses an
    existing output unless overwrite."""
    p = check_output(path, overwrite)
    write_parquet(p, df)
    write_json(manifest_path(p), manifest)
    return p
