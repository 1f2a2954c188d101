"""The response's tokens in a GCG search: which ids it may place (:func:`allowed_tokens`), the text of ids in the
template, the re-tokenization filter, the initial responses (random, ``--init``, ``--init-strings``)."""

from __future__ import annotations

import warnings

import torch

from ..errors import UserError
from ..scoring.candidates import decoded, special_ids
from ..template import Template, response_ids

__all__ = ["allowed_tokens", "Retokenizer", "initial_ids", "initial_list", "key", "random_init", "response_text", "text_of"]


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def response_text(tokenizer, tmpl: Template, ids) -> str | None:
    """The response text that renders, in the template, to exactly ``ids``: their decoded text, or that text without
    its first space where the template's text before the response ends in a space the first token carries (a plain
    "Assistant: {response}": " The" after "Assistant: " would render two spaces). None where neither does."""
    ids = list(ids)
    text = _decode(tokenizer, ids)
    for t in (text, text[1:]) if text.startswith(" ") else (text,):
        try:
            if response_ids(tokenizer, tmpl, t) == ids:
                return t
        except UserError:
            continue
    return None


def text_of(tokenizer, tmpl: Template, ids) -> str:
    """What a result reports as the text of ``ids``: :func:`response_text`, else their decoded text (ids that no
    text renders to, which ``retokenize_filter=False`` lets through: ``*_text_exact`` says so)."""
    t = response_text(tokenizer, tmpl, ids)
    return _decode(tokenizer, ids) if t is None else t


def allowed_tokens(tokenizer, n_vocab: int, *, allow_non_ascii: bool = False, allow_special: bool = False) -> torch.Tensor:
    """(n_vocab,) bool: which ids GCG may place in the response.

    Excluded by default: special / added tokens, and tokens whose text is not non-empty printable
    ASCII (byte-fallback pieces, newlines, other scripts).
    """
    mask = torch.ones(n_vocab, dtype=torch.bool)
    if not allow_non_ascii:
        texts = decoded(tokenizer, range(n_vocab))
        for i, t in enumerate(texts):
            if not (t and t.isascii() and t.isprintable()):
                mask[i] = False
    if not allow_special:
        for i in special_ids(tokenizer):
            if 0 <= i < n_vocab:
                mask[i] = False
    return mask


class Retokenizer:
    """Does the decoded text of ids re-encode, in template context, to the same ids?"""

    def __init__(self, tokenizer, tmpl: Template):
        self.tokenizer, self.tmpl = tokenizer, tmpl

    def __call__(self, ids) -> bool:
        return response_text(self.tokenizer, self.tmpl, ids) is not None


def key(ids) -> bytes:
    return torch.as_tensor(ids, dtype=torch.int32).numpy().tobytes()


def random_init(L: int, allowed_ids: torch.Tensor, gen: torch.Generator, retok: Retokenizer | None) -> list[int]:
    """L random allowed tokens whose text re-encodes to themselves (built token by token)."""
    n = allowed_ids.numel()
    for _ in range(20):
        ids: list[int] = []
        for _ in range(L):
            for _ in range(64):
                t = int(allowed_ids[torch.randint(n, (1,), generator=gen)])
                if retok is None or retok(ids + [t]):
                    ids.append(t)
                    break
            else:
                break
        if len(ids) == L:
            return ids
    raise UserError(f"found no random {L}-token response that re-tokenizes to itself; pass --init or --no-retokenize-filter")


def initial_ids(tokenizer, tmpl: Template, text: str, n_vocab: int, allowed: torch.Tensor, what: str = "--init") -> list[int]:
    """An initial response's ids in template context (a warning if it holds tokens GCG may not place)."""
    ids = response_ids(tokenizer, tmpl, text)
    bad = [t for t in ids if t >= n_vocab or not allowed[t]]
    if bad:
        warnings.warn(f"rmfast: {what} holds {len(bad)} excluded token(s) (e.g. id {bad[0]}); GCG only replaces them "
                      "with allowed tokens where a step picks their position", stacklevel=4)
    return ids


def initial_list(tokenizer, tmpl: Template, texts: list[str], n_vocab: int, allowed: torch.Tensor) -> list[list[int]]:
    """--init-strings' ids; all must have one length (GCG optimizes a fixed-length response)."""
    rows = [initial_ids(tokenizer, tmpl, t, n_vocab, allowed, "--init-strings") for t in texts]
    lens = sorted({len(r) for r in rows})
    if len(lens) > 1:
        first = next(t for t, r in zip(texts, rows) if len(r) != len(rows[0]))
        raise UserError(f"--init-strings tokenize to different lengths ({', '.join(map(str, lens))} tokens; e.g. "
                        f"{texts[0][:30]!r} is {len(rows[0])}, {first[:30]!r} is not); give strings of one token length")
    return rows
