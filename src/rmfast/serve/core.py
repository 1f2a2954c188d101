"""The reward server's scoring core: whole token sequences in, one score each, the same bits whatever else is
scored with them.

A *sample* is the sequence the reward model reads (:class:`Sample`): its ids and where its prompt part ends. The
split is a function of the sample alone (:func:`split_sample`), never of what else is waiting:

1. the reward model's own assistant header (the ids its chat template puts between the user's turn and the
   response, :func:`assistant_header`), its last occurrence with at least one token after it: a GRPO group sent as
   N requests carries one prompt, so its N samples split at the same place and share one encoding;
2. else the client's prompt (OpenRLHF's ``prompts`` field, rmfast's own ``conversations``), where its ids begin
   the sample's;
3. else none: the sample is encoded alone (all but its last token as its "prompt"), counted apart in the metrics.

The prompt part is encoded once (:class:`rmfast.scoring.plan.ScoringPlan`, a batch-1 pass of exactly those ids)
and kept in a cache bounded in bytes; the rest runs as a row against it. **Batch invariance** (a sample's score
does not depend on the requests it was batched with, their order or how the waves were cut) needs every piece of
a row's arithmetic to be a function of the sample alone:

- the prompt's keys/values: a pass of the prompt's own ids, whichever sample brought it (in the cascade form, CUDA's,
  a wave's new prompts share ONE packed prefill, :func:`rmfast.fast.wave.one_prompt_pass`: each prompt causal over its
  own tokens, the GEMMs under the rows rule, so its keys/values are the same bits as its own pass's);
- the row's layout: a wave's rows, of every prompt and length, run packed back to back with no pads
  (:class:`rmfast.fast.layer.PackedRows`), every layer at every token, attention per row over its own prompt's
  keys and its own, a sliding window by each token's own position (the prompt part's GEMMs under the rows rule,
  contiguous operands);
- the GEMMs: the libraries pick kernels by the number of rows M. Under the plan's rows rule
  (:func:`rmfast.fast.ops.gemm_rows`) every linear runs either at >= :data:`PAD_ROWS` rows in one GEMM, where
  a probe at start (:func:`rmfast.scoring.decisions.choose_gemm_rows`) measured this machine's kernels to give a row the same bits at every
  M from there on, or in fixed chunks of :data:`CHUNK_ROWS` rows (always invariant; slower);
- the score head (a matrix-vector product): fixed chunks of 64 rows;
- norms and products: per element or row already; the elementwise work with an exp, tanh or cos (SiLU or GELU, the
  soft-max over a prompt's keys, the merge, the rotary tables) on the CPU in calls of one size or in fixed blocks of
  positions (:func:`rmfast.kernels.torch_twins.each_alike`, :func:`rmfast.fast.ops.rope_tables`): torch splits a large
  op between threads, and on an AVX-512 CPU (a Zen 4) the elements at the split took a scalar exp of other last
  bits, so a sample's score moved by one ulp with the rows beside it.

``tests/test_serve.py`` checks the result bit for bit: 64 samples alone, all at once shuffled among other traffic,
and from 8 concurrent clients.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from ..dims import kv_bytes
from ..errors import UserError
from ..fast import ops
from ..fast.engine import score_prompts
from ..fast.wave import one_prompt_pass
from ..scoring.candidates import max_positions
from ..scoring.decisions import CHUNK_ROWS, PAD_ROWS, choose_gemm_rows, decide
from ..scoring.hf_path import hf_scores
from ..scoring.options import ScoringOptions
from ..scoring.plan import ScoringPlan, plan_scoring, score_meaning
from ..scoring.rendered import assistant_header, last_end
from ..template import Template

@dataclass(frozen=True)
class Sample:
    """One sequence to score: ``ids`` the whole sequence the reward model reads, ``split`` where its prompt part
    ends (``ids[:split]`` encoded once and shared, ``ids[split:]`` its row; at least one token), ``rule`` which
    split rule found it ("header", "prompt" or "none", :func:`split_sample`)."""

    ids: tuple
    split: int
    rule: str

    @property
    def prompt(self) -> tuple:
        return self.ids[: self.split]

    @property
    def rest(self) -> tuple:
        return self.ids[self.split:]


def split_sample(ids, header: tuple = (), prompt_ids=None) -> Sample:
    """Where a sample's prompt part ends, by the module doc's rules (the sample's own ids only).

    >>> split_sample((1, 7, 8, 4, 5, 7, 8, 9, 9), header=(7, 8))   # the last header, then the response
    Sample(ids=(1, 7, 8, 4, 5, 7, 8, 9, 9), split=7, rule='header')
    >>> split_sample((1, 2, 3, 4), header=(7, 8), prompt_ids=(1, 2)).split
    2
    >>> split_sample((1, 2, 3, 4)).rule, split_sample((1, 2, 3, 4)).split
    ('none', 3)
    """
    ids = tuple(int(i) for i in ids)
    if len(ids) < 2:
        raise UserError(f"a sample of {len(ids)} token(s): a reward model reads a prompt and a response; send at "
                        "least two tokens")
    if header:
        end = last_end(ids, tuple(header))
        if end > 0:
            return Sample(ids, end, "header")
    if prompt_ids is not None:
        p = tuple(prompt_ids)
        if 0 < len(p) < len(ids) and ids[: len(p)] == p:
            return Sample(ids, len(p), "prompt")
    return Sample(ids, len(ids) - 1, "none")


def longest_token_chars(tokenizer) -> int | None:
    """The most characters one token of ``tokenizer`` can stand for, where that bounds a text's tokens from below (a
    text of more characters than the positions times this cannot fit, tokenized or not: refused before it is
    tokenized, :meth:`rmfast.serve.app.Ctx.fits_chars`); None where it does not: a normalizer that may shorten the
    text (whitespace collapsed, Unicode composed), pieces given as bytes, a tokenizer that is not a fast one.

    The longest raw piece: a byte-level piece's characters are its bytes (never fewer than the text's), a
    SentencePiece one's its characters with "▁" for a space."""
    import json

    try:
        norm = json.loads(tokenizer.backend_tokenizer.to_str()).get("normalizer")
        steps = [] if norm is None else norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
        for n in steps:  # only steps that never shorten the text: a prefix, a string replaced by one as long
            if not (n.get("type") == "Prepend" or (n.get("type") == "Replace" and "String" in n.get("pattern", {})
                                                    and len(n.get("content", "")) >= len(n["pattern"]["String"]))):
                return None
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    except Exception:  # noqa: BLE001 - no backend (a slow tokenizer), or pieces it cannot name: no bound
        return None
    if not all(isinstance(p, str) for p in pieces if p is not None):
        return None
    return max([1, *(len(p) for p in pieces if p is not None)])


#: the most row tokens of one packed call (:meth:`ServeCore._score_packed`): any cut gives the same bits; this bounds
#: the prompt part's fp32 scores on the CPU (tokens x group heads x prompt length per kv head)
PACK_TOKENS = 8192


@dataclass
class CoreStats:
    """What the core has done, for ``/metrics`` (totals since start)."""

    samples: int = 0
    tokens: int = 0
    waves: int = 0
    batches: int = 0
    batch_rows: int = 0
    batch_tokens: int = 0  # row tokens the GEMMs ran (pads included)
    real_tokens: int = 0  # row tokens that were the samples' own
    prompt_encodings: int = 0
    prompt_tokens_encoded: int = 0
    prompt_reencodings: int = 0  # a prompt encoded again after its encoding left the cache
    prompt_hits: int = 0  # samples whose prompt part was encoded already (cache or earlier in the wave)
    prompt_tokens_saved: int = 0
    unsplit: int = 0  # samples with no shared prompt (split rule "none")
    nonfinite: int = 0
    by_rule: dict = field(default_factory=dict)


class ServeCore:
    """Scores :class:`Sample` s for the server (the module doc's rules), one wave at a time.

    Args:
        model, tokenizer: loaded (:func:`rmfast.loading.loader.load`).
        options: the scoring options, passed whole (:class:`rmfast.scoring.options.ScoringOptions`).
        template: a chat template or plain format overriding the tokenizer's (as ``rmfast scan --template``).
        cache_bytes: the prompt encodings kept between waves (their keys/values), least recently used dropped.
        gemm_rows: "auto" (:func:`rmfast.scoring.decisions.choose_gemm_rows`), "pad" or "chunk".
        name: the model's name in responses.
    """

    def __init__(self, model, tokenizer, options: ScoringOptions | None = None, *, template: str | None = None,
                 cache_bytes: int = 1 << 30, gemm_rows: str = "auto", name: str = "model", model_info: dict | None = None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.options = options or ScoringOptions()
        self.decided = decide(model, self.options, "serve")
        if self.decided.head != "score":
            raise UserError(f"rmfast serve scores with a reward model's score head; {name} has none (head "
                            f"{self.decided.head}): serve a reward model (or load this one with --random-head-seed "
                            "for a test server)")
        self.template = template
        self.head_index = self.options.head_index
        self.header = assistant_header(tokenizer, template)
        self.cache_bytes = int(cache_bytes)
        self.limit = max_positions(model)
        self.longest_token_chars = longest_token_chars(tokenizer)
        self.model_info = model_info or {}
        self._plans: OrderedDict = OrderedDict()  # prompt ids -> ScoringPlan, least recently used first
        self._bytes = 0
        self._donor: ScoringPlan | None = None  # a plan whose layers (fused weight copies) every new plan shares
        self._seen: OrderedDict = OrderedDict()  # prompt ids (hash) -> encodings so far, the most recent 100k
        self._lock = threading.Lock()
        self.stats = CoreStats()
        self.reasons = {k: dict(v) for k, v in self.decided.reasons.items()}
        self.rows_rule, why = self._rows_rule(gemm_rows)
        # the plan's decisions record it, with its reason, as every scoring decision is (the manifest's decisions),
        # and what it changes of the attention
        self.decided.record_rows_rule(self.rows_rule, why)
        self.reasons.update({k: dict(self.decided.reasons[k]) for k in ("gemm_rows", "attention")})
        self.reasons["split"] = {"value": "header, else prompt, else none", "reason": (
            "a function of the sample alone (its ids, and the client's prompt where sent), never of what else is "
            "waiting: the RM's assistant header " + (f"{list(self.header)}" if self.header else "(none in this template)")
            + "'s last occurrence; else the client's prompt where its ids begin the sample's; else no shared prompt")}
        # the plan's "rows" decision for this job, recorded there with its reason as every scoring decision is
        self.decided.packed_rows = True
        self.decided.record("rows", "packed", (
            "a wave's rows, of every prompt and length, run packed back to back with no pads, in calls of at most "
            f"{PACK_TOKENS} tokens: every GEMM over the wave's real tokens, every layer at every token, attention per "
            "row over its own prompt and itself (a sliding window by each token's own position); the rows rule keeps "
            "a token's bits its own wherever it sits"))
        self.reasons["rows"] = dict(self.decided.reasons["rows"])
        self.reasons["prompt_cache"] = {"value": f"{self.cache_bytes / 2**20:.0f} MiB",
                                        "reason": "prompt encodings kept between waves, least recently used dropped"}
        self.score_meaning = score_meaning("score", self.head_index, self.model_info.get("random_head_seed"))

    # ------------------------------------------------------------------ decisions
    def _rows_rule(self, how: str):
        if self.decided.engine != "fast":
            return None, "the plain Hugging Face path runs each sample alone (batch 1, its own length): no rows to cut"
        p = next(self.model.parameters())
        self._donor = self._new_plan((0, 1))  # any two ids: the engine's layers (shared by every plan, probed here)
        if how == "chunk":
            return ("chunk", CHUNK_ROWS), f"asked for: every linear in chunks of exactly {CHUNK_ROWS} rows"
        if how == "pad":
            return ("pad", PAD_ROWS), f"asked for: one GEMM per linear, at least {PAD_ROWS} rows (not measured)"
        return choose_gemm_rows(self._donor.eng.layers, p.dtype, p.device)

    def _new_plan(self, prompt: tuple) -> ScoringPlan:
        tmpl = Template(tuple(prompt), (), 0, "", None, "ids")
        with ops.gemm_rows(getattr(self, "rows_rule", None)):
            return plan_scoring(self.model, tmpl, decided=self.decided, share_with=self._donor, fixed_shapes=False)

    @property
    def decisions(self) -> dict:
        return {k: dict(v) for k, v in self.reasons.items()}

    def prompt_bytes(self, n: int) -> int:
        """Bytes of one cached prompt encoding of n tokens: keys and values in every layer."""
        return kv_bytes(self.model, n)

    # ------------------------------------------------------------------ samples
    def sample(self, ids, prompt_ids=None) -> Sample:
        """A sample of ``ids`` split by :func:`split_sample`; UserError over the model's positions."""
        s = split_sample(ids, self.header, prompt_ids)
        if self.limit is not None and len(s.ids) > self.limit:
            raise UserError(f"a sample of {len(s.ids)} tokens is over the model's {self.limit} positions")
        return s

    def score(self, samples: list[Sample]) -> np.ndarray:
        """(len(samples),) float32 scores, in order; a sample's score is the same bits in any wave."""
        with self._lock, torch.inference_mode():
            t0 = time.perf_counter()
            out = np.full(len(samples), np.nan, dtype=np.float32)
            if self.decided.engine != "fast" or not self._ragged():
                for k, s in enumerate(samples):
                    out[k] = self._score_alone(s)
            else:
                try:
                    self._score_rows(samples, out)
                finally:  # a wave keeps its own prompts while it runs, whatever their bytes; then the bound holds again
                    self._trim()
            st = self.stats
            st.samples += len(samples)
            st.tokens += sum(len(s.ids) for s in samples)
            st.waves += 1
            st.nonfinite += int((~np.isfinite(out)).sum())
            for s in samples:
                st.by_rule[s.rule] = st.by_rule.get(s.rule, 0) + 1
            st.unsplit += sum(s.rule == "none" for s in samples)
            self.last_wave_s = time.perf_counter() - t0
            return out

    def _ragged(self) -> bool:
        return self._donor is not None and self._donor.eng is not None and self._donor.eng.can_score_ragged()

    def _score_alone(self, s: Sample) -> float:
        """The plain-HF path (a model off the fast path, or a gated head): one sample, batch 1, its own length."""
        tmpl = Template(s.ids[:-1], (), 0, "", None, "ids")
        self.stats.batches += 1
        self.stats.batch_rows += 1
        self.stats.batch_tokens += len(s.ids)
        self.stats.real_tokens += len(s.ids)
        return float(hf_scores(self.model, tmpl, [[s.ids[-1]]], head="score", head_index=self.head_index,
                               batch_size=1)[0])

    def _score_rows(self, samples: list[Sample], out: np.ndarray) -> None:
        by_prompt: OrderedDict = OrderedDict()  # prompt ids -> [sample positions]
        for k, s in enumerate(samples):
            by_prompt.setdefault(s.prompt, []).append(k)
        keep, plans = set(by_prompt), {}
        try:  # the wave's new prompts in ONE packed prefill where the engines take it (the cascade form: CUDA's)
            with ops.gemm_rows(self.rows_rule), one_prompt_pass(packed_alone=True):
                for prompt, ks in by_prompt.items():
                    # a prompt only "none" samples have is each one's own prefix: encoded for this wave, never cached
                    plans[prompt], fresh = self._plan(prompt, keep, all(samples[k].rule == "none" for k in ks))
                    self.stats.prompt_hits += len(ks) - (1 if fresh else 0)
                    self.stats.prompt_tokens_saved += len(prompt) * (len(ks) - (1 if fresh else 0))
        except BaseException:  # a prompt left unencoded never stays cached
            for prompt, plan in plans.items():
                if plan.eng is not None and plan.eng.kv is None:
                    self._drop(prompt)
            raise
        self._score_packed(samples, list(range(len(samples))), plans, out)

    def _score_packed(self, samples: list[Sample], ks: list, plans: dict, out: np.ndarray) -> None:
        """Rows of every prompt and length packed back to back, no pads, in calls of at most :data:`PACK_TOKENS`
        row tokens: the GEMMs run over the wave's real tokens (the rows rule keeps each token's bits its own),
        attention per row over its prompt (:class:`rmfast.fast.layer.PackedRows`; any engine form: the torch twin
        on CPU)."""
        calls, tokens = [[]], 0
        for k in ks:
            n = len(samples[k].rest)
            if calls[-1] and tokens + n > PACK_TOKENS:
                calls.append([])
                tokens = 0
            calls[-1].append(k)
            tokens += n
        for call in calls:
            if call:
                by_prompt: OrderedDict = OrderedDict()
                for j in call:
                    by_prompt.setdefault(samples[j].prompt, []).append(j)
                order = [j for js in by_prompt.values() for j in js]  # score_prompts' order: prompt by prompt
                xs, lens = [], []
                for js in by_prompt.values():
                    n = torch.tensor([len(samples[j].rest) for j in js])
                    x = torch.zeros(len(js), int(n.max()), dtype=torch.long)  # (B_i, n_i), right-padded
                    for r, j in enumerate(js):
                        x[r, : n[r]] = torch.as_tensor(samples[j].rest, dtype=torch.long)
                    xs.append(x)
                    lens.append(n)
                with ops.gemm_rows(self.rows_rule):
                    got = score_prompts([plans[p].eng for p in by_prompt], xs, lens, None, packed=True)
                out[np.asarray(order)] = got.float().cpu().numpy()
                real = sum(int(n.sum()) for n in lens)
                self._count_batch(len(call), real, real)

    def _count_batch(self, rows: int, gemm_tokens: int, real_tokens: int) -> None:
        st = self.stats
        st.batches += 1
        st.batch_rows += rows
        st.batch_tokens += gemm_tokens
        st.real_tokens += real_tokens

    def _plan(self, prompt: tuple, keep: set, transient: bool = False) -> tuple[ScoringPlan, bool]:
        """The prompt's plan (encoded now, or from the cache) and whether it was encoded now. ``transient``: a plan
        for this wave only, never cached, so it evicts nothing (an unsplit sample's own prefix would push out the
        encodings of groups whose other samples are still to come, and be dropped after its wave anyway)."""
        plan = self._plans.get(prompt)
        if plan is not None:
            self._plans.move_to_end(prompt)
            return plan, False
        if transient:
            self.stats.prompt_encodings += 1
            self.stats.prompt_tokens_encoded += len(prompt)
            return self._new_plan(prompt), True
        need = self.prompt_bytes(len(prompt))
        for old in [p for p in self._plans if p not in keep]:  # least recently used first; never this wave's
            if self._bytes + need <= self.cache_bytes:
                break
            self._drop(old)
        plan = self._new_plan(prompt)
        self._plans[prompt] = plan
        self._bytes += need
        key = hash(prompt)
        times = self._seen.pop(key, 0)
        self._seen[key] = times + 1
        if len(self._seen) > 100_000:
            self._seen.popitem(last=False)
        self.stats.prompt_encodings += 1
        self.stats.prompt_tokens_encoded += len(prompt)
        self.stats.prompt_reencodings += times > 0
        return plan, True

    def _trim(self) -> None:
        """Least recently used prompt encodings dropped until the cache is within its bytes (a wave of many prompts
        had left it over its bound until a later wave's new prompt came)."""
        while self._bytes > self.cache_bytes and self._plans:
            self._drop(next(iter(self._plans)))

    def _drop(self, prompt: tuple) -> None:
        if self._plans.pop(prompt, None) is not None:
            self._bytes -= self.prompt_bytes(len(prompt))

    @property
    def cached_prompts(self) -> int:
        return len(self._plans)

    @property
    def cached_bytes(self) -> int:
        return self._bytes
