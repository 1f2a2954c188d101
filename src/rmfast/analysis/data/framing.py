"""Prompt framing: is a prompt asking for the best (positive) or the worst (negative)?

The papers contrast positively framed prompts ("greatest", "best", "most good") with
negatively framed ones ("worst", "most bad", "most terrible"). :func:`prompt_framing`
guesses from those words; a user mapping overrides it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import pandas as pd

from ...errors import UserError

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
    """Parse CLI ``PROMPT=positive|negative`` items into a mapping; any other framing is refused here,
    before any work (a report would otherwise skip every section that reads it and still exit 0).

    >>> parse_framing_args(["Odd?=Negative"])
    {'Odd?': 'negative'}
    >>> parse_framing_args(["x=sideways"])
    Traceback (most recent call last):
    rmfast.errors.UserError: framing 'x=sideways': the framing is 'sideways'; write PROMPT=positive or PROMPT=negative
    """
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--framing {item!r}: write PROMPT=positive or PROMPT=negative")
        p, v = item.rsplit("=", 1)
        v = v.strip().lower()
        if v not in (POSITIVE, NEGATIVE):
            raise UserError(f"--framing {item!r}: the framing is {v!r}; write PROMPT=positive or PROMPT=negative")
        out[p] = v
    return out


def prompt_text(scans, given: str | None) -> str | None:
    """The prompt that ``given`` names: itself where it is a prompt of ``scans``, else the one prompt a sweep
    named so (the ``prompt_name`` column of a store's parts: ``greatest`` for "What, in one word, is the
    greatest thing ever?"); otherwise ``given`` unchanged, for :func:`check_named_prompts` to refuse.

    >>> d = pd.DataFrame({"prompt": ["Best thing?", "Worst thing?"], "prompt_name": ["best", "worst"]})
    >>> prompt_text(d, "worst"), prompt_text(d, "Best thing?"), prompt_text(d, "nope")
    ('Worst thing?', 'Best thing?', 'nope')
    """
    if given is None or "prompt_name" not in scans.columns or (scans["prompt"] == given).any():
        return given
    hit = pd.unique(scans.loc[scans["prompt_name"] == given, "prompt"])
    return str(hit[0]) if len(hit) == 1 else given


def check_named_prompts(prompts: Iterable[str], named: Iterable[tuple[str, str | None]]) -> None:
    """Each prompt that an option names (``(option, prompt)`` pairs; None: not given) is one of the
    scans' prompts, else a one-line UserError naming the option and the prompts there are.

    >>> check_named_prompts(["Best?", "Worst?"], [("--best", "Best?"), ("--worst", None)])
    >>> check_named_prompts(["Best?", "Worst?"], [("--best", "nope")])
    Traceback (most recent call last):
    rmfast.errors.UserError: best 'nope' is not a prompt of these scans; choose one of ['Best?', 'Worst?']
    """
    prompts = list(prompts)
    for option, given in named:
        if given is not None and given not in prompts:
            have = repr(prompts[:6])[:-1] + (f", … ({len(prompts)} in all)]" if len(prompts) > 6 else "]")
            raise UserError(f"{option} {given!r} is not a prompt of these scans; choose one of {have}")
