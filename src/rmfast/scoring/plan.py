"""One scoring plan per job: every decision made once from the job's options, the engine built, and a
``score()`` that obeys it.

Every job that scores candidates (a vocabulary scan, text candidates, a sweep part, GCG's evaluator and
gradient, the benchmark, the TRL callback, :class:`rmfast.scoring.scorer.RewardScorer`, the bf16 audit)
builds a :class:`ScoringPlan` with :func:`plan_scoring` from ONE :class:`rmfast.scoring.options.ScoringOptions`
(every option, its default and its doc are there) and scores through :meth:`ScoringPlan.score`. The decisions
(device, dtype, head, engine, compile, kernels, attention form, batch rows, padding) are made by
:func:`rmfast.scoring.decisions.decide`, one rule each, and recorded with their reasons in
:attr:`ScoringPlan.decisions`, which every output's manifest carries.

**A token's score does not depend on the job it is in.** Nothing above is decided from the
job's size: ``compile=auto`` takes the same path for ten ids as for a whole vocabulary (the
compiled layer where this CPU kind was measured to gain from it, else the eager one; the two round
differently in bf16, ``docs/determinism.md``), and a batch's row count depends only on the response
length and the machine's free memory. With ``fixed_shapes`` (token scans, GCG) a short batch is padded to that
row count, or, on the eager CPU engine, to the smallest size measured on this machine to give every row
the full batch's bits (:mod:`rmfast.scoring.batching`): a subset's scores equal the whole scan's, bit for
bit, in fp32 and bf16 (same machine, threads, dtype), and a small job no longer pays a whole batch.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from .. import cpu
from ..fast.engine import Engine, score_prompts
from ..errors import UserError
from .hf_path import final_norm_module, hf_scores, n_layers
from .model_mode import scoring_mode
from ..states import LAST_NORMED, layer_index
from .states_stream import host_states
from .batching import PadSizes
from ..template import Template
from ..version import __version__
# the decisions and their rules (one site each: rmfast.scoring.decisions), named here too for callers
from .decisions import (CASCADE_MIN_ROW_TOKENS, COMPILE_CPU_KINDS, LENS_NEEDS_SCORE, Decisions,  # noqa: F401
                        choose_attention, choose_compile, choose_engine, choose_head, choose_kernels, compile_mode,
                        decide, default_head, engine_name, lm_only, row_tokens)
from .options import COMPILE_MODES, ENGINE_ALIASES, ScoringOptions  # noqa: F401

#: the engines
ENGINES = ("fast", "hf")


def _taps(states, lens: bool, L: int) -> tuple[dict, set | None]:
    """({state name: residual-stream index 0..L or ``last_normed``}, the indices to tap or None)."""
    idx = {name: layer_index(name, L) for name in states or ()}
    if not (idx or lens):
        return idx, None
    taps = {i for i in idx.values() if i != LAST_NORMED} | ({L} if LAST_NORMED in idx else set())
    return idx, taps | (set(range(L + 1)) if lens else set())


def _named_states(eng: Engine | None, idx: dict, got: dict, B: int, L: int):
    """The tapped states by name, (B, Dm) CPU tensors; ``last_normed``: what the head reads (the engine's
    final norm, fp32 by default, ``fp32_head``; on the plain-HF path its normed output). On CUDA the copies
    to the host do not block (:func:`rmfast.scoring.states_stream.host_states`: reading a tensor waits)."""
    st = {}
    for name, i in idx.items():
        if i != LAST_NORMED:
            st[name] = got[i][:B]  # (B, Dm)
        elif eng is not None:
            st[name] = eng._final_norm(got[L][:B], eng.fp32_head)
        else:
            st[name] = got["normed"][:B]
    return host_states(st)


class Scored(NamedTuple):
    """A batch scored with states (:meth:`ScoringPlan.score` with ``states`` or ``lens``).

    scores: (B,) float32; states: name -> (B, Dm) CPU tensor (a mapping; on CUDA reading one waits for
    its copy, :func:`rmfast.scoring.states_stream.host_states`) (model dtype; ``last_normed`` in the
    dtype the head reads it, fp32 by default); lens: (B, n_layers + 1) float32 or None, columns
    :func:`lens_names`."""

    scores: np.ndarray
    states: dict
    lens: np.ndarray | None


def lens_names(L: int) -> list[str]:
    """The lens columns of an L-layer model: the residual-stream indices 0..L-1 and last.

    The lens reads a stream through the final norm and the head, so at the end of the stack there is one
    lens, not a pair: ``lens_last`` is the head on the final norm of ``last_prenorm``, which is the head on
    ``last_normed``: the model's score. Its name stays ``last`` (no ``--states`` name is meant)."""
    return [*map(str, range(L)), "last"]


#: the manifest fields that decide a job's scores: a checkpoint is resumed only by a job that agrees on all
RUN_FIELDS = ("model", "prompt", "template", "head", "head_index", "dtype", "engine")


def score_meaning(head: str, head_index: int = 0, random_head_seed: int | None = None, end_of_turn: bool = True) -> str:
    """What a job's ``score`` column is, in words: its head, units and direction (the manifest's
    ``score_meaning``, copied into the Parquet's schema metadata). A seeded random head says so first.

    >>> score_meaning("score", random_head_seed=0).split(":")[0]
    'RANDOM score head (seed 0)'
    >>> score_meaning("next_token_logprob").split(" under")[0]
    'log p(first response token | prompt side)'
    >>> score_meaning("logprob", end_of_turn=False).split(" under")[0]  # a template with no end of turn after it
    'log p(response | prompt)'
    """
    if head == "next_token_logprob":  # rmfast logprobs: the first factor of the logprob head's score only
        return ("log p(first response token | prompt side) under the language model, in nats (natural log); "
                "higher = more likely; no end of turn")
    if head == "logprob" and not end_of_turn:  # (it said "+ log p(end of turn ...)" where none was scored)
        return ("log p(response | prompt) under the language model, in nats (natural log); higher = more likely; the "
                "template has no end of turn after the response, so none is scored")
    if head == "logprob":
        return ("log p(response | prompt) + log p(end of turn | prompt, response) under the language model, in "
                "nats (natural log); higher = more likely")
    if random_head_seed is not None:
        return (f"RANDOM score head (seed {random_head_seed}): a seeded random one-output head on the model's "
                "final hidden state, not a reward; no ranking to read (for hidden states only)")
    return f"the reward model's score head (output {head_index}), in its own units; higher = preferred"


#: the plan's decisions that change a score's arithmetic (its last bits), and a text job's compat: a rerun that
#: decides otherwise (another --attention, --compile or device kind) starts afresh rather than resume rows of
#: another path, which would equal neither run (review 48c); the batch sizes are the checkpoint's own
PATH_FIELDS = ("device", "compile", "kernels", "attention", "elementwise", "projections")


def run_fields(manifest: dict) -> dict:
    """The :data:`RUN_FIELDS` of a job's manifest, its path (:data:`PATH_FIELDS` of its decisions; the device by
    kind) and a text job's ``compat``. ``model`` is the loader's provenance, which names the content (a GGUF's
    sha256, a hub revision, a folder's :func:`rmfast.loading.loader.content_sha256`): a model whose weights changed
    is another job, never a resume of the old one's scores."""
    out = {k: manifest[k] for k in RUN_FIELDS if k in manifest}
    d = manifest.get("decisions") or {}
    path = {k: d[k]["value"] for k in PATH_FIELDS if isinstance(d.get(k), dict) and "value" in d[k]}
    if "device" in path:
        path["device"] = str(path["device"]).split(":")[0]  # the kind: a resume on another GPU of one kind is fine
    if path:
        out["path"] = path
    if "compat" in manifest:
        out["compat"] = manifest["compat"]
    return out


def run_key(manifest: dict) -> str:
    """The key a job's checkpoint is saved under: a hash of its :func:`run_fields`."""
    return hashlib.sha256(json.dumps(run_fields(manifest), sort_keys=True, default=str).encode()).hexdigest()[:16]


#: the rows of a batch asked for (--batch-size) above which a smaller job runs alone, unpadded (:meth:`ScoringPlan.one_batch_of_its_own`)
ALONE_ROWS = 8192


@dataclass
class ScoringPlan:
    """How one job scores: built by :func:`plan_scoring`, used by every batch of the job.

    Attributes:
        model, template: the model (eval mode) and the split prompt every row shares.
        head, head_index: "score" (output ``head_index``) or "logprob".
        engine: "fast" (:class:`rmfast.fast.engine.Engine`, built once: ``eng``) or "hf".
        compile: the compiled CPU layer (fast engine only).
        attention: the rows' attention form (:func:`choose_attention`; "hf" on the plain-HF path), and
            ``attention_reason`` why.
        batch_size: what was asked: "auto" or rows per batch (:meth:`rows_per_batch` gives the rows).
        fixed_shapes: pad every short batch so that a row's arithmetic does not depend on how many
            candidates the job has (default True): to :meth:`rows_per_batch` rows, or to a smaller size
            measured on this machine to give the same bits (:meth:`padded_rows`).
    """

    model: object
    template: Template
    head: str
    head_index: int
    engine: str
    compile: bool
    batch_size: int | str = "auto"
    fixed_shapes: bool = True
    eng: Engine | None = None
    compile_reason: str = ""
    attention: str = ""
    attention_reason: str = ""
    decided: Decisions | None = None
    _rows: dict = field(default_factory=dict, repr=False)
    _pads: dict = field(default_factory=dict, repr=False)  # (n, rows) -> PadSizes
    _own_batch: str | None = field(default=None, repr=False)  # why the job runs as one batch of its own rows
    rows_run: dict = field(default_factory=dict, repr=False)  # rows a batch ran as (padding included) -> batches

    @property
    def decisions(self) -> dict:
        """Each choice the plan made, its value and its reason in words (recorded in the manifest): job, device,
        dtype, head, engine, compile, kernels, attention, batch size (:func:`rmfast.scoring.decisions.decide`) and
        padding, compile and attention as they ran (a compile that failed fell back to the eager layer)."""
        out = {k: dict(v) for k, v in (self.decided.reasons if self.decided is not None else {}).items()}
        compiled = bool(self.eng is not None and self.eng.compile)
        out["compile"] = {"value": compiled, "reason": self.compile_reason if compiled == self.compile else
                          "torch.compile failed here: the eager layer ran"}
        out["attention"] = {"value": self.eng.attention if self.eng is not None else self.attention,
                            "reason": self.attention_reason}
        if self._rows:
            out["rows_per_batch"] = {"value": {f"{n} tokens": r for (n, t), r in sorted(self._rows.items(), key=str)
                                           if t is None},
                                 "reason": out.get("batch_size", {}).get("reason", "")}
        out["padding"] = {"value": ("measured sizes" if self._pads else "full batch") if self.fixed_shapes else "none",
                          "reason": self.padding()}
        return out

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokens_per_row(self, n: int, template: Template | None = None) -> int:
        """Tokens an n-token response's row feeds through the layers (:func:`row_tokens`)."""
        return row_tokens(template or self.template, self.head, n, self.eng is not None and template is None)

    def rows_per_batch(self, n: int, template: Template | None = None) -> int:
        """Rows per batch for n-token responses (:meth:`rmfast.scoring.decisions.Decisions.rows_per_batch`),
        decided once per shape (a memory warning is given once)."""
        key = (n, None if template is None else len(template.prefix_ids) + len(template.suffix_ids))
        if key not in self._rows:
            self._rows[key] = self.decided.rows_per_batch(self.model, template or self.template, n,
                                                          own_template=template is not None)
        return self._rows[key]

    @torch.no_grad()
    def score(self, cands, rows: int | None = None, template: Template | None = None, states=None,
              lens: bool = False, on_launched=None):
        """Scores of ``cands`` ((B, n) token ids, or a list of B equal-length id lists): (B,) float32.

        ``rows``: the batch's row count (default :meth:`rows_per_batch`); with ``fixed_shapes`` a
        shorter batch is padded to it (copies of its first row, dropped after). ``template``: rows
        that merged with the shared template carry their own (plain-HF path).
        ``states`` (canonical names, :func:`rmfast.states.parse_layers`) and ``lens``: then a
        :class:`Scored`, taken from the same forward; the scores are the same bits either way.
        ``on_launched``: called once the batch's work is queued on the device, before the wait for its scores
        (a token scan starts its host work there: :class:`rmfast.scoring.candidates.HostWork`).
        Rows of several lengths or prompts in one batch: :func:`score_together`.
        """
        cands = torch.as_tensor(cands, dtype=torch.long)
        if cands.ndim != 2:
            raise ValueError(f"cands must be (B, n) token ids, got shape {tuple(cands.shape)}")
        B = cands.shape[0]
        rows = rows or self.rows_per_batch(cands.shape[1], template)
        if self.fixed_shapes and B < rows:
            rows = self.padded_rows(B, rows, cands.shape[1], template)
            cands = torch.cat([cands, cands[:1].expand(rows - B, -1)])  # (rows, n)
        L = self.n_layers
        idx, taps = _taps(states, lens, L)
        on_engine = self.eng is not None and template is None
        with scoring_mode(self.model):  # eval mode, no caller's autocast (a job's own call holds it already: cheap)
            if on_engine:
                out = self.eng.score(cands, taps) if taps is not None else self.eng.score(cands)
            else:
                hf_taps = None if taps is None else taps | ({"normed"} if LAST_NORMED in idx or lens else set())
                out = hf_scores(self.model, template or self.template, cands.tolist(), head=self.head,
                                head_index=self.head_index, batch_size=max(rows, cands.shape[0]), taps=hf_taps)
        # what ran, said beside the batch size: counted once it ran (a batch out of memory, run again halved, is not)
        self.rows_run[cands.shape[0]] = self.rows_run.get(cands.shape[0], 0) + 1
        if on_launched is not None:
            on_launched()
        if taps is None:
            return out[:B].float().cpu().numpy()
        out, got = out
        scores = out[:B].float().cpu().numpy()
        st = _named_states(self.eng if on_engine else None, idx, got, B, L)
        lens_out = None
        if lens:
            if on_engine:
                lens_out = self.eng.lens({k: got[k] for k in range(L + 1)})[:B].cpu().numpy()  # (B, L + 1)
            else:
                lens_out = self._hf_lens(got, L)[:B]
        return Scored(scores, st, lens_out)

    def padded_rows(self, B: int, rows: int, n: int, template: Template | None = None) -> int:
        """Rows a short batch of B real rows runs as under ``fixed_shapes``: the smallest size measured to
        give every row a full batch's bits (:mod:`rmfast.scoring.batching`), where that is measured (the
        eager fast engine on CPU, the plan's own template); else the full ``rows``."""
        if self.eng is None or template is not None or self.eng.compile or self.device.type != "cpu":
            return rows
        key = (int(n), int(rows))
        if key not in self._pads:
            from ..loading.sources import cache_root

            try:
                cache = cache_root()
            except UserError:  # an unusable cache folder: verdicts for this job only
                cache = None
            self._pads[key] = PadSizes(self.eng, n, rows, cache)
        return self._pads[key].rows_for(B)

    @property
    def pad_probe_s(self) -> float:
        """Seconds this plan's jobs spent measuring padded sizes (:class:`rmfast.scoring.batching.PadSizes`)."""
        return sum(p.probe_s for p in self._pads.values())

    def one_batch_of_its_own(self, n_rows: int, rows: int) -> None:
        """A job of fewer rows than one batch of a --batch-size asked for over :data:`ALONE_ROWS` rows runs as one batch
        of just its rows: padding to such a batch cost that whole batch, or its probe (10 ids took 6 min under a huge
        --batch-size lowered to 129,136 rows). A smaller batch asked for still pads, so a subset of a job run at that
        size keeps the whole job's bits. Said in the padding decision."""
        if self.fixed_shapes and self.batch_size != "auto" and n_rows < rows and rows > ALONE_ROWS:
            self.fixed_shapes = False
            self._own_batch = (f"none: the job's {n_rows} rows are fewer than one batch of the --batch-size asked for "
                               f"({rows} rows, over {ALONE_ROWS:,}): one batch of just its rows (its last bits may "
                               "differ from a full batch's)")

    def padding(self) -> str:
        """How short batches were padded, for the manifest (the measured verdicts, or why the full row count)."""
        if not self.fixed_shapes:
            return self._own_batch or "none: every batch holds just its rows (a row's last bits may depend on its batch)"
        if not self._pads:
            why = ("the plain-HF engine" if self.eng is None else "the compiled layer (one graph per shape)"
                   if self.eng.compile else f"not measured on {self.device.type}" if self.device.type != "cpu" else
                   "no short batch in this job")
            return f"every batch padded to the full row count ({why})"
        return "; ".join(p.summary() for p in self._pads.values())

    @property
    def n_layers(self) -> int:
        return self.eng.n_layers if self.eng is not None else n_layers(self.model)

    def _hf_lens(self, got: dict, L: int) -> np.ndarray:
        """The lens on the plain-HF path: the model's own final norm and ``score`` head on each state
        (index L: HF's normed output itself, what its head read). (B, L + 1) float32."""
        norm, head = final_norm_module(self.model), getattr(self.model, "score", None)
        cols = [head(got["normed"] if k == L else norm(got[k]))[:, self.head_index].float() for k in range(L + 1)]
        return torch.stack(cols, dim=1).cpu().numpy()  # (B, L + 1)

    def check_states(self, lens: bool, states: bool) -> None:
        """What --states / --lens need, checked before any work (one-line UserErrors)."""
        if lens and self.head != "score":
            raise UserError(LENS_NEEDS_SCORE.format(head=self.head))
        if lens and self.eng is None and not (isinstance(getattr(self.model, "score", None), torch.nn.Linear)
                                              and final_norm_module(self.model) is not None):
            raise UserError("--lens on the plain-HF path needs a *ForSequenceClassification model (a final norm and "
                            "a linear score head); use --engine fast where the architecture is on the fast path")
        if (lens or states) and self.head == "logprob" and not self.template.continuation_ids:
            raise UserError("--states: a logprob head on a template with no end-of-turn continuation scores "
                            "one-token responses from the prompt pass alone; there is no per-candidate state to keep")

    def manifest(self, prompt: str, model_info: dict | None = None) -> dict:
        """The fields every scoring job records: model, prompt, template ids, head, dtype (and how it
        was chosen), device, engine and whether the layer was compiled."""
        from ..loading.loader import recorded_source

        m, p = self.model, next(self.model.parameters())
        model_info = model_info or recorded_source(m)  # a model rmfast.load gave knows where it came from
        return {
            "rmfast_version": __version__,
            "model": model_info or {"name": getattr(m.config, "name_or_path", None) or type(m).__name__},
            "architecture": (getattr(m.config, "architectures", None) or [type(m).__name__])[0],
            "prompt": prompt,
            "template": self.template.manifest(),
            "head": self.head,
            "head_index": self.head_index,
            "score_meaning": score_meaning(self.head, self.head_index, (model_info or {}).get("random_head_seed"),
                                           end_of_turn=bool(self.template.continuation_ids)),
            "dtype": str(p.dtype).replace("torch.", ""),
            **cpu.manifest_fields(m),
            "device": str(p.device),
            "engine": self.engine,
            "compiled": bool(self.eng is not None and self.eng.compile),
            "compile_reason": self.compile_reason,
            "decisions": self.decisions,
            "fixed_shapes": self.fixed_shapes,
            "score_position": "final position of prefix + response + suffix (never 'last non-pad')",
        }


def finish_manifest(manifest: dict, t0: float, *, plan: ScoringPlan | None = None, decisions: dict | None = None,
                    options: ScoringOptions | None = None, timing: dict | None = None, **fields) -> dict:
    """The fields every job's manifest ends with, made in one place: the decisions as they ran (a plan's, or
    ``decisions``; with a ``resumed`` entry where rows came from a checkpoint), the options, the timing, any
    job ``fields``, the wall time since ``t0``, versions and creation time. Updates ``manifest`` and returns it."""
    d = dict(plan.decisions if plan is not None else decisions or {})
    resumed = int((timing or {}).get("resumed_candidates") or 0)
    if resumed:
        d["resumed"] = {"value": resumed, "reason": "rows taken from the checkpoint of an earlier run of this job (the "
                        "same run fields); its batch sizes reused, so every batch is the uninterrupted job's"}
    manifest.update({**fields, **(timing or {}), "decisions": d})
    probe_s = round(plan.pad_probe_s, 3) if plan is not None else 0.0  # rounded as scan_s is: the rate follows from both
    if probe_s and manifest.get("candidates_per_s") and manifest.get("scan_s", 0) > probe_s:
        # the one-off padding measurement ran inside the scan's time: candidates_per_s is the scoring's own (what a
        # later job of this shape runs at), candidates_per_s_with_pad_probe what this job ran at (a 5,000-id scan
        # reported 67.6 cand/s and ran at 39.6); both named, so neither is read as the other
        n_new = manifest.get("scored_candidates") or manifest.get("n_candidates")
        manifest.update(pad_probe_s=probe_s, candidates_per_s=cpu.round_rate(n_new / (manifest["scan_s"] - probe_s)),
                        candidates_per_s_with_pad_probe=cpu.round_rate(n_new / manifest["scan_s"]))
    if plan is not None and plan.rows_run:  # {rows: batches}, keys as text (JSON's)
        manifest["rows_run"] = {str(r): n for r, n in sorted(plan.rows_run.items(), reverse=True)}
    if options is not None:
        manifest["options"] = options.as_dict()
    manifest.update({"wall_s": round(time.perf_counter() - t0, 3), "versions": cpu.versions(),
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return manifest


def plan_scoring(model, template: Template, options: ScoringOptions | None = None, *, job: str = "scan",
                 response_tokens: int | None = None, share_with: ScoringPlan | None = None,
                 decided: Decisions | None = None, fixed_shapes: bool | None = None, stacklevel: int = 3,
                 **option_kw) -> ScoringPlan:
    """Decide how a job scores, from its options passed whole (:class:`rmfast.scoring.options.ScoringOptions`;
    the older keyword form, ``engine="hf"``, is folded into them), and build the engine: its prompt encoded once.

    ``job``: what the plan scores for (:data:`rmfast.scoring.decisions.JOBS`: scan, texts, gcg, ...), which
    some decisions read (a job kind that never compiles; whether short batches are padded). ``decided``: the
    caller's decisions already made (:func:`rmfast.scoring.decisions.decide`; a RewardScorer decides once for
    every conversation). ``share_with``: a fast-engine plan of the same model (another prompt) whose layers (the
    fused weight copies) this plan's engine uses too; their rows can then share batches (:func:`score_together`).
    ``response_tokens``: the longest response the job scores, in tokens (1 for a vocabulary scan; None: texts of
    any length), for the attention form. ``fixed_shapes``: overrides the job's padding rule (tests).
    Raises UserError on bad options. Every decision and its reason: :attr:`ScoringPlan.decisions`.

    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> from rmfast.template import build_template  # doctest: +SKIP
    >>> tmpl = build_template(lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
    >>> plan = plan_scoring(lm.model, tmpl, ScoringOptions(compile="off"))  # doctest: +SKIP
    >>> plan.decisions["attention"]  # doctest: +SKIP
    {'value': 'cpu-flash', 'reason': "the CPU's eager form (torch's flash kernel for prompts or rows of 256+ tokens, bmm below)"}
    >>> plan.score([[1234], [5678]])  # (2,) float32 log-probabilities  # doctest: +SKIP
    """
    if decided is None:
        decided = decide(model, ScoringOptions.of(options, **option_kw), job, template=template,
                         response_tokens=response_tokens, stacklevel=stacklevel + 1)
    d = decided
    layers = share_with.eng.layers if share_with is not None and share_with.eng is not None else None
    if layers is not None and (len(layers[0][0].w_qkv) == 1) != d.fuse:  # the shared layers are in the other layout
        raise ValueError("share_with: its layers' projections differ from this plan's decision (decide once, share it)")
    eng = None
    if d.engine == "fast":
        with scoring_mode(model):  # the prompt pass: eval mode, no caller's autocast (as every batch after it)
            eng = Engine(model, template, head=d.head, head_index=d.head_index, layers=layers, compile=d.compile,
                         attention=d.attention, triton=d.triton, elementwise=d.elementwise, fuse=d.fuse)
    return ScoringPlan(model, template, d.head, d.head_index, d.engine, d.compile, d.options.batch_size,
                       d.fixed_shapes if fixed_shapes is None else fixed_shapes, eng,
                       compile_reason=d.reasons["compile"]["reason"], attention=d.attention,
                       attention_reason=d.reasons["attention"]["reason"], decided=d)


def score_together(plans: list[ScoringPlan], ids: list[list], rows: int, states=None, packed: bool | None = None):
    """Rows of one or several prompts' plans in one batch: ``ids[i]`` lists the token-id lists of plan i's
    rows (any lengths). Returns (sum of rows,) float32 in that order (plan 0's rows first); with
    ``states`` (canonical names) a :class:`Scored` (no lens), states taken at each row's final position.

    One plan, one length: :meth:`ScoringPlan.score`. Otherwise the fast engine's ragged rows
    (:func:`rmfast.fast.engine.score_prompts`; the plans share layers, ``share_with``): each row read at
    its own final position, attention per prompt, everything else over all rows at once; ``packed``: whether those
    run packed back to back, as the caller's plan decided (None: the engine's rule for the batch).
    """
    if len(plans) == 1 and len({len(r) for r in ids[0]}) == 1:
        return plans[0].score(ids[0], rows, states=states)
    if any(p.eng is None or not p.eng.can_score_ragged() for p in plans):
        raise ValueError("rows of several lengths or prompts in one batch need the fast engine's score head (not gated)")
    resp, lens = [], []
    for plan_rows in ids:
        n = max(len(r) for r in plan_rows)
        x = torch.zeros(len(plan_rows), n, dtype=torch.long)  # (B_i, n), right-padded
        for k, r in enumerate(plan_rows):
            x[k, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        resp.append(x)
        lens.append(torch.tensor([len(r) for r in plan_rows]))
    L = plans[0].n_layers
    idx, taps = _taps(states, False, L)
    out = score_prompts([p.eng for p in plans], resp, lens, taps, packed)
    if taps is None:
        return out.float().cpu().numpy()
    scores, got = out
    return Scored(scores.float().cpu().numpy(), _named_states(plans[0].eng, idx, got, scores.shape[0], L), None)
