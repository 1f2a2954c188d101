"""Text candidates: responses of any length, read from files and tokenized in context.

:func:`rmfast.scoring.pipeline.score_texts` scores them, the text counterpart of :func:`rmfast.scoring.pipeline.scan`. Each text is placed in the
assistant turn and tokenized exactly as ``apply_chat_template(tokenize=True)`` tokenizes the whole
conversation (:func:`rmfast.template.response_ids`); the ids between the template's prefix and
suffix are the response. Rows are grouped by response length (no padding ever) and go through the
same shared-prompt :class:`~rmfast.fast.engine.Engine` as token scans, or through the plain-HF path for
architectures off the fast path.

Compatibility mode ``compat="decode-retokenize"`` reproduces the published pipeline's decode round
trip: the vocabulary is decoded id by id (``tokenizer.decode([id])``) and each string is put into
the conversation, which is re-tokenized as a whole; the score is that of the whole re-tokenized
sequence, whatever ids it holds. Default mode scores the id itself (token scans) and refuses a text
that merges with the template around it; compat mode scores such rows anyway (plain-HF path).

``compat="authors"`` reproduces the published scoring loop itself (paper A's
``generate_reward_model_scores.py``), all three of its quirks: (a) the decode round trip above;
(b) the conversation rendered as TEXT (``apply_chat_template(tokenize=False)``) and re-tokenized
with the tokenizer's special tokens, so a BOS already in the rendered template gets a second one;
(c) batches of ``batch_size`` consecutive candidates padded together with the tokenizer's pad token
(its padding side) and read by the model's own pooling, which finds "the last token that is not
``config.pad_token_id``": where the config's pad differs from the tokenizer's, the shorter rows of a
batch are read at a pad position. :func:`authors_batches` builds those batches; the plain-HF
:func:`rmfast.scoring.hf_path.authors_scores` scores one.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..dims import text_config
from ..errors import UserError
from ..io import file_sha256

DEFAULT_MAX_TOKENS = 256  # response tokens per candidate; --max-tokens raises it
from .options import COMPAT_MODES  # noqa: E402  (its one definition)
#: rows padded together per reward model in the published scoring loop (paper A's config/reward_models.yaml);
#: ``--compat authors`` with ``--batch-size auto`` uses these, and AUTHORS_BATCH_SIZE for any other model.

_FORMATS = {".csv": "csv", ".dicx": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}


# --------------------------------------------------------------------------------------------
# reading candidate files


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
    texts, rows, n_blank, dups = _dedupe(values)
    if not texts:
        raise UserError(f"candidate file {p} holds no candidates (only blank entries)")
    nulls = [i for i, v in enumerate(values, 1) if v is None or (isinstance(v, float) and np.isnan(v))]
    if nulls:  # a missing value in a table: said, not dropped silently (blank lines of a text file are not news)
        shown = ", ".join(map(str, nulls[:5])) + (" …" if len(nulls) > 5 else "")
        warnings.warn(f"rmfast: {p.name}: {len(nulls)} candidate row(s) with no value (null) left out (rows {shown}; "
                      "1-based, header not counted)", stacklevel=2)
    if dups:
        shown = ", ".join(repr(d) for d in dups[:3]) + (" …" if len(dups) > 3 else "")
        warnings.warn(f"rmfast: {p.name}: {len(dups)} duplicate candidate(s) kept once ({shown})", stacklevel=2)
    source = {
        "path": str(p),
        "format": kind,
        "column": None if col_used is None else str(col_used),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "n_read": len(values),
        "n_blank": n_blank,
        "n_null": len(nulls),
        "n_duplicates": len(dups),
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
            df = pd.read_parquet(p)
        else:
            df = pd.read_csv(p, sep="," if kind == "csv" else "\t", dtype=str, keep_default_na=False,
                             na_filter=False, header=0 if header else None, encoding="utf-8-sig",
                             quoting=3 if kind == "tsv" else 0)
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


def _dedupe(values: list) -> tuple[list[str], list[int], int, list[str]]:
    """Stripped, non-blank values, each once (first occurrence): (texts, 1-based rows, blanks, duplicates dropped)."""
    texts: list[str] = []
    rows: list[int] = []
    seen: dict[str, int] = {}
    dups: list[str] = []
    n_blank = 0
    for i, v in enumerate(values, 1):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            n_blank += 1
            continue
        s = str(v).strip()
        if not s:
            n_blank += 1
            continue
        if s in seen:
            dups.append(s)
            continue
        seen[s] = i
        texts.append(s)
        rows.append(i)
    return texts, rows, n_blank, dups


# --------------------------------------------------------------------------------------------
# tokenization in context


@dataclass
class Row:
    ids: list[int]  # response ids (between the prefix and the suffix)
    template: object = None  # None: the shared template; else a per-row Template (compat rows that do not split)


def _compat_row(tmpl, full: list[int], head: str) -> Row:
    """A decode-retokenize row: the whole re-tokenized conversation, split where it can be."""
    from ..template import Template, common_prefix_len

    P, S = len(tmpl.prefix_ids), len(tmpl.suffix_ids)
    if tuple(full[:P]) == tmpl.prefix_ids and (not S or tuple(full[len(full) - S:]) == tmpl.suffix_ids) and len(full) > P + S:
        return Row(full[P:len(full) - S])
    # The response merged with its surroundings (e.g. "\t" after the header's "\n"): score the
    # whole sequence on the plain-HF path, split where it leaves the template's prefix and where
    # the template's suffix starts. Score head: final position of the whole sequence. Logprob
    # head: every token from the split up to the end of the end-of-turn continuation.
    p = common_prefix_len([list(tmpl.prefix_ids), full])
    has_suffix = bool(S) and len(full) - S > p and tuple(full[len(full) - S:]) == tmpl.suffix_ids
    e = len(full) - S if has_suffix else len(full)
    p = max(1, min(p, e - 1))
    t = Template(prefix_ids=tuple(full[:p]), suffix_ids=tuple(full[e:]),
                 n_continuation=tmpl.n_continuation if has_suffix else 0, prompt=tmpl.prompt,
                 system=tmpl.system, kind=tmpl.kind, format=tmpl.format, history=tmpl.history)
    return Row(full[p:e], t)


def tokenize_in_context(tokenizer, tmpl, texts: list[str], *, compat: str | None = None, head: str = "score") -> list[Row]:
    """Response ids of each text as the chat template tokenizes it in context (linear in the texts)."""
    from ..template import renderer, response_ids

    if compat is None:
        rows = []
        for i, t in enumerate(texts):
            try:
                rows.append(Row(response_ids(tokenizer, tmpl, t)))
            except UserError:
                raise UserError(f"candidate {i + 1} {t[:40]!r} merges with the template around it when tokenized in "
                                "context, so its ids are not its own; drop it, or score the whole re-tokenized "
                                "conversation with --compat decode-retokenize") from None
        return rows
    _, render = renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system, tmpl.history)
    return [_compat_row(tmpl, render(t), head) for t in texts]  # authors rows: the same response ids


# --------------------------------------------------------------------------------------------
# the authors' scoring loop (compat="authors")


def render_text(tokenizer, tmpl, response: str) -> str:
    """The conversation as TEXT, as the published loop renders it (``apply_chat_template(tokenize=False)``,
    no generation prompt; a plain format filled in). Re-tokenizing it adds the tokenizer's specials.

    Example:
        >>> render_text(tok, tmpl, "love")  # doctest: +SKIP
        '<|im_start|>system\\n...<|im_start|>assistant\\nlove<|im_end|>\\n'
    """
    from ..template import is_plain_format

    fmt = tmpl.format
    if fmt is not None and is_plain_format(fmt):
        return fmt.replace("{system}", tmpl.system or "").replace("{prompt}", tmpl.prompt).replace("{response}", response)
    messages = ([{"role": "system", "content": tmpl.system}] if tmpl.system is not None else []) + [
        {"role": "user", "content": tmpl.prompt}, {"role": "assistant", "content": response}]
    return tokenizer.apply_chat_template(messages, chat_template=fmt, tokenize=False)



def tokenizer_order(tokenizer) -> dict[int, int]:
    """Position of each id in the published loop's vocabulary order (``sorted(get_vocab().items(), by id)``)."""
    return {i: k for k, i in enumerate(sorted(set(int(v) for v in tokenizer.get_vocab().values())))}



def ids_digest(rows: list[Row]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(np.asarray(r.ids, dtype=np.int64).tobytes())
        h.update(b"|" if r.template is None else b"#" + np.asarray(r.template.prefix_ids, dtype=np.int64).tobytes())
    return h.hexdigest()


def max_positions(model) -> int | None:
    """The model's context length (``max_position_embeddings`` of its text config), None if it has none."""
    n = getattr(text_config(model.config), "max_position_embeddings", None)
    return None if n is None else int(n)


def max_response_len(model, tmpl) -> int | None:
    n = max_positions(model)
    return None if n is None else n - len(tmpl.prefix_ids) - len(tmpl.suffix_ids)


def check_context(model, n_prefix: int, n_response: int = 1, n_suffix: int = 0) -> None:
    """UserError unless prompt side + response + suffix fit the model's positions.

    A longer sequence would be scored silently past the positions the model was trained on (or
    fail inside attention); scan, text scans, logprobs, GCG, implicit and sweeps all call this.

    >>> from types import SimpleNamespace
    >>> m = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    >>> check_context(m, 500, 1, 5)
    >>> check_context(m, 4031, 1, 5)
    Traceback (most recent call last):
    rmfast.errors.UserError: the sequence is 4031 prompt + 1 response + 5 suffix = 4037 tokens, over the model's 512 positions (max_position_embeddings): shorten --prompt, --system or --template
    """
    limit = max_positions(model)
    total = n_prefix + n_response + n_suffix
    if limit is not None and total > limit:
        raise UserError(f"the sequence is {n_prefix} prompt + {n_response} response + {n_suffix} suffix = {total} tokens, "
                        f"over the model's {limit} positions (max_position_embeddings): shorten --prompt, --system "
                        "or --template")
