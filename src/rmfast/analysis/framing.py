"""Prompt framing: is a prompt asking for the best (positive) or the worst (negative)?

The papers contrast positively framed prompts ("greatest", "best", "most good") with
negatively framed ones ("worst", "most bad", "most terrible"). :func:`prompt_framing`
guesses from those words; a user mapping overrides it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..errors import UserError

POSITIVE, NEGATIVE, UNKNOWN = "positive", "negative", "unknown"

_NEG = r"\b(worst|bad|terrible|awful|horrible|evil|least|hate[sd]?|disliked?)\b"
_POS = r"\b(best|greatest|good|great|most prefer|prefer|favou?rite|love[sd]?|finest)\b"


def prompt_framing(prompt: str) -> str:
    """"positive", "negative" or "unknown", from the prompt's superlative.

    >>> prompt_framing("What, in one word, is the worst thing ever?")
    'negative'
    >>> prompt_framing("What, in one word, is the most good thing ever?")
    'positive'
    """
    low = prompt.lower()
    if re.search(_NEG, low):
        return NEGATIVE
    if re.search(_POS, low):
        return POSITIVE
    return UNKNOWN


def framing_map(prompts: Iterable[str], overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Framing per prompt: ``overrides`` first (values positive/negative), else the guess.

    >>> framing_map(["Best?", "Odd?"], {"Odd?": "negative"})
    {'Best?': 'positive', 'Odd?': 'negative'}
    """
    overrides = dict(overrides or {})
    for p, v in overrides.items():
        if v not in (POSITIVE, NEGATIVE):
            raise UserError(f"framing for {p!r} is {v!r}; use 'positive' or 'negative'")
    return {p: overrides.get(p, prompt_framing(p)) for p in prompts}


def parse_framing_args(items: Iterable[str] | None) -> dict[str, str]:
    """Parse CLI ``PROMPT=positive|negative`` items into a mapping."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--framing {item!r}: write PROMPT=positive or PROMPT=negative")
        p, v = item.rsplit("=", 1)
        out[p] = v.strip().lower()
    return out
