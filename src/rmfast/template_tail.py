"""Tokenizing many responses to one prompt without tokenizing the prompt once per response, exactly.

:func:`rmfast.template.responses_ids` must give each response the ids the whole conversation
(prompt + response) tokenizes to. Tokenizing every whole conversation costs N x the prompt: a
best-of-N call with a 2,048-token prompt and 64 responses spent a quarter of its time there on an
H100 host. This module finds a point inside the prompt's text that tokenization cannot cross, so
that ids(conversation) == ids(text before it) + ids(text from it): the ids before it are computed
once per template and only the tail is tokenized per response.

Why the cut is a boundary. A Hugging Face fast tokenizer (the ``tokenizers`` library) first splits
the raw text on its non-normalized added tokens (a leftmost-longest match over the text), then
runs the normalizer, the pre-tokenizer and the model on each piece between them, separately. So
the start of an added token that the tokenizer matches in the full text separates two independent
halves. The cut is put at the START of such a token (a chat template's ``<|im_start|>`` before
``assistant``, ``<start_of_turn>`` before ``model``), not after it: the tail then begins with the
token, and the piece after it is, in the tail alone as in the full text, not at offset 0 of the
string (a Metaspace pre-tokenizer with ``prepend_scheme="first"`` adds "▁" only at offset 0).

What is established once per (tokenizer, template), else the whole-conversation path is used:

- the tokenizer is a fast one whose encode methods transformers' own (no Python-level rewriting of
  the text), and special tokens are matched (``split_special_tokens`` off);
- the cut token is an added token the tokenizer matched in the rendered prefix text, with its exact
  span, not normalized (those are matched inside the pieces, not between them), without ``lstrip``
  (it would eat whitespace on the head's side) or ``single_word`` (its match depends on the
  characters around it); one that holds whitespace only where no added token strips whitespace;
- no added token could match from before the cut across the end of the prefix text (a match the
  prefix text alone cannot show): checked against every added token's text;
- the post-processor (where the whole path adds special tokens: plain formats) is one that puts
  fixed tokens around the text; those are put around head + tail;
- the head's ids plus the ids of the prefix text's own tail equal the template's prefix ids.

Per response, its conversation text must start with the prefix text (a template that renders the
turns before the response differently per response takes the whole path). Plain formats such as
``User: {prompt}\\nAssistant: {response}`` have no added token in the prefix for most tokenizers
and take the whole path; a tokenizer whose newline is an added token (Gemma's) could cut there, but
Gemma's ``Assistant: `` ends in a space that merges with the response, so the last check refuses it.

Planning costs about one tokenization of the prompt, so a template is planned only once the texts seen
with it would save :data:`PLAN_AFTER_TOKENS` prompt tokens (a job of many conversations with one
response each never plans); plans are kept per tokenizer and template, and planned again when the
tokenizer's vocabulary size changes.
"""

from __future__ import annotations

import bisect
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass

#: texts tokenized by each path ("tail": the head's ids reused; "whole": the whole conversation), for tests
#: and profiles to see which ran
counts: Counter = Counter()

#: templates whose cut is kept per tokenizer (least recently used dropped): a job's conversations each
#: have their own, a best-of-N service or a search reuses a few
PLANS_PER_TOKENIZER = 32
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_added: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (vocabulary size, _Added)

#: a template is planned once the prompt tokens the cut would save, over the texts seen with it, reach this:
#: planning tokenizes the prompt once (with offsets) and renders two probes, so a template seen with one text
#: (a job of many conversations, one response each) would pay it for nothing
PLAN_AFTER_TOKENS = 512

#: post-processors that put the same special tokens around every text (before and after it)
_FIXED_POST = ("TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel")
_ENCODE_METHODS = ("__call__", "_call_one", "_encode_plus", "_batch_encode_plus", "encode_plus", "batch_encode_plus")


@dataclass(frozen=True)
class TailCut:
    """Where a template's conversations are cut.

    Attributes:
        prefix_text: the rendered conversation up to the response slot; every conversation cut must start with it.
        cut: the tail starts here (the start of an added token in ``prefix_text``).
        head_ids: the ids of ``prefix_text[:cut]``, after what the post-processor puts in front (where the
            whole path adds special tokens).
        trail: what the post-processor puts after the text (ids), appended after the tail.
    """

    prefix_text: str
    cut: int
    head_ids: tuple[int, ...]
    trail: tuple[int, ...] = ()


def cut_for(tokenizer, key, render_probes, add_special_tokens: bool, prefix_ids, n_texts: int | None = None
            ) -> TailCut | str:
    """The cut of the template ``key`` (hashable: what was rendered) on ``tokenizer``, or why there is none.

    ``render_probes()`` renders two conversations whose responses differ in their first character (called
    only when planning); ``add_special_tokens``: whether the whole path's tokenizer call adds them;
    ``prefix_ids``: the template's ids before the response; ``n_texts``: how many texts are about to be
    tokenized (planned only once :data:`PLAN_AFTER_TOKENS` would be saved; None: plan now). Cached per
    tokenizer (weakly), key and vocabulary size (a token added since is a new plan)."""
    try:
        full_key = (key, bool(getattr(tokenizer, "split_special_tokens", False)), add_special_tokens)
        per = _plans.setdefault(tokenizer, OrderedDict())
        hit = per.get(full_key)
    except TypeError:  # a tokenizer or key that cannot be a dict key: planned on every call
        per, full_key, hit = OrderedDict(), None, None
    if isinstance(hit, tuple):  # (vocabulary size, plan); len() costs ~0.4 ms on a 262k vocabulary: only here
        n_vocab = len(tokenizer)
        if hit[0] == n_vocab:
            per.move_to_end(full_key)
            return hit[1]
        hit = None
    seen = (hit or 0) + (n_texts or 0)
    if n_texts is not None and (seen - 1) * len(prefix_ids) < PLAN_AFTER_TOKENS:
        if full_key is not None:
            _keep(per, full_key, seen)
        return f"not planned yet: {seen} text(s) seen, too few prompt tokens to save"
    n_vocab = len(tokenizer)
    try:
        plan = _plan(tokenizer, render_probes, add_special_tokens, tuple(prefix_ids))
    except Exception as e:  # noqa: BLE001 - anything unforeseen: the whole path, which reports its own errors
        plan = f"planning the cut failed ({type(e).__name__}: {e})"
    if full_key is not None:
        _keep(per, full_key, (n_vocab, plan))
    return plan


def _keep(per: OrderedDict, key, value) -> None:
    """Store a plan (or a count of texts seen), dropping the least recently used past PLANS_PER_TOKENIZER."""
    per[key] = value
    per.move_to_end(key)
    while len(per) > PLANS_PER_TOKENIZER:
        per.popitem(last=False)


def tail_ids(tokenizer, cut: TailCut, texts: list[str]) -> list[list[int] | None]:
    """Each conversation text's whole ids as head + tail (the tails tokenized in ONE batched call, as the whole
    path's), or None for a text that does not start with the cut's prefix text."""
    at = [i for i, t in enumerate(texts) if t.startswith(cut.prefix_text)]
    out: list[list[int] | None] = [None] * len(texts)
    if at:
        tails = tokenizer([texts[i][cut.cut:] for i in at], add_special_tokens=False)["input_ids"]
        head, trail = list(cut.head_ids), list(cut.trail)
        for i, ids in zip(at, tails):
            out[i] = head + list(ids) + trail
    counts["tail"] += len(at)
    return out


def _plan(tokenizer, render_probes, add: bool, prefix_ids: tuple[int, ...]) -> TailCut | str:
    """:func:`cut_for`, uncached (see the module docstring for each condition)."""
    why = _unsupported(tokenizer, add)
    if why:
        return why
    a, b = render_probes()
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    text = a[:n]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    added = added_table(tokenizer)
    k = _cut_token(text, ids, offsets, added.by_id)
    if k is None:
        return "no added token to cut at in the text before the response (a plain format: ordinary text)"
    cut, token = offsets[k][0], added.by_id[ids[k]]
    if any(c.isspace() for c in token.content) and added.strips:
        return f"the cut token {token.content!r} holds whitespace, which a stripping added token could take"
    across = added.straddling(text, cut)
    if across is not None:
        return f"the added token {across!r} could match across the cut"
    lead, trail = _around(tokenizer) if add else ((), ())
    if lead is None:
        return "the post-processor's special tokens are not found around a probe text"
    head = (*lead, *ids[:k])
    rest = tokenizer(text[cut:], add_special_tokens=False)["input_ids"]
    if head + tuple(rest) != prefix_ids:
        return "the head's ids and the prefix text's tail do not give the template's prefix ids"
    return TailCut(prefix_text=text, cut=cut, head_ids=head, trail=tuple(trail))


def _unsupported(tokenizer, add: bool) -> str | None:
    """Why this tokenizer is not one the cut is established for, or None."""
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        return "not a fast (tokenizers-library) tokenizer"
    if getattr(tokenizer, "split_special_tokens", False):
        return "split_special_tokens is on: special tokens are tokenized as text"
    import transformers

    base = getattr(transformers, "TokenizersBackend", None) or transformers.PreTrainedTokenizerFast
    if not isinstance(tokenizer, base):
        return f"{type(tokenizer).__name__} is not a {base.__name__}"
    changed = [m for m in _ENCODE_METHODS if getattr(type(tokenizer), m, None) is not getattr(base, m, None)]
    if changed:  # a subclass that rewrites the text before the backend sees it
        return f"{type(tokenizer).__name__} overrides {changed[0]}"
    post = tokenizer.backend_tokenizer.post_processor
    if add and post is not None and type(post).__name__ not in _FIXED_POST:
        return f"the post-processor {type(post).__name__} is not one that adds fixed tokens"
    return None


def _cut_token(text: str, ids: list[int], offsets, added: dict) -> int | None:
    """The index of the last token of ``text`` (ids, char offsets) that is a usable cut: an added token matched
    with its exact span, not normalized, no lstrip or single_word, not at the very start (nothing to reuse)."""
    for k in range(len(ids) - 1, -1, -1):
        t = added.get(ids[k])
        if t is None or t.normalized or t.lstrip or t.single_word:
            continue
        s, e = offsets[k]
        if s > 0 and e - s == len(t.content) and text[s:e] == t.content:
            return k
    return None


@dataclass(frozen=True)
class _Added:
    """A tokenizer's added tokens, as planning asks about them.

    Attributes:
        by_id: id -> AddedToken.
        special: the ids of those flagged special (:func:`rmfast.template.special_flagged_ids`).
        strips: whether any strips the whitespace beside it (lstrip / rstrip).
        raw: the texts of those matched on the raw text (not normalized); ``joined``: them, each after a NUL
            (one string to search in C, not thousands in Python); ``starts``: where each begins in it.
    """

    by_id: dict
    special: frozenset
    strips: bool
    raw: tuple[str, ...]
    joined: str
    starts: tuple[int, ...]

    def straddling(self, text: str, cut: int) -> str | None:
        """An added token that could match in a conversation from before ``cut`` past the end of ``text`` (where
        the prefix text alone ends, so its encoding cannot show such a match), or None. Conservative: any token
        whose text continues ``text[i:]`` for an ``i`` before the cut counts. (Normalized added tokens are
        matched within the pieces between the others, so never across the cut token.)"""
        tail = text[cut:]
        at = self.joined.find(tail)
        while at != -1:  # each place tail occurs inside a token's text, j characters into it
            k = bisect.bisect_right(self.starts, at) - 1
            c, j = self.raw[k], at - self.starts[k]
            if 1 <= j <= cut and at + len(tail) <= self.starts[k] + len(c) and text[cut - j:cut] == c[:j]:
                return c
            at = self.joined.find(tail, at + 1)
        return None


def added_table(tokenizer) -> _Added:
    """:class:`_Added` of ``tokenizer``, kept per tokenizer and vocabulary size (Gemma's 6,384 added tokens take
    ~10 ms to list)."""
    n = len(tokenizer)
    try:
        got = _added.get(tokenizer)
    except TypeError:
        got = None
    if got is not None and got[0] == n:
        return got[1]
    by_id = dict(tokenizer.added_tokens_decoder)
    raw = tuple(t.content for t in by_id.values() if not t.normalized)
    starts, pos = [], 0
    for c in raw:
        starts.append(pos + 1)
        pos += 1 + len(c)
    table = _Added(by_id=by_id, special=frozenset(int(i) for i, t in by_id.items() if t.special),
                   strips=any(t.lstrip or t.rstrip for t in by_id.values()), raw=raw,
                   joined="".join("\0" + c for c in raw), starts=tuple(starts))
    try:
        _added[tokenizer] = (n, table)
    except TypeError:
        pass
    return table


def _around(tokenizer) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """(lead, trail): the ids the post-processor puts before and after a text, (None, ()) where a probe text's
    own ids are not found between them."""
    probe = "a b"
    with_ = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    own = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    for i in range(len(with_) - len(own) + 1):
        if with_[i:i + len(own)] == own:
            return tuple(with_[:i]), tuple(with_[i + len(own):])
    return None, ()
