"""The vocabulary as candidates: which ids exist, which a user asked for, and the papers' views.

One id list feeds every token scan: :func:`select_ids` / :func:`vocab_ids` (a range, a file,
explicit ids; minus special tokens; the word-like and de-duplication views).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..io import read_text


def vocab_size(model, tokenizer) -> int:
    """Ids that both the tokenizer and the embedding matrix know: 0 .. n-1."""
    n_emb = model.get_input_embeddings().weight.shape[0]
    return min(len(tokenizer), n_emb)


def vocab_sha256(tokenizer) -> str:
    """A content hash of the tokenizer's vocabulary: every (piece, id), sorted by id (added tokens included).
    Two tokenizer folders with the same vocabulary (a reward model and its base model) hash alike, so
    their token ids mean the same strings; the manifests record it (``vocab_sha256``) and the states
    join compares it (:func:`rmfast.analysis.representations.similarity.align`), not the folders' paths.

    >>> class Tok:
    ...     def get_vocab(self): return {"a": 0, "b": 1}
    >>> vocab_sha256(Tok()) == vocab_sha256(Tok()), len(vocab_sha256(Tok()))
    (True, 64)
    """
    import hashlib
    import json

    pairs = sorted(((int(i), str(t)) for t, i in tokenizer.get_vocab().items()))
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def special_ids(tokenizer) -> set[int]:
    """Special, reserved and added tokens (what --exclude-special drops)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids


def parse_token_ids(spec, n_vocab: int) -> np.ndarray:
    """``A:B`` (half-open range), a file with one id per line, or an iterable of ints -> sorted unique ids."""
    if spec is None:
        return np.arange(n_vocab, dtype=np.int64)
    if isinstance(spec, str):
        if ":" in spec and not os.path.exists(spec):
            a, _, b = spec.partition(":")
            try:
                lo = int(a) if a.strip() else 0
                hi = int(b) if b.strip() else n_vocab
            except ValueError:
                raise UserError(f"--token-ids {spec!r} is not a range A:B of integers nor an existing file") from None
            if 0 <= hi <= lo <= n_vocab:
                raise UserError(f"--token-ids range {lo}:{hi} is empty: A:B is half-open and needs A < B (e.g. {hi}:{lo})")
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
    ids = np.array(vals, dtype=np.int64)
    return np.unique(ids)


def select_ids(model, tokenizer, token_ids=None, *, exclude_special: bool = False, wordlike: bool = False,
               dedup: bool = False) -> tuple[np.ndarray, int, dict]:
    """Candidate ids of a model's vocabulary view (sorted, unique), the vocabulary size they were
    checked against, and what each filter dropped (:func:`vocab_ids`)."""
    n_vocab = vocab_size(model, tokenizer)
    ids, report = vocab_ids(tokenizer, n_vocab, token_ids=token_ids, exclude_special=exclude_special,
                            wordlike=wordlike, dedup=dedup)
    return ids, n_vocab, report


def decoded(tokenizer, ids) -> list[str]:
    """Each id decoded alone, as a user sees it (special tokens kept, no clean-up)."""
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
    ids = parse_token_ids(token_ids, n_vocab)
    report = {"n_start": int(ids.size), "exclude_special": exclude_special, "wordlike": wordlike, "dedup": dedup}
    if exclude_special:
        sp = np.fromiter(special_ids(tokenizer), dtype=np.int64)
        keep = ~np.isin(ids, sp)
        report["dropped_special"] = int((~keep).sum())
        ids = ids[keep]
    texts = decoded(tokenizer, ids) if (wordlike or dedup) and ids.size else []
    if wordlike:
        keep = np.array([is_wordlike(t) for t in texts], dtype=bool)
        report["dropped_not_wordlike"] = int((~keep).sum())
        ids = ids[keep]
        texts = [t for t, k in zip(texts, keep) if k]
    if dedup:
        counts = Counter(texts)
        keep = np.array([counts[t] == 1 for t in texts], dtype=bool)
        report["dropped_duplicate_text"] = int((~keep).sum())
        report["duplicate_strings"] = sum(1 for c in counts.values() if c > 1)
        ids = ids[keep]
    report["n_ids"] = int(ids.size)
    if ids.size == 0:
        raise UserError("no candidate ids left to score: the vocabulary view is empty after its filters "
                        "(check --token-ids, --exclude-special, --wordlike, --dedup)")
    return ids, report
