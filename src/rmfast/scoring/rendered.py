"""Conversations already rendered in the model's chat template (issue 51 item 1).

RL frameworks hand a reward function, or send a reward server, text that already carries a chat template
(OpenRLHF's queries, verl's RM inputs, a user's ``apply_chat_template(..., tokenize=False)``). Given to
:meth:`rmfast.scoring.scorer.RewardScorer.score` as a prompt, such a text would be templated again: the template
inside the template, a different score (0.5293 instead of 0.1706 in the issue's example) and no warning. So:

- a prompt string that holds the special tokens the model's template renders (``<|im_start|>``,
  ``<|start_header_id|>``, ...) is refused in one line (:func:`check_not_rendered`) naming the way out;
- :func:`score_rendered` (``RewardScorer.score_rendered``) scores whole rendered texts as they are: tokenized
  without added special tokens (the text has its own), split after the template's last assistant header (the ids
  between the user's text and the response, :func:`assistant_header`), the part before it encoded once per distinct
  prompt, read at the final position: the plain-HF forward of the text's ids, to rounding.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import UserError
from ..template import Template, build_template
from .candidates import check_context, special_ids
from .conversation import as_list
from .model_mode import scoring_mode


def _common_suffix_len(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def assistant_header(tokenizer, template: str | None = None) -> tuple:
    """The ids a chat template (or plain format) puts between the end of the user's text and the response: the
    longest common suffix of two rendered prompts' prefixes (prompts whose last tokens differ); () where none."""
    a = build_template(tokenizer, "hello", template=template).prefix_ids
    b = build_template(tokenizer, "world", template=template).prefix_ids
    n = _common_suffix_len(a, b)
    return tuple(a[len(a) - n:]) if n else ()


def last_end(ids: tuple, pat: tuple) -> int:
    """The index just past the last occurrence of ``pat`` in ``ids`` that leaves at least one id after it; -1.

    >>> last_end((1, 7, 8, 4, 7, 8, 9), (7, 8)), last_end((1, 7, 8), (7, 8))
    (6, -1)
    """
    n = len(pat)
    for start in range(len(ids) - n - 1, -1, -1):
        if ids[start:start + n] == pat:
            return start + n
    return -1


def template_marks(tokenizer, template: str | None = None) -> tuple[str, ...]:
    """The special tokens (as text) that the model's template renders around a turn: what a rendered text holds and
    a user's prompt does not."""
    ids = build_template(tokenizer, "hello", template=template).prefix_ids
    special = special_ids(tokenizer)
    marks = {tokenizer.convert_ids_to_tokens(int(i)) for i in ids if int(i) in special}
    # a BOS that only begins the text is no turn's mark (a user's "<s>" is a strike-through); one that also opens the
    # template's turns (SmolLM2's <|im_start|>) is
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    opens_turns = bos_id is not None and list(ids[1:]).count(bos_id) > 0
    return tuple(sorted(m for m in marks if isinstance(m, str) and len(m) > 2 and (m != bos or opens_turns)))


def check_not_rendered(prompt: str, marks: tuple[str, ...], where: str,
                       whole: str = "RewardScorer.score_rendered(texts)") -> None:
    """UserError where a prompt string holds the template's special tokens (it is rendered already); ``whole``: what
    scores whole rendered texts instead (``rmfast serve``: its route)."""
    hit = next((m for m in marks if m in prompt), None)
    if hit is not None:
        raise UserError(f"{where} already holds the chat template ({hit!r}): templating it again would score the "
                        "template inside the template. Pass the user's own text or chat messages, not a rendered "
                        f"conversation (a text that only mentions {hit!r} cannot be told from one: write the token "
                        f"another way), or score whole rendered texts with {whole}")


def end_of_turn(tokenizer, template: str | None = None) -> tuple[tuple, int]:
    """The template's suffix after a response and how many of its leading ids end the turn
    (:attr:`rmfast.template.Template.n_continuation`): what the log-prob head scores after a response."""
    t = build_template(tokenizer, "hello", template=template)
    return tuple(t.suffix_ids), t.n_continuation


def _ending(tail: tuple, suffix: tuple) -> int:
    """How many of ``tail``'s last ids are the longest start of ``suffix`` it ends with, at least one id of the
    response left (a text cut after its end-of-turn token ends with the suffix's first id only); 0 where none.

    >>> _ending((5, 6, 1, 2), (1, 2)), _ending((5, 6, 1), (1, 2)), _ending((5, 6), (1, 2)), _ending((1, 2), (1, 2))
    (2, 1, 0, 0)
    """
    for k in range(min(len(suffix), len(tail) - 1), 0, -1):
        if tail[len(tail) - k:] == suffix[:k]:
            return k
    return 0


def score_rendered(scorer, texts, *, special_tokens: bool = False) -> list[float]:
    """Scores of whole texts already in the model's template (module doc), in order. ``special_tokens``: let the
    tokenizer add its own (a text whose BOS was stripped, as verl sends one). The log-prob head sums the response
    and the template's end of turn (:func:`end_of_turn`), as :meth:`score` does: not the ids the template puts after
    it, which the text ends with (a text cut before its end of turn: what it holds)."""
    texts = as_list(texts, "score_rendered: texts", "rendered texts (strings)")
    bad = next((k for k, t in enumerate(texts) if not isinstance(t, str) or not t.strip()), None)
    if bad is not None:
        raise UserError(f"score_rendered: text {bad} is {'empty' if isinstance(texts[bad], str) else type(texts[bad]).__name__}; "
                        "every text must be a non-empty string")
    header = scorer._fact("header", assistant_header)
    # the log-prob head's end of turn: the template's own (score()'s), not every id to the text's end
    turn_end = scorer._fact("turn_end", end_of_turn) if scorer.head == "logprob" else ((), 0)
    ids_list = scorer.tokenizer(texts, add_special_tokens=special_tokens)["input_ids"] if texts else []
    bos = getattr(scorer.tokenizer, "bos_token_id", None)
    doubled = [k for k, ids in enumerate(ids_list) if special_tokens and bos is not None and ids[:2] == [bos, bos]]
    if doubled:  # the text kept its BOS and the tokenizer added one: scored as it is (vLLM does the same), said
        warnings.warn(f"rmfast: warning: score_rendered: {len(doubled)} of {len(texts)} texts (text {doubled[0]} first) "
                      "start with two BOS tokens: the text holds its own and special_tokens=True added another; pass "
                      "special_tokens=False for texts that keep their BOS", stacklevel=3)
    groups: dict = {}  # (prompt ids, suffix ids) -> response length -> [(text number, response ids)]
    for k, ids in enumerate(ids_list):
        end = last_end(tuple(ids), header) if header else -1
        if end <= 0:
            raise UserError(f"text {k} holds no assistant header of the model's template with a response after it; "
                            "score the conversation and the response with score() instead")
        check_context(scorer.model, end, len(ids) - end)
        n = len(ids) - end - _ending(tuple(ids[end:]), turn_end[0])
        groups.setdefault((tuple(ids[:end]), tuple(ids[end + n:])), {}).setdefault(n, []).append((k, list(ids[end:end + n])))
    out = np.full(len(texts), np.nan, dtype=np.float32)
    with scorer._lock, scoring_mode(scorer.model):
        scorer._drop_stale_plans()
        scorer._fresh, scorer._wave = set(), set()
        for (prompt, suffix), by_len in groups.items():
            tmpl = Template(prompt, suffix, min(turn_end[1], len(suffix)), "", None, "ids")
            plan = scorer._plan(("rendered", prompt, suffix), tmpl)
            for n, rows in by_len.items():
                bs = max(1, plan.rows_per_batch(n))
                for lo in range(0, len(rows), bs):
                    part = rows[lo:lo + bs]
                    out[[k for k, _ in part]] = plan.score([r for _, r in part], len(part))
    return [float(v) for v in out]
