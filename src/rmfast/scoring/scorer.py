"""One prompt, many responses: :class:`RewardScorer`, the reward backend other packages call.

``RewardScorer(model)`` loads (or takes) a model once; ``scorer.score(conversations, responses)``
scores a list of lists of responses, one list per conversation, and returns scores of the same
shape, in input order. Each distinct conversation's prompt is encoded ONCE (its keys/values kept as
one shared copy, :class:`rmfast.fast.engine.Engine`). On the fast engine with a score head read at
one position, responses of similar lengths share a batch, right-padded and each read at its own
final position (:func:`length_buckets`; :attr:`RewardScorer.last_stats` counts the pad tokens), and
conversations with fewer responses than a batch holds share batches with the next conversations
(waves, :meth:`RewardScorer._waves`): the projections and MLP run over all their rows at once,
attention reads each row's own prompt. Elsewhere (plain-HF engine, gated heads, logprob) a batch
holds one conversation's responses of one length. Duplicate responses to one conversation are
scored once. The plans of one model share one set of fused layer weights.

Exactness: each score is the score of the whole conversation (``apply_chat_template`` of the
messages + the response, read at the final position) as the plain Hugging Face forward gives it,
to fp32 rounding in fp32 (``tests/test_scorer.py``); a response that merges with the template
around it when tokenized is refused, or with ``compat="decode-retokenize"`` scored as the template
renders it (the plain-HF forward of that whole sequence), exactly as text candidates are
(:func:`rmfast.scoring.candidates.tokenize_in_context`).

Conversations: a prompt string (one user turn), or a list of chat messages
``[{"role": "system", ...}?, {"role": "user", ...}, {"role": "assistant", ...}, ..., {"role": "user", ...}]``
whose last message is the user's. Responses are the assistant's next turn.

What is cached: within a call, one plan (prompt encoding) per distinct conversation, built when
its first batch runs and dropped when the next conversation's is built. Across calls, the last
``cache_prompts`` conversations' plans (default 8; 0: none) are kept, so a best-of-N loop that
rescores one prompt pays its encoding once. Memory per cached prompt: its keys/values, 2 x layers x
kv-heads x head-dim x prompt tokens x bytes per element (:meth:`RewardScorer.prompt_bytes`).
The plans hold copies of the weights (fused projections): they are dropped when the weights change,
as seen by each parameter's data pointer and version counter (an optimizer step, ``load_state_dict``)
and a sampled checksum (a few values of every parameter: an in-place change through ``.data``,
which the version counter does not see; :func:`rmfast.scoring.weights.weights_fingerprint`). A
change that touches none of the sampled values is not seen: call :meth:`RewardScorer.clear_cache`
after editing weights by hand.

Non-finite scores: a response whose score comes out NaN or infinite (a float16 overflow) is
returned as NaN, counted in ``last_stats.n_nonfinite`` and named in one warning
(:func:`rmfast.scoring.batching.count_nonfinite`; ``nonfinite="count"`` counts without the warning).

Thread safety: one call at a time. ``score`` holds a lock, so concurrent calls from several threads
are safe and run one after another (torch already spreads one call over every core).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from ..dims import kv_bytes
from ..errors import UserError
from ..states import ByLayer
from ..template import Template, build_template, check_text
from .batching import Group, count_nonfinite, length_buckets, score_groups
from .states_stream import Collect
from .candidates import TooLong, check_context, max_positions, tokenize_rows
from .conversation import Conversation, as_conversation, as_list, blank_words, call_lists, messages_of
from .decisions import decide
from .options import ScoringOptions, whole_number
from .score_stats import ResponseLabels, ScoreStats
from .model_mode import scoring_mode
from .scorer_model import RUNNABLE, check_runnable, model_and_tokenizer
from .plan import Scored, ScoringPlan, plan_scoring, score_together
from .rendered import check_not_rendered, score_rendered, template_marks
from .weights import WeightsWatch


@dataclass
class Ranked:
    """One response of a :meth:`RewardScorer.rerank`: its position in the input, text and score."""

    index: int
    response: str
    score: float


@dataclass
class Job:
    """A call's work: distinct rows (one per conversation and distinct response), their groups, and
    where each input response's score comes from.

    Attributes:
        convs: the distinct conversations, first-appearance order; ``tmpls``: their templates.
        rows: per distinct row, (conversation number, :class:`Row`).
        inverse: (n_responses,) distinct row of each input response, in input (row-major) order.
        shape: responses per conversation.
        groups: one per (conversation, response length) (a merging row in compat mode: its own).
    """

    convs: list
    tmpls: list
    rows: list
    inverse: np.ndarray
    shape: list
    groups: list = field(default_factory=list)

    def digest(self) -> str:
        """A hash of every row's ids (prompt and response): a checkpoint's rows are this job's."""
        h = hashlib.sha256()
        for c, r in self.rows:
            t = r.template or self.tmpls[c]
            for part in (t.prefix_ids, r.ids, t.suffix_ids):
                h.update(np.asarray(part, dtype=np.int64).tobytes() + b"|")
        return h.hexdigest()[:16]


#: a wave (conversations whose rows share batches) holds at most this many conversations ...
WAVE_PROMPTS = 64
#: ... and at most this many bytes of their prompts' keys/values (all held while the wave runs)
WAVE_KV_BYTES = 1 << 30


def _split(x, shape: list[int]) -> list:
    """A flat (n,) array as a list of float lists, or a flat (n, Dm) tensor as a list of tensors, of ``shape`` rows."""
    out, k = [], 0
    for n in shape:
        out.append([float(v) for v in x[k:k + n]] if isinstance(x, np.ndarray) else x[k:k + n])
        k += n
    return out


def _frozen(name: str):
    """The setter of a scorer's decided attribute: one line saying how to change it."""
    def refuse(self, value) -> None:
        raise UserError(f"RewardScorer.{name} is decided when the scorer is made (its scores, caches and key_fields "
                        f"follow it); make a new one: RewardScorer(..., {name}={value!r})")
    return refuse


class RewardScorer:
    """Scores many responses per conversation with one shared prompt encoding each (see the module doc).

    Args:
        model: an embedded alias, model folder, .gguf or hub id (loaded with ``dtype``, ``device`` and
            ``load_kw``: e.g. ``random_head_seed=0``), a :class:`rmfast.loading.loader.LoadedModel`, or a
            (model, tokenizer) pair / ``tokenizer=`` (the model used as it is).
        head: "auto" (score for reward models, logprob for causal LMs), "score" or "logprob" (log p of
            the response and the end-of-turn given the conversation); ``head_index``: output of a
            multi-output score head.
        engine: "auto", "fast" or "hf" (:func:`rmfast.scoring.plan.plan_scoring`).
        batch_size: "auto" (~4k tokens per batch on CPU, bounded by memory) or rows per batch.
        template: a chat template or plain format overriding the tokenizer's (None: the tokenizer's,
            or the loaded model's default for base models).
        compat: None (a response that merges with the template is an error) or "decode-retokenize"
            (scored as the template renders it, plain-HF path).
        max_tokens: longest response in tokens (None: the model's position limit only).
        cache_prompts: plans (prompt encodings) kept across calls (default 8; 0: none).
        share_batches: rows of several conversations in one batch (waves, :meth:`_waves`): "auto" (default:
            on CUDA, where a few conversations' rows leave the GEMMs narrow; off on CPU, where it measured no
            clear gain: :func:`rmfast.scoring.decisions.choose_share_batches`), True or False.
        attention: the rows' attention form, "auto" (:func:`rmfast.scoring.plan.choose_attention`: responses
            are texts of any length, so the cascade on CUDA) or a form it names (e.g. "cascade" on CPU: its
            torch twin, for tests).
        options: the scoring options as one value (:class:`rmfast.scoring.options.ScoringOptions`); the keyword
            options (head, head_index, engine, batch_size, attention, share_batches, dtype, device) that differ from their
            defaults apply on top. Every decision is made once, here, for every conversation
            (:func:`rmfast.scoring.decisions.decide`, job "scorer"; :attr:`decisions`).

    Example:
        >>> import rmfast  # doctest: +SKIP
        >>> scorer = rmfast.RewardScorer("smollm2-135m-instruct", random_head_seed=0, dtype="float32")  # doctest: +SKIP
        >>> scores = scorer.score(["What is 2+2?"], [["4", "Four.", "5"]])  # doctest: +SKIP
        >>> [round(s, 3) for s in scores[0]]  # one float per response; a seeded RANDOM head: no ranking  # doctest: +SKIP
        [0.774, 0.4, 0.487]
    """

    def __init__(self, model, tokenizer=None, *, dtype: str = "auto", device: str = "auto", head: str = "auto",
                 head_index: int = 0, engine: str = "auto", batch_size="auto", template: str | None = None,
                 compat: str | None = None, max_tokens: int | None = None, cache_prompts: int = 8,
                 share_batches="auto", attention: str = "auto", options: ScoringOptions | None = None, **load_kw):
        kw = {"dtype": dtype, "device": device, "head": head, "head_index": head_index, "engine": engine,
              "batch_size": batch_size, "attention": attention, "share_batches": share_batches}
        self.options = ScoringOptions.of_changed(options, **kw)
        self.model, self.tokenizer, self.source, default_t = model_and_tokenizer(
            model, tokenizer, {"dtype": self.options.dtype, "device": self.options.device, **load_kw})
        if template is not None and not isinstance(template, str):
            raise UserError(f"template must be a chat template or a plain format (a string), got {type(template).__name__}")
        self.template = template if template is not None else default_t
        self._decide(stacklevel=4)
        if compat not in (None, "decode-retokenize"):
            raise UserError(f"unknown compat {compat!r}; use None or 'decode-retokenize'")
        self.compat = compat
        self.max_tokens = None if max_tokens is None else whole_number(max_tokens, "max_tokens", 1)
        self.cache_prompts = whole_number(cache_prompts, "cache_prompts", 0)
        self._plans: OrderedDict = OrderedDict()  # Conversation -> ScoringPlan, least recently used first
        self._donor: ScoringPlan | None = None  # with cache_prompts=0: the last plan, for its layers only
        self._tmpls: OrderedDict = OrderedDict()  # Conversation -> Template (cheap; bounded like the plans, x64)
        self._lock = threading.RLock()
        self._weights_watch = WeightsWatch()  # the weights' fingerprint, its sample views kept between calls
        self._wave: set = set()  # the conversations of the batch being scored (never evicted meanwhile)
        self.last_stats = ScoreStats()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # decided at construction (the options and the model's decisions): read-only, a new scorer changes them. As plain
    # attributes a set one read back and was recorded in key_fields, while the scores kept the decided value.
    head = property(lambda self: self.decided.head, _frozen("head"))
    engine = property(lambda self: self.decided.engine, _frozen("engine"))
    share_batches = property(lambda self: self.decided.share_batches, _frozen("share_batches"))
    head_index = property(lambda self: self.options.head_index, _frozen("head_index"))
    batch_size = property(lambda self: self.options.batch_size, _frozen("batch_size"))
    attention = property(lambda self: self.options.attention, _frozen("attention"))

    # ------------------------------------------------------------------ public calls
    def score(self, conversations, responses, *, progress: bool = False, checkpoint=None,
              nonfinite: str = "warn", compat: str | None = "own") -> list[list[float]]:
        """Scores of ``responses[i][j]`` as the assistant's answer to ``conversations[i]``, same shape.

        ``conversations``: prompt strings or lists of chat messages (last one the user's); ``responses``:
        one list of response strings per conversation. ``checkpoint``: a file that an interrupted call
        saves its finished batches to and a rerun of the same call resumes from (the CLI's resumability).
        ``nonfinite``: a score that comes out NaN or infinite is returned as NaN and counted in
        ``last_stats.n_nonfinite``; "warn" (default) also names them in one warning, "count" does not (a
        caller that reports them itself: ``rmfast score``, the GRPO adapter).
        ``compat``: this call's rule for a response that merges with the template ("own": the scorer's
        ``compat``; None: refused; "decode-retokenize": scored as the template renders it). The GRPO adapter
        passes "decode-retokenize", so a sampled completion never stops training.
        """
        if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
            raise UserError(f"checkpoint must be a file path, got {type(checkpoint).__name__}")
        return self._run(conversations, responses, progress, checkpoint, None, nonfinite, compat)[0]

    def score_with_states(self, conversations, responses, layers="last_prenorm", *, progress: bool = False):
        """Scores and each response's hidden states, from the same forward (docs/representations.md).

        ``layers``: "last_prenorm", "0,8,last_normed", "all", or a list of names (:func:`rmfast.states.parse_layers`:
        ``k`` = the residual stream after decoder layer k, ``last_prenorm`` = what the final norm reads,
        ``last_normed`` = what the head reads, HF's ``hidden_states[-1]``; the old ``last`` is ``last_prenorm``,
        with a warning, and answers ``states["last"]``). Returns (scores, states): scores as :meth:`score`,
        states ``{name: [(N_i, Dm) CPU tensor per conversation]}`` in input order, each row the state
        at the response's final position (the position the head reads), in the model dtype
        (``last_normed``: fp32 by default). The scores are those :meth:`score` gives for the same call.

        >>> scores, st = scorer.score_with_states(["Hi"], [["Hello!", "Go away."]], "last_normed")  # doctest: +SKIP
        >>> st["last_normed"][0].shape  # doctest: +SKIP
        torch.Size([2, 576])
        """
        from ..states import parse_layers

        names = parse_layers(layers, self._n_layers())
        if self.head == "logprob":
            raise UserError("score_with_states: states are taken where a score head reads; this scorer's head "
                            "is logprob")
        return self._run(conversations, responses, progress, None, names)

    def _run(self, conversations, responses, progress, checkpoint, states, nonfinite: str = "warn",
             compat: str | None = "own"):
        if nonfinite not in ("warn", "count"):
            raise UserError(f"nonfinite={nonfinite!r}: give 'warn' or 'count'")
        compat = self.compat if compat == "own" else compat
        if compat not in (None, "decode-retokenize"):
            raise UserError(f"unknown compat {compat!r}; use None or 'decode-retokenize'")
        with self._lock, scoring_mode(self.model):
            t0 = time.perf_counter()
            self.last_stats = ScoreStats()  # a call refused below leaves no earlier call's figures behind
            job = self.prepare(conversations, responses, compat=compat)
            self._drop_stale_plans()
            self._fresh: set = set()  # conversations whose plan this call has used
            self._wave: set = set()
            self._states = states
            self.last_stats = stats = self._stats(job)
            weights = hashlib.sha256(b"".join(self._weights_key[1])).hexdigest()[:16]  # sampled bits, no pointers:
            fields = {**self.key_fields(), "compat": compat, "weights": weights}  # weights changed since: not resumed
            key = hashlib.sha256(repr(fields).encode()).hexdigest()[:16] + job.digest()
            sink = None if states is None else Collect(len(job.rows))
            unique, timing = score_groups(job.groups, np.arange(len(job.rows), dtype=np.int64), key=key,
                                          checkpoint=checkpoint, device=self.device, progress=progress,
                                          desc="responses", job={**fields, "rows": job.digest()},
                                          states_out=sink)
            stats.resumed_rows = int(timing["resumed_candidates"])
            flat = unique[job.inverse]  # (n_responses,) input order
            stats.n_nonfinite = count_nonfinite(flat, ResponseLabels(job.shape), "responses",
                                                "they are returned as NaN (last_stats.n_nonfinite)",
                                                warn=nonfinite == "warn", dtype=next(self.model.parameters()).dtype)
            out = _split(flat, job.shape)  # (n_responses,) -> per conversation
            if self.cache_prompts == 0:  # no prompt kept; the layers (CPU: fused weight copies) are, for the next call
                self._donor = next((p for p in self._plans.values() if p.eng is not None), self._donor)
                self._plans.clear()
            stats.wall_s = round(time.perf_counter() - t0, 4)
            if sink is None:
                return out, None
            by_name = {name: _split(t[torch.from_numpy(job.inverse)], job.shape) for name, t in sink.out.items()}
            emb = self.model.get_input_embeddings().weight  # (V, Dm)
            for name in states:  # a call with no response: every name asked, (0, Dm) per conversation
                by_name.setdefault(name, [emb.new_empty((0, emb.shape[1]), device="cpu") for _ in job.shape])
            return out, ByLayer(by_name)

    def _n_layers(self) -> int:
        from .hf_path import n_layers

        return n_layers(self.model)

    def score_rendered(self, texts, *, special_tokens: bool = False) -> list[float]:
        """Scores of whole texts already in the model's template (:func:`rmfast.scoring.rendered.score_rendered`)."""
        return score_rendered(self, texts, special_tokens=special_tokens)

    def _fact(self, name: str | None, fn=None):
        """A fact of the tokenizer and template, found once: the rendered texts' marks and assistant header. A chat
        template changed on a live scorer (the tokenizer's, or ``template``) first drops all it rendered."""
        now = (getattr(self.tokenizer, "chat_template", None), self.template)
        if now != self.__dict__.setdefault("_rendered_with", now):
            self.clear_cache()
            self._rendered_with = now
        facts = self.__dict__.setdefault("_facts", {})
        if name is not None and name not in facts:
            facts[name] = fn(self.tokenizer, self.template)
        return facts.get(name)

    def score_one(self, conversation, responses) -> list[float]:
        """Scores of ``responses`` to one conversation."""
        return self.score([conversation], [as_list(responses, "responses", "response strings")])[0]

    def rerank(self, conversation, responses, k: int = 1) -> list[Ranked]:
        """Best-of-N: the ``k`` highest-scoring responses, best first (ties: input order).

        >>> best = scorer.rerank("Name a color.", ["blue", "a table", "red"], k=2)  # doctest: +SKIP
        >>> [r.response for r in best]  # the class example's scorer: a seeded RANDOM head  # doctest: +SKIP
        ['blue', 'a table']
        """
        k = whole_number(k, "rerank: k", 1)  # checked before the scoring, not after it; numpy's ints too
        responses = as_list(responses, "rerank: responses", "response strings")  # a generator too: indexed below
        s = self.score([conversation], [responses])[0]
        order = sorted(range(len(s)), key=lambda i: (-s[i] if s[i] == s[i] else float("inf"), i))
        return [Ranked(i, responses[i], s[i]) for i in order[:k]]

    def key_fields(self) -> dict:  # what decides the scores besides the rows (and the weights' own bits)
        return {"model": self.source, "head": self.head, "head_index": self.head_index,
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""), "engine": self.engine,
                "template": self.template, "compat": self.compat}

    def prompt_bytes(self, n_prompt_tokens: int) -> int:
        """Bytes of one cached prompt encoding: its keys and values in every layer."""
        return kv_bytes(self.model, n_prompt_tokens)

    # ------------------------------------------------------------------ building the job
    def template_for(self, conv: Conversation) -> Template:
        """The conversation's split template (cached); a prompt rendered already is refused (:mod:`.rendered`)."""
        self._fact(None)  # a template changed on a live scorer: what it rendered goes
        t = self._tmpls.get(conv)
        if t is None:
            check_not_rendered(conv.prompt, self._fact("marks", template_marks), "the prompt")
            t = build_template(self.tokenizer, conv.prompt, template=self.template, system=conv.system,
                               history=conv.history)
            check_context(self.model, len(t.prefix_ids), 1, len(t.suffix_ids))
            self._tmpls[conv] = t
            while len(self._tmpls) > 64 * max(1, self.cache_prompts):
                self._tmpls.popitem(last=False)
        return t

    def _template_of(self, conv: Conversation, i: int) -> Template:
        """:meth:`template_for`, a prompt it refuses (too long, rendered already) named as conversation ``i``'s."""
        try:
            return self.template_for(conv)
        except UserError as e:  # TooLong stays TooLong (the GRPO adapter tells it from the rest)
            raise type(e)(f"the prompt of conversation {i}: {e.cli_message()}") from None

    def prepare(self, conversations, responses, compat: str | None = "own") -> Job:
        """Validate and tokenize a call: distinct conversations and rows, their groups (no model forward).
        ``compat``: as :meth:`score`'s."""
        compat = self.compat if compat == "own" else compat
        conversations, responses = call_lists(conversations, responses)
        convs: dict = {}
        first: dict = {}  # distinct conversation -> the first of its numbers (what an error names)
        rows: list = []
        index: dict = {}  # (conversation number, text) -> distinct row
        inverse, shape = [], []
        for i, (c, rs) in enumerate(zip(conversations, responses)):
            conv = as_conversation(c, f"conversation {i}")
            ci = convs.setdefault(conv, len(convs))
            first.setdefault(ci, i)
            shape.append(len(rs))
            for j, text in enumerate(rs):
                if not isinstance(text, str) or not text.strip():
                    raise UserError(f"response {j} of conversation {i} is {blank_words(text)}; "
                                    "every response needs some text")
                check_text(text, f"response {j} of conversation {i}")  # not "merges with the template"
                if (ci, text) not in index:
                    index[(ci, text)] = len(rows)
                    rows.append((ci, text, i, j))
                inverse.append(index[(ci, text)])
        conv_list = list(convs)
        tmpls = [self._template_of(c, first[ci]) for ci, c in enumerate(conv_list)]
        job = Job(conv_list, tmpls, self._tokenize(rows, tmpls, compat), np.asarray(inverse, dtype=np.int64), shape)
        self._check_ids(job)
        job.groups = self._groups(job)
        return job

    def too_long(self, conversations, responses, *, compat: str | None = "own") -> list[list[bool]]:
        """Whether each ``responses[i][j]`` is longer than :meth:`score` takes (the model's positions with its
        conversation's template around it, or ``max_tokens``), tokenized as :meth:`score` would; same shape. For
        a caller that leaves such responses out rather than stop (the GRPO adapter)."""
        compat = self.compat if compat == "own" else compat
        conversations, responses = call_lists(conversations, responses)
        tmpls = [self._fits(as_conversation(c, f"conversation {i}")) for i, c in enumerate(conversations)]
        rows = [(i, text, i, j) for i, rs in enumerate(responses) if tmpls[i] for j, text in enumerate(rs)]
        limit = max_positions(self.model)
        out = [[tmpls[i] is None] * len(rs) for i, rs in enumerate(responses)]  # a prompt too long alone: all are
        for (i, _, _, j), row in zip(rows, tokenize_rows(self.tokenizer, rows, tmpls, compat=compat, head=self.head,
                                                          long_ok=True)):  # None: past what the template renders
            t, n = (tmpls[i], 0) if row is None else (row.template or tmpls[i], len(row.ids))
            out[i][j] = bool(row is None or self.max_tokens is not None and n > int(self.max_tokens)
                             or limit is not None and len(t.prefix_ids) + n + len(t.suffix_ids) > limit)
        return out

    def _fits(self, conv: Conversation) -> Template | None:
        try:
            return self.template_for(conv)
        except TooLong:
            return None

    def _check_ids(self, job: Job) -> None:
        """Every id the tokenizer gave has an embedding row: a tokenizer of another model (a given
        (model, tokenizer) pair) is refused in one line, not an IndexError inside the forward."""
        n_emb = self.model.get_input_embeddings().weight.shape[0]
        for ci, row in job.rows:
            t = row.template or job.tmpls[ci]
            top = max(max(t.prefix_ids, default=-1), max(row.ids, default=-1), max(t.suffix_ids, default=-1))
            if top >= n_emb:
                raise UserError(f"the tokenizer gives id {top} (conversation {ci}), but the model's embedding has "
                                f"{n_emb} rows: the tokenizer ({len(self.tokenizer)} ids) is not this model's; pass "
                                "the model's own tokenizer")

    def _tokenize(self, rows, tmpls, compat: str | None) -> list:
        """(conversation number, :class:`Row`) per distinct row, ids as the template tokenizes them in context."""
        got = tokenize_rows(self.tokenizer, rows, tmpls, compat=compat, head=self.head)
        out = []
        for (ci, text, i, j), row in zip(rows, got):
            t = row.template or tmpls[ci]
            n = len(row.ids)
            if self.max_tokens is not None and n > int(self.max_tokens):
                raise TooLong(f"response {j} of conversation {i} ({text[:40]!r}) is {n} tokens long, over "
                                f"max_tokens {self.max_tokens}")
            check_context(self.model, len(t.prefix_ids), n, len(t.suffix_ids))
            out.append((ci, row))
        return out

    def _groups(self, job: Job) -> list[Group]:
        """The batches' groups. Where the fast engine reads a score head at one position per row
        (:meth:`_ragged_ok`): conversations in waves (:meth:`_waves`), each wave's rows sorted by length
        and cut into buckets of similar lengths (:func:`length_buckets`), so that a batch holds rows of
        several conversations and lengths (right-padded, each read at its own final position); where the
        rows run packed (the plan's "rows" decision: no padding at all), the wave's rows of every length are one group.
        Otherwise one group per (conversation, response length). A row that carries its own template
        (compat) is a group of its own on the plain-HF path."""
        by: dict = {}
        for u, (ci, row) in enumerate(job.rows):
            by.setdefault((ci, len(row.ids), -1 if row.template is None else u), []).append(u)
        groups = []
        if self._ragged_ok():
            for wave in self._waves(job, by):
                lens: dict = {}  # n -> the wave's n-token rows, conversation order
                for (c, n, odd), idx in sorted(by.items()):
                    if odd < 0 and c in wave:
                        lens.setdefault(n, []).extend(idx)
                tmpl = max((job.tmpls[c] for c in wave), key=lambda t: len(t.prefix_ids))
                packed = self.decided.packed_rows
                for bucket in [sorted(lens)] if packed else length_buckets(sorted(lens)):
                    idx = np.asarray([u for n in bucket for u in lens[n]], dtype=np.int64)
                    toks = np.asarray([len(job.rows[u][1].ids) + len(job.tmpls[job.rows[u][0]].suffix_ids) for u in idx])
                    groups.append(Group(idx, self._rows_per_batch(tmpl, bucket[-1], None),
                                        self._rows_scorer(job, wave, packed), packed, toks if packed else None,
                                        rows_cap=self.decided.rows_cap))
        else:
            for (ci, n, odd), idx in sorted(by.items()):
                if odd < 0:
                    groups.append(Group(np.asarray(idx, dtype=np.int64), self._rows_per_batch(job.tmpls[ci], n, None),
                                        self._rows_scorer(job, {ci})))
        for (ci, n, odd), idx in sorted(by.items()):
            if odd >= 0:
                row_t = job.rows[odd][1].template

                def score(sel, b, ci=ci, row_t=row_t):
                    return self._plan(job.convs[ci], job.tmpls[ci]).score([job.rows[u][1].ids for u in sel], b, row_t,
                                                                          states=self._states)

                groups.append(Group(np.asarray(idx, dtype=np.int64), self._rows_per_batch(job.tmpls[ci], n, row_t), score))
        return groups

    def _waves(self, job: Job, by: dict) -> list[set]:
        """Consecutive conversations whose rows fill about one batch together: a conversation with
        fewer rows than a batch holds shares its batches with the next ones (wider GEMMs than its own
        rows give). A wave ends once its rows' tokens reach a full batch's, at :data:`WAVE_PROMPTS`
        conversations, or at :data:`WAVE_KV_BYTES` of prompt keys/values (all of a wave's prompt
        encodings are held at once)."""
        tokens = [0] * len(job.convs)
        for (c, n, odd), idx in by.items():
            if odd < 0:
                tokens[c] += len(idx) * (n + len(job.tmpls[c].suffix_ids))
        waves, cur, cur_tokens, cur_bytes = [], set(), 0, 0
        if not self.share_batches:
            return [{c} for c in range(len(job.convs))]
        for c in range(len(job.convs)):
            kv = self.prompt_bytes(len(job.tmpls[c].prefix_ids))
            full = self._rows_per_batch(job.tmpls[c], 64, None) * (64 + len(job.tmpls[c].suffix_ids))
            if cur and (cur_tokens >= full or len(cur) >= WAVE_PROMPTS or cur_bytes + kv > WAVE_KV_BYTES):
                waves.append(cur)
                cur, cur_tokens, cur_bytes = set(), 0, 0
            cur.add(c)
            cur_tokens += tokens[c]
            cur_bytes += kv
        return waves + ([cur] if cur else [])

    def _rows_scorer(self, job: Job, wave: set, packed: bool = False):
        """``score(rows, b)`` for a batch of shared-template rows of one or several conversations of
        ``wave``: :func:`rmfast.scoring.plan.score_together` over their plans (``packed``: the group's decision),
        scores back in the batch's order. The wave's plans stay cached until the next wave's batches run (:meth:`_plan`), so each
        prompt is encoded once per call whatever the cache size."""
        def score(sel, b):
            by_c: dict = {}  # conversation -> positions in sel
            for k, u in enumerate(sel):
                by_c.setdefault(job.rows[u][0], []).append(k)
            self._wave = {job.convs[c] for c in wave}
            self._encode_wave(job, wave)
            plans = [self._plan(job.convs[c], job.tmpls[c]) for c in by_c]
            out = score_together(plans, [[job.rows[sel[k]][1].ids for k in ks] for ks in by_c.values()], b,
                                 states=self._states, packed=packed)
            order = torch.from_numpy(np.argsort(np.concatenate([np.asarray(ks) for ks in by_c.values()]), kind="stable"))
            if self._states is None:
                return out[order.numpy()]
            return Scored(out.scores[order.numpy()], {k: v[order] for k, v in out.states.items()}, None)

        return score

    def _encode_wave(self, job: Job, wave: set) -> None:
        """Before a wave's batches: the plans of its conversations not cached yet, built together, so that
        their prompts run as ONE batched prefill (:func:`rmfast.fast.wave.one_prompt_pass`) where the rows'
        attention is the cascade (CUDA's form for texts): a fixed number of kernel launches per layer for
        the wave, wide GEMMs, instead of one batch-1 pass per prompt. Elsewhere (the CPU's forms) nothing
        changes: each plan is built, its prompt encoded alone, when its rows first run (:meth:`_plan`)."""
        todo = [c for c in sorted(wave) if job.convs[c] not in self._plans]
        if len(todo) < 2 or self.decided.engine != "fast" or self.decided.attention != "cascade":
            return  # the form decided once for the scorer (rmfast.scoring.decisions.decide)
        from ..fast.wave import one_prompt_pass

        try:
            with one_prompt_pass():
                for c in todo:
                    self._plan(job.convs[c], job.tmpls[c])
        except BaseException:  # no plan whose prompt was never encoded stays cached
            for c in todo:
                self._plans.pop(job.convs[c], None)
            raise

    def _ragged_ok(self) -> bool:
        """Ragged batches: the fast engine, by its rule (the plan's "rows" decision, :func:`rmfast.fast.engine.ragged_ok`)."""
        return self.decided.ragged

    def _rows_per_batch(self, tmpl: Template, n: int, row_t: Template | None) -> int:
        """Rows per batch for n-token responses, by the plan's rule, before the prompt is encoded."""
        return self.decided.rows_per_batch(self.model, row_t or tmpl, n, own_template=row_t is not None)

    @property
    def decisions(self) -> dict:
        """Every decision this scorer made (once, for every conversation), with its reason."""
        return {k: dict(v) for k, v in self.decided.reasons.items()}

    def _plan(self, conv: Conversation, tmpl: Template) -> ScoringPlan:
        """The conversation's plan: from the cache, or built now (its prompt encoded once)."""
        plan = self._plans.get(conv)
        if plan is not None:
            self._plans.move_to_end(conv)
            if conv not in self._fresh:
                self._fresh.add(conv)
                self.last_stats.prompts_from_cache += 1
            self.last_stats.attention = plan.decisions["attention"]["value"]
            self.last_stats.decisions = plan.decisions
            return plan
        # taken before any plan goes: the layers (on CPU fused weight copies of the whole model) outlive the plans,
        # so a full cache (cache_prompts=0 included) does not rebuild them for every new prompt
        share = next((p for p in self._plans.values() if p.eng is not None), self._donor)
        # the least recently used plans go, not the ones the batch at hand shares (its wave)
        old = [c for c in self._plans if c not in self._wave]
        while old and len(self._plans) >= max(1, self.cache_prompts):
            del self._plans[old.pop(0)]
        plan = plan_scoring(self.model, tmpl, decided=self.decided, share_with=share)
        self._plans[conv] = plan
        self._fresh.add(conv)
        self.last_stats.prompt_passes += 1
        self.last_stats.attention = plan.decisions["attention"]["value"]
        self.last_stats.decisions = plan.decisions
        return plan

    def _stats(self, job: Job) -> ScoreStats:
        n_batches = sum(len(g.batches()) for g in job.groups)
        resp = sum(len(r.ids) + len((r.template or job.tmpls[c]).suffix_ids) for c, r in job.rows)
        pads = packed = 0
        for g in job.groups:  # rows ascend by length within a group; batches are consecutive rows
            n = np.array([len(job.rows[u][1].ids) for u in g.rows])
            c = np.array([job.rows[u][0] for u in g.rows])
            for lo, hi in g.batches():
                b, bc = n[lo:hi], c[lo:hi]
                if b.min() == b.max() and bc.min() == bc.max():  # one prompt, one length: its plan's own batch
                    continue
                if g.packed:  # back to back: no pad token (score_together)
                    packed += 1
                else:
                    pads += int((b.max() - b).sum())
        return ScoreStats(len(job.shape), int(job.inverse.size), len(job.convs), 0, len(job.rows), n_batches, 0,
                          resp, sum(len(t.prefix_ids) for t in job.tmpls), padded_tokens=pads, packed_batches=packed)

    def _drop_stale_plans(self) -> None:
        """Cached plans hold prompt encodings and fused weight copies: drop them all if the model's
        weights changed since (an optimizer step, a loaded state dict, an edit through ``.data``:
        :func:`rmfast.scoring.weights.weights_fingerprint`)."""
        p = next(self.model.parameters())
        if p.device.type not in RUNNABLE:  # moved since (model.to("meta")): one line, not an error inside the watch
            check_runnable(self.model)
        key = self._weights_watch(self.model)
        if key != getattr(self, "_weights_key", None):
            self._plans.clear()
            self._donor = None
            self._weights_key = key
            if (p.device, p.dtype) != self._decided_for:  # cast or moved between calls: the forms follow the model
                self._decide(stacklevel=5)

    def _decide(self, stacklevel: int) -> None:
        """Every decision of the scorer (:func:`rmfast.scoring.decisions.decide`) for the model as it is now: at
        construction, and again after the model was cast or moved (``last_stats.decisions`` says what ran)."""
        self.decided = decide(self.model, self.options, "scorer", stacklevel=stacklevel)
        p = next(self.model.parameters())
        self._decided_for = (p.device, p.dtype)

    def clear_cache(self) -> None:
        """Drop every cached plan (prompt encodings and the weight copies they hold) and template: the
        next call encodes its prompts afresh from the model's weights as they are now. Call it after
        changing weights in a way :func:`rmfast.scoring.weights.weights_fingerprint` may not see (a few
        values edited by hand)."""
        with self._lock:
            self._plans.clear()
            self._donor = None
            self._tmpls.clear(), self.__dict__.pop("_facts", None)
            self._weights_key = None

    close = clear_cache  # (what a server calls at its shutdown: every cached plan dropped)


__all__ = ["Conversation", "Job", "Ranked", "RewardScorer", "ScoreStats", "as_conversation", "as_list", "messages_of"]
