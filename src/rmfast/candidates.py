"""Text candidates: responses of any length, read from files, tokenized in context, scored exactly.

``score_texts`` is the text counterpart of :func:`rmfast.scan.scan`. Each text is placed in the
assistant turn and tokenized exactly as ``apply_chat_template(tokenize=True)`` tokenizes the whole
conversation (:func:`rmfast.template.response_ids`); the ids between the template's prefix and
suffix are the response. Rows are grouped by response length (no padding ever) and go through the
same shared-prompt :class:`~rmfast.engine.Engine` as token scans, or through the plain-HF path for
architectures off the fast path.

Compatibility mode ``compat="decode-retokenize"`` reproduces the published pipeline: the
vocabulary is decoded id by id (``tokenizer.decode([id])``) and each string is put into the
conversation, which is re-tokenized as a whole; the score is that of the whole re-tokenized
sequence, whatever ids it holds. Default mode scores the id itself (token scans) and refuses a text
that merges with the template around it; compat mode scores such rows anyway (plain-HF path).

Vocabulary views (:func:`vocab_ids`): drop special/added tokens, keep "word-like" tokens only, and
the papers' de-duplication (ids whose decoded strings occur more than once are all dropped).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .errors import UserError
from .io import manifest_path, write_result

DEFAULT_MAX_TOKENS = 256  # response tokens per candidate; --max-tokens raises it
COMPAT_MODES = ("decode-retokenize",)
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


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in ("lines", "csv", "tsv", "parquet"):
            raise UserError(f"unknown candidate format {fmt!r}; use lines, csv, tsv or parquet")
        return fmt
    return _FORMATS.get(path.suffix.lower(), "lines")


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
    values: list = []
    col_used = column
    if kind == "lines":
        if b"\x00" in raw:
            raise UserError(f"candidate file {p} is binary, not text; give one candidate per line in UTF-8 "
                            "(or a .csv/.parquet file)")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise UserError(f"candidate file {p} is not UTF-8 text (bad byte at offset {e.start}); re-save it as UTF-8") from None
        values = text.splitlines()
    else:
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
                raise UserError(f"candidate file {p} has {len(cols)} columns {[str(c) for c in cols][:12]}; "
                                "pick one with --column NAME (column: in a sweep config)")
            col_used = cols[0]
        else:
            key = column
            if not header and isinstance(column, str) and column.isdigit():
                key = int(column)
            if key not in cols:
                raise UserError(f"candidate file {p} has no column {column!r}; its columns are {[str(c) for c in cols][:12]}")
            col_used = key
        values = df[col_used].tolist()
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
    if not texts:
        raise UserError(f"candidate file {p} holds no candidates (only blank entries)")
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
        "n_duplicates": len(dups),
        "duplicates": sorted(set(dups))[:50],
        "n_candidates": len(texts),
    }
    return Candidates(texts, rows, source)


# --------------------------------------------------------------------------------------------
# vocabulary views


def _decoded(tokenizer, ids) -> list[str]:
    return tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def is_wordlike(text: str) -> bool:
    """Letters only, after stripping the leading-space marker (one leading space once decoded).

    >>> [is_wordlike(t) for t in [" love", "love", "Ünïcödé", " 42", "don't", "  two", ""]]
    [True, True, True, False, False, False, False]
    """
    s = text[1:] if text.startswith(" ") else text
    return bool(s) and s.isalpha()


def vocab_ids(tokenizer, n_vocab: int, *, token_ids=None, exclude_special: bool = False, wordlike: bool = False,
              dedup: bool = False) -> tuple[np.ndarray, dict]:
    """Vocabulary ids of a view, ascending, and a report of what each filter dropped.

    Args:
        tokenizer, n_vocab: the model's tokenizer and the ids both it and the embeddings know.
        token_ids: start from a subset (range "A:B", a file, or ids; default all).
        exclude_special: drop special, reserved and added tokens.
        wordlike: keep tokens that decode to letters only after stripping one leading space (the
            decoded leading-space marker: GPT-2's "Ġ", SentencePiece's "▁").
        dedup: the papers' de-duplication: decode the (remaining) ids and drop EVERY id whose string
            occurs more than once among them (exact decoded text; byte-fallback pieces that all decode
            to "\\ufffd" go this way).
    """
    from .scan import parse_token_ids, special_ids

    ids = parse_token_ids(token_ids, n_vocab)
    report = {"n_start": int(ids.size), "exclude_special": exclude_special, "wordlike": wordlike, "dedup": dedup}
    if exclude_special:
        sp = np.fromiter(special_ids(tokenizer), dtype=np.int64)
        keep = ~np.isin(ids, sp)
        report["dropped_special"] = int((~keep).sum())
        ids = ids[keep]
    texts = _decoded(tokenizer, ids) if (wordlike or dedup) and ids.size else []
    if wordlike:
        keep = np.array([is_wordlike(t) for t in texts], dtype=bool)
        report["dropped_not_wordlike"] = int((~keep).sum())
        ids = ids[keep]
        texts = [t for t, k in zip(texts, keep) if k]
    if dedup:
        from collections import Counter

        counts = Counter(texts)
        keep = np.array([counts[t] == 1 for t in texts], dtype=bool)
        report["dropped_duplicate_text"] = int((~keep).sum())
        report["duplicate_strings"] = sum(1 for c in counts.values() if c > 1)
        ids = ids[keep]
    report["n_ids"] = int(ids.size)
    if ids.size == 0:
        raise UserError("the vocabulary view is empty after its filters (special / word-like / de-duplication)")
    return ids, report


# --------------------------------------------------------------------------------------------
# tokenization in context


@dataclass
class _Row:
    ids: list[int]  # response ids (between the prefix and the suffix)
    template: object = None  # None: the shared template; else a per-row Template (compat rows that do not split)


def _compat_row(tmpl, full: list[int], head: str) -> _Row:
    """A decode-retokenize row: the whole re-tokenized conversation, split where it can be."""
    from .template import Template, _common_prefix_len

    P, S = len(tmpl.prefix_ids), len(tmpl.suffix_ids)
    if tuple(full[:P]) == tmpl.prefix_ids and (not S or tuple(full[len(full) - S:]) == tmpl.suffix_ids) and len(full) > P + S:
        return _Row(full[P:len(full) - S])
    # The response merged with its surroundings (e.g. "\t" after the header's "\n"): score the
    # whole sequence on the plain-HF path, split where it leaves the template's prefix and where
    # the template's suffix starts. Score head: final position of the whole sequence. Logprob
    # head: every token from the split up to the end of the end-of-turn continuation.
    p = _common_prefix_len([list(tmpl.prefix_ids), full])
    has_suffix = bool(S) and len(full) - S > p and tuple(full[len(full) - S:]) == tmpl.suffix_ids
    e = len(full) - S if has_suffix else len(full)
    p = max(1, min(p, e - 1))
    t = Template(prefix_ids=tuple(full[:p]), suffix_ids=tuple(full[e:]),
                 n_continuation=tmpl.n_continuation if has_suffix else 0, prompt=tmpl.prompt,
                 system=tmpl.system, kind=tmpl.kind, format=tmpl.format)
    return _Row(full[p:e], t)


def tokenize_in_context(tokenizer, tmpl, texts: list[str], *, compat: str | None = None, head: str = "score") -> list[_Row]:
    """Response ids of each text as the chat template tokenizes it in context (linear in the texts)."""
    from .template import _renderer, response_ids

    if compat is None:
        rows = []
        for i, t in enumerate(texts):
            try:
                rows.append(_Row(response_ids(tokenizer, tmpl, t)))
            except UserError:
                raise UserError(f"candidate {i + 1} {t[:40]!r} merges with the template around it when tokenized in "
                                "context, so its ids are not its own; drop it, or score the whole re-tokenized "
                                "conversation with --compat decode-retokenize") from None
        return rows
    _, render = _renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system)
    return [_compat_row(tmpl, render(t), head) for t in texts]


# --------------------------------------------------------------------------------------------
# results


@dataclass
class TextScanResult:
    """Scores of response texts, with everything needed to reproduce them.

    Attributes:
        texts: the candidates, in input order (duplicates removed).
        scores: (N,) float32 rewards or log-probabilities.
        n_tokens: (N,) int64 response length in tokens, as scored.
        token_ids: the response ids scored, one list per text.
        manifest: model, prompt, template ids, head, compat mode, candidate source, timing.
        source_ids: vocabulary ids the texts were decoded from (compat vocabulary scans), else None.

    Example:
        >>> res = score_texts(model, tok, "What is the greatest thing ever?", ["Love", "The universe"])  # doctest: +SKIP
        >>> res.top(2)  # doctest: +SKIP
    """

    texts: list[str]
    scores: np.ndarray
    n_tokens: np.ndarray
    token_ids: list[list[int]]
    manifest: dict = field(default_factory=dict)
    source_ids: np.ndarray | None = None

    def to_pandas(self, token_ids: bool = True):
        """DataFrame: [token_id,] text, n_tokens, score (float32), rank (1 = highest; ties share the best), token_ids."""
        import pandas as pd

        cols = {}
        if self.source_ids is not None:
            cols["token_id"] = np.asarray(self.source_ids, dtype=np.int64)
        cols.update({"text": list(self.texts), "n_tokens": np.asarray(self.n_tokens, dtype=np.int64),
                     "score": np.asarray(self.scores, dtype=np.float32)})
        df = pd.DataFrame(cols)
        df["rank"] = df["score"].rank(ascending=False, method="min").astype(np.int64)
        if token_ids:
            df["token_ids"] = [list(map(int, r)) for r in self.token_ids]
        return df

    def top(self, k: int = 20):
        df = self.to_pandas(token_ids=False)
        return df.sort_values("rank", kind="stable").head(k).reset_index(drop=True)

    def bottom(self, k: int = 20):
        df = self.to_pandas(token_ids=False)
        return df.sort_values("rank", ascending=False, kind="stable").head(k).reset_index(drop=True)

    def to_parquet(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``path`` (Parquet) and ``path.json`` (manifest), each atomically."""
        return write_result(path, self.to_pandas(), self.manifest, overwrite)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike) -> "TextScanResult":
        import pandas as pd

        df = pd.read_parquet(path)
        mp = manifest_path(path)
        manifest = json.loads(mp.read_text()) if mp.exists() else {}
        tids = [list(map(int, r)) for r in df["token_ids"]] if "token_ids" in df else [[] for _ in range(len(df))]
        src = df["token_id"].to_numpy(np.int64) if "token_id" in df else None
        return cls(df["text"].tolist(), df["score"].to_numpy(np.float32), df["n_tokens"].to_numpy(np.int64), tids,
                   manifest, src)


# --------------------------------------------------------------------------------------------
# scoring


def _ids_digest(rows: list[_Row]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(np.asarray(r.ids, dtype=np.int64).tobytes())
        h.update(b"|" if r.template is None else b"#" + np.asarray(r.template.prefix_ids, dtype=np.int64).tobytes())
    return h.hexdigest()


def _max_len(model, tmpl) -> int | None:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(cfg, "max_position_embeddings", None)
    return None if n is None else int(n) - len(tmpl.prefix_ids) - len(tmpl.suffix_ids)


def score_texts(
    model,
    tokenizer,
    prompt: str,
    texts,
    *,
    head: str = "auto",
    head_index: int = 0,
    template=None,
    system: str | None = None,
    batch_size: int | str = "auto",
    progress: bool = True,
    compat: str | None = None,
    model_info: dict | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    engine: str = "auto",
    checkpoint: str | os.PathLike | None = None,
    source_ids=None,
    candidates_info: dict | None = None,
) -> TextScanResult:
    """Score response texts (any number of tokens) as the assistant's answer to ``prompt``.

    Args:
        model, tokenizer: an HF reward model / causal LM (eval mode) and its tokenizer.
        prompt: the user turn.
        texts: the candidates (strings). Exact duplicates are scored once (and reported).
        head: "auto" (score for classifiers, logprob for causal LMs), "score" or "logprob".
        head_index: output of a multi-output score head (default 0).
        template, system: as for :func:`rmfast.scan.scan` (a prepared Template is accepted).
        batch_size: "auto" (default; per response length) or rows per batch. CUDA OOM halves it.
        progress: show a progress bar (default True).
        compat: None (default: exact in-context ids; a text that merges with the template is an
            error) or "decode-retokenize" (score whatever the re-tokenized conversation holds).
        model_info: provenance for the manifest (the loader's ``source``).
        max_tokens: longest response accepted, in tokens (default 256; also bounded by the
            model's position limit). A longer candidate is a UserError naming it.
        engine: "auto" (fast engine where supported, else plain HF with a warning), "fast", "reference".
        checkpoint: optional path; finished batches are saved there and a rerun resumes from it.
        source_ids: vocabulary ids the texts came from (kept as ``token_id``; decode-retokenize scans).
        candidates_info: where the texts came from (file, column, sha256), for the manifest.

    Returns:
        TextScanResult in input order (after de-duplication).
    """
    from tqdm.auto import tqdm

    from .engine import Engine
    from .reference import reference_scores
    from .scan import (CHECKPOINT_EVERY_S, _run_key, _save_checkpoint, _versions, auto_batch_size, base_manifest, oom_batches,
                       resolve_engine, resolve_head)
    from .template import Template, build_template

    t0 = time.perf_counter()
    if compat is not None and compat not in COMPAT_MODES:
        raise UserError(f"unknown --compat {compat!r}; use {', '.join(COMPAT_MODES)}")
    if isinstance(texts, str):
        raise UserError("texts must be a list of strings, not one string")
    texts = list(texts)
    if source_ids is not None:
        source_ids = np.asarray(source_ids, dtype=np.int64)
        if source_ids.size != len(texts):
            raise UserError("source_ids must give one vocabulary id per text")
    else:
        bad = [t for t in texts if not isinstance(t, str)]
        if bad:
            raise UserError(f"candidates must be strings; got {type(bad[0]).__name__} {bad[0]!r}")
        seen: set[str] = set()
        uniq, dups = [], []
        for t in texts:
            (dups if t in seen else uniq).append(t)
            seen.add(t)
        if dups:
            warnings.warn(f"rmfast: {len(dups)} duplicate candidate(s) scored once ({dups[0]!r}…)", stacklevel=2)
        texts = uniq
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        if empty:
            raise UserError(f"candidate {empty[0] + 1} is empty; every candidate needs some text")
    if not texts:
        raise UserError("no candidates to score")
    if max_tokens is None or int(max_tokens) < 1:
        raise UserError("--max-tokens must be a positive integer")
    tmpl = template if isinstance(template, Template) else build_template(tokenizer, prompt, template=template, system=system)
    head = resolve_head(model, head, head_index)

    rows = tokenize_in_context(tokenizer, tmpl, texts, compat=compat, head=head)
    limit = int(max_tokens)
    pos_limit = _max_len(model, tmpl)
    for i, r in enumerate(rows):
        n = len(r.ids)
        if n > limit or (pos_limit is not None and n > pos_limit):
            which = f"--max-tokens {limit}" if n > limit else f"the model's position limit ({pos_limit} response tokens)"
            raise UserError(f"candidate {i + 1} {texts[i][:40]!r} is {n} tokens long, over {which}; "
                            "shorten it, drop it, or raise --max-tokens")

    engine = resolve_engine(model, head, head_index, engine)
    device = next(model.parameters()).device
    n_tok = np.array([len(r.ids) for r in rows], dtype=np.int64)
    n_odd = sum(r.template is not None for r in rows)
    manifest = base_manifest(model, tmpl, prompt, head=head, head_index=head_index, engine=engine, model_info=model_info)
    manifest.update({
        "candidate_kind": "vocabulary-decoded" if source_ids is not None else "text",
        "candidates": candidates_info,
        "compat": compat,
        "n_candidates": len(texts),
        "n_tokens": {"min": int(n_tok.min()), "max": int(n_tok.max()), "mean": round(float(n_tok.mean()), 3)},
        "max_tokens": limit,
        "rows_not_split": n_odd,
        "tokenization": ("apply_chat_template(tokenize=True) of the whole conversation, sliced between the template's "
                         "prefix and suffix" if compat is None else
                         "decode-retokenize: the whole re-tokenized conversation is scored as it is"),
    })
    if n_odd:
        warnings.warn(f"rmfast: {n_odd} candidate(s) merge with the template when re-tokenized; they are scored "
                      "as whole sequences on the plain Hugging Face path", stacklevel=2)

    key_m = dict(manifest, engine=engine)
    key = _run_key(key_m) + _ids_digest(rows)[:16]
    order_ids = np.arange(len(rows), dtype=np.int64)
    scores = np.full(len(rows), np.nan, dtype=np.float32)
    ck = Path(checkpoint) if checkpoint else None
    if ck is not None and ck.exists():
        try:
            z = np.load(ck, allow_pickle=False)
            if str(z["key"]) == key and np.array_equal(z["ids"], order_ids):
                scores = z["scores"].astype(np.float32)
        except Exception:
            pass  # an unreadable checkpoint is ignored, not trusted

    # Groups: one per response length on the shared template; one per row that did not split.
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault((len(r.ids), None) if r.template is None else (len(r.ids), i), []).append(i)
    eng = Engine(model, tmpl, head=head, head_index=head_index) if engine == "fast" else None
    done0 = int((~np.isnan(scores)).sum())
    bar = tqdm(total=len(rows), initial=done0, unit="cand", desc="texts", disable=not progress, dynamic_ncols=True)
    t_scan = time.perf_counter()
    last_ck = time.perf_counter()
    bs_used = []
    work = False
    try:
        for (n, odd), idx in sorted(groups.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
            idx = np.asarray(idx, dtype=np.int64)
            todo = idx[np.isnan(scores[idx])]
            if todo.size == 0:
                continue
            row_t = tmpl if odd is None else rows[odd].template
            if batch_size == "auto":
                tpr = eng.tokens_per_row(n) if (eng is not None and odd is None) else len(row_t.prefix_ids) + n + len(row_t.suffix_ids)
                bs = auto_batch_size(device, tpr)
            else:
                bs = int(batch_size)
                if bs < 1:
                    raise UserError("--batch-size must be a positive integer or auto")
            def score(lo, hi, b, todo=todo, odd=odd, row_t=row_t):
                sel = todo[lo:hi]
                if eng is not None and odd is None:
                    cand = torch.tensor([rows[j].ids for j in sel], dtype=torch.long)
                    return eng.score(cand).float().cpu().numpy()
                return reference_scores(model, row_t, [rows[j].ids for j in sel], head=head, head_index=head_index,
                                        batch_size=b).numpy()

            for lo, hi, out, bs in oom_batches(todo.size, bs, device, score,
                                               lambda b: bar.set_postfix_str(f"OOM: batch -> {b}")):
                scores[todo[lo:hi]] = out
                work = True
                bar.update(hi - lo)
                if ck is not None and time.perf_counter() - last_ck > CHECKPOINT_EVERY_S:
                    _save_checkpoint(ck, key, order_ids, scores)
                    last_ck = time.perf_counter()
            bs_used.append(bs)
    except BaseException:
        if ck is not None and work:
            _save_checkpoint(ck, key, order_ids, scores)
        raise
    bar.close()
    scan_s = time.perf_counter() - t_scan
    n_new = len(rows) - done0
    manifest.update({
        "batch_size": batch_size if batch_size != "auto" else "auto",
        "wall_s": round(time.perf_counter() - t0, 3),
        "scan_s": round(scan_s, 3),
        "candidates_per_s": round(n_new / scan_s, 2) if scan_s > 0 else None,
        "resumed_candidates": done0,
        "versions": _versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    if ck is not None and ck.exists():
        ck.unlink()
    return TextScanResult(texts, scores, n_tok, [list(map(int, r.ids)) for r in rows], manifest, source_ids)


def decode_retokenize_scan(model, tokenizer, prompt: str, ids, **kw) -> TextScanResult:
    """The papers' vocabulary pipeline: ``tokenizer.decode([id])`` for each id, then score each string
    with the whole conversation re-tokenized (``compat="decode-retokenize"``). Keyed by ``token_id``."""
    ids = np.asarray(ids, dtype=np.int64)
    texts = [tokenizer.decode([int(i)]) for i in ids]
    kw["compat"] = "decode-retokenize"
    return score_texts(model, tokenizer, prompt, texts, source_ids=ids, **kw)
