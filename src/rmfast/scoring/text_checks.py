"""The checks and the manifest of a text scan's candidates (:func:`rmfast.scoring.pipeline.score_texts`): strings,
de-duplicated (said), none empty, each within --max-tokens and the model's positions."""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import UserError
from .candidates import COMPAT_MODES, check_embedded, max_response_len


def unique_texts(texts) -> list[str]:
    if isinstance(texts, str):
        raise UserError("texts must be a list of strings, not one string")
    texts = list(texts)
    bad = [t for t in texts if not isinstance(t, str)]
    if bad:
        raise UserError(f"candidates must be strings; got {type(bad[0]).__name__} {bad[0]!r}")
    uniq = list(dict.fromkeys(texts))
    if len(uniq) < len(texts):
        dup = next(t for i, t in enumerate(texts) if t in texts[:i])
        warnings.warn(f"rmfast: {len(texts) - len(uniq)} duplicate candidate(s) scored once ({dup!r}…)", stacklevel=3)
    empty = [i for i, t in enumerate(uniq) if not t.strip()]
    if empty:
        raise UserError(f"candidate {empty[0] + 1} is empty; every candidate needs some text")
    return uniq


def check_lengths(rows, texts, model, tmpl, max_tokens) -> int:
    if max_tokens is None or int(max_tokens) < 1:
        raise UserError("--max-tokens must be a positive integer")
    limit, pos_limit = int(max_tokens), max_response_len(model, tmpl)
    try:
        check_embedded(model, *(r.ids for r in rows))
    except UserError:  # the first candidate past the embedding, named
        for i, r in enumerate(rows):
            check_embedded(model, r.ids, what=f"candidate {i + 1} {texts[i][:40]!r}'s tokens")
    for i, r in enumerate(rows):
        n = len(r.ids)
        if n > limit or (pos_limit is not None and n > pos_limit):
            which = f"--max-tokens {limit}" if n > limit else f"the model's position limit ({pos_limit} response tokens)"
            raise UserError(f"candidate {i + 1} {texts[i][:40]!r} is {n} tokens long, over {which}; "
                            "shorten it, drop it, or raise --max-tokens")
    return limit


def check_texts(texts, source_ids, compat):
    """The texts (de-duplicated unless they came from vocabulary ids) and their ids, checked."""
    if compat is not None and compat not in COMPAT_MODES:
        raise UserError(f"unknown --compat {compat!r}; use {', '.join(COMPAT_MODES)}")
    if source_ids is not None:
        texts, source_ids = list(texts), np.asarray(source_ids, dtype=np.int64)
        if source_ids.size != len(texts):
            raise UserError("source_ids must give one vocabulary id per text")
    else:
        texts = unique_texts(texts)
    if not texts:
        raise UserError("no candidates to score")
    return texts, source_ids


def texts_manifest(rows, compat, source_ids, candidates_info, limit) -> dict:
    """What a text scan records about its candidates and how they were tokenized."""
    n_tok = np.array([len(r.ids) for r in rows], dtype=np.int64)
    return {
        "candidate_kind": "vocabulary-decoded" if source_ids is not None else "text",
        "candidates": candidates_info,
        "compat": compat,
        "n_candidates": len(rows),
        "n_tokens": {"min": int(n_tok.min()), "max": int(n_tok.max()), "mean": round(float(n_tok.mean()), 3)},
        "max_tokens": limit,
        "rows_not_split": sum(r.template is not None for r in rows),
        "tokenization": ("apply_chat_template(tokenize=True) of the whole conversation, sliced between the template's "
                         "prefix and suffix" if compat is None else
                         "decode-retokenize: the whole re-tokenized conversation is scored as it is"
                         if compat != "authors" else
                         "authors: the conversation rendered as text, re-tokenized with special tokens, batches padded"),
    }
