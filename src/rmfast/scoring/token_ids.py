"""Which vocabulary ids a job was asked for: a half-open range ``A:B``, a file of ids, or ids given in code,
parsed and checked against the vocabulary (:func:`parse_token_ids`), and recorded as asked (:func:`ids_asked`)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..io import file_sha256, read_text


def range_bounds(spec: str, n_vocab: int | None = None) -> tuple[int, int | None]:
    """``A:B`` -> (A, B), an omitted A being 0 and an omitted B ``n_vocab``; a ValueError, worded for the user,
    where it is no range of integers or an empty one (checked before any model is loaded, where the vocabulary
    is not yet known: ``n_vocab`` None).

    >>> range_bounds("5:9"), range_bounds(":9"), range_bounds("5:", 100)
    ((5, 9), (0, 9), (5, 100))
    >>> range_bounds("5:5")
    Traceback (most recent call last):
    ValueError: range 5:5 is empty: A:B is half-open and needs A < B (e.g. 5:6)
    """
    a, _, b = spec.partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else n_vocab
    except ValueError:
        raise ValueError(f"{spec!r} is not a range A:B of integers nor an existing file") from None
    if lo < 0 or (hi is not None and hi < 0):
        raise ValueError(f"range {spec} has a negative id; ids are 0 up to the vocabulary's size")
    if hi is not None and hi <= lo:
        raise ValueError(f"range {lo}:{hi} is empty: A:B is half-open and needs A < B "
                         f"(e.g. {f'{hi}:{lo}' if hi < lo else f'{lo}:{lo + 1}'})")
    return lo, hi


def parse_token_ids(spec, n_vocab: int) -> np.ndarray:
    """``A:B`` (half-open range), a file with one id per line, or an iterable of ints -> sorted unique ids."""
    if spec is None:
        return np.arange(n_vocab, dtype=np.int64)
    if isinstance(spec, str):
        if ":" in spec and not os.path.exists(spec):
            try:
                lo, hi = range_bounds(spec, n_vocab)
            except ValueError as e:
                raise UserError(f"--token-ids {e}") from None
            if not (0 <= lo < hi <= n_vocab):
                raise UserError(f"--token-ids range {lo}:{hi} is outside the vocabulary 0:{n_vocab}")
            return np.arange(lo, hi, dtype=np.int64)
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"--token-ids {spec!r}: no such file (give a file with one id per line, or a range A:B)")
        vals, where = [], []
        for ln, line in enumerate(read_text(path, "--token-ids file").splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            try:
                vals.append(int(s))
            except ValueError:
                raise UserError(f"{spec}:{ln}: {s[:30]!r} is not a token id (one integer per line)") from None
            where.append(f"{spec}:{ln}: ")
        if not vals:
            raise UserError(f"--token-ids file {spec} holds no ids")
    else:
        vals = list(spec)
        where = [""] * len(vals)
    bad = [i for i, v in enumerate(vals) if not 0 <= v < n_vocab]  # Python ints: no int64 overflow before the check
    if bad:
        v = vals[bad[0]]
        shown = v if abs(v) < 10**30 else f"of {abs(v).bit_length()} bits"
        raise UserError(f"{where[bad[0]]}token id {shown} is outside the vocabulary 0:{n_vocab} ({len(bad)} such ids): "
                        f"give ids from 0 to {n_vocab - 1}")
    ids, counts = np.unique(np.array(vals, dtype=np.int64), return_counts=True)
    if (counts > 1).any():  # said, as repeated text candidates are: a file of 7 ids that scores 5 is not silent
        rep = ids[counts > 1]
        shown = ", ".join(map(str, rep[:5])) + (" …" if rep.size > 5 else "")
        warnings.warn(f"rmfast: {spec if isinstance(spec, str) else '--token-ids'}: {int((counts - 1).sum())} repeated "
                      f"id(s) scored once ({shown})", stacklevel=2)
    return ids


def ids_asked(token_ids, n: int = 0):
    """The ids a job was asked for, as its manifest records them: ``all``, the range ``A:B``, a file (path and
    sha256) or, for ids given in code, their count ``n``.

    >>> ids_asked(None), ids_asked("0:100"), ids_asked([3, 1], 2)
    ('all', '0:100', '2 ids given')
    """
    if token_ids is None:
        return "all"
    if isinstance(token_ids, str):
        p = Path(token_ids)
        return {"file": str(p.resolve()), "sha256": file_sha256(p)} if p.is_file() else token_ids
    return f"{n} ids given"
