"""One scoring plan per job: head, engine, compile and batch shape, decided once from the whole job.

Every job that scores candidates (a vocabulary scan, text candidates, a sweep part, GCG's
evaluator, the benchmark, the TRL callback) builds a :class:`ScoringPlan` with
:func:`plan_scoring` and scores through :meth:`ScoringPlan.score`. The options have one name
everywhere:

=============  =========================================================================  =========
option         values                                                                     default
=============  =========================================================================  =========
head           ``auto`` (``score`` for reward models/classifiers, ``logprob`` for causal  auto
               LMs), ``score``, ``logprob``
head_index     which output of a multi-output score head                                   0
engine         ``auto`` (``fast`` where the architecture is on the fast path, else ``hf``  auto
               with a warning), ``fast`` (the shared-prompt engine), ``hf`` (the plain
               Hugging Face forward of each whole conversation; ``reference`` is its old
               name)
compile        ``auto`` (the compiled CPU layer on CPU kinds where it was measured to pay,  auto
               :data:`COMPILE_CPU_KINDS`; else eager; never decided from the job's size),
               ``on`` (``torch.compile`` the CPU decoder layer: a one-off compile of
               seconds, cached on disk), ``off``
batch_size     ``auto`` (~4k tokens per batch on CPU, ~128k on CUDA, never more rows than  auto
               fit in half the free memory) or rows per batch
attention      ``auto`` (:func:`choose_attention`: on CUDA the Triton shared-prefix      auto
               kernel for rows of at most :data:`CASCADE_MIN_ROW_TOKENS` tokens, the
               cascade above; the CPU's own forms on CPU) or one of
               :data:`rmfast.fast.ops.ATTENTION_FORMS`
=============  =========================================================================  =========

**A token's score does not depend on the job it is in.** Nothing above is decided from the
job's size: ``compile=auto`` takes the same path for ten ids as for a whole vocabulary (the
compiled layer where this CPU kind was measured to gain from it, else the eager one; the two round
differently in bf16, ``docs/determinism.md``), and a batch's row count depends only on the response
length and the machine's free memory. With ``fixed_shapes`` (token scans, GCG) a short batch is padded to that
row count, or, on the eager CPU engine, to the smallest size measured on this machine to give every row
the full batch's bits (:mod:`rmfast.scoring.padding`): a subset's scores equal the whole scan's, bit for
bit, in fp32 and bf16 (same machine, threads, dtype), and a small job no longer pays a whole batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from .. import cpu
from ..fast import ops
from ..fast.engine import Engine, blockdiag_overhead, score_prompts
from ..errors import UserError
from .hf_path import final_norm_module, hf_scores, n_layers
from ..states import LAST_NORMED, layer_index
from .states_stream import host_states
from .memory import auto_batch_size, cap_batch_size, parse_batch_size, row_bytes
from .padding import PadSizes
from ..fast.arch import arch_spec
from ..template import Template
from ..version import __version__

#: the engines, and the older name of one of them
ENGINES = ("fast", "hf")
ENGINE_ALIASES = {"reference": "hf"}
COMPILE_MODES = ("auto", "on", "off")


def default_head(model) -> str:
    """'score' for classifiers / reward models, 'logprob' for causal LMs."""
    names = " ".join(getattr(model.config, "architectures", None) or [type(model).__name__])
    if isinstance(getattr(model, "score", None), torch.nn.Module) or "SequenceClassification" in names or "Reward" in names:
        return "score"
    if hasattr(model, "lm_head") or "CausalLM" in names:
        return "logprob"
    return "score"


def lm_only(model) -> bool:
    """A causal LM: an LM head and no reward head (a classifier's ``score``/``classifier``, or the
    ArmoRM/QRM/URM head rmfast runs, ``rmfast_head``), so nothing for a score head to read."""
    return isinstance(getattr(model, "lm_head", None), torch.nn.Module) and not any(
        getattr(model, h, None) is not None for h in ("score", "classifier", "rmfast_head"))


def choose_head(model, head: str, head_index: int) -> str:
    """Validate the head options; "auto" -> "score" for classifiers, "logprob" for causal LMs.

    "score" on a causal LM is refused: it has no reward head, and the plain-HF path would read its
    LM logits at the final position, output ``head_index`` being the logit of that token id: a
    ranking by "how likely is token 0 next", silently. A classifier head, seeded at random, is what
    ``random_head_seed`` loads (``rmfast gcg --random-head-seed N``, a sweep's ``random_head_seed``).
    """
    if head == "auto":
        head = default_head(model)
    if head not in ("score", "logprob"):
        raise UserError(f"unknown head {head!r}; use score or logprob")
    if head == "logprob" and not hasattr(model, "lm_head"):
        raise UserError("--head logprob needs a causal language model; this model has no LM head (use --head score)")
    if head == "score" and lm_only(model):
        raise UserError(f"--head score needs a reward model or classifier, and "
                        f"{getattr(model.config, 'name_or_path', None) or type(model).__name__} is a causal LM (no "
                        "score head: its next-token logits would be read as rewards); use --head logprob (or auto), "
                        "or load it with a seeded random score head (rmfast gcg --random-head-seed N; random_head_seed: "
                        "N in a sweep; rmfast.load(..., random_head_seed=N))")
    if head == "score" and head_index < 0:
        raise UserError("--head-index must be >= 0")
    return head


def engine_name(engine: str) -> str:
    """The engine option's canonical value ("reference" -> "hf"); unknown values are a UserError."""
    engine = ENGINE_ALIASES.get(engine, engine)
    if engine not in ("auto",) + ENGINES:
        raise UserError(f"unknown engine {engine!r}; use auto, fast or hf")
    return engine


def choose_engine(model, head: str, head_index: int, engine: str, stacklevel: int = 3) -> str:
    """"auto" -> "fast" where the architecture is on the fast path, else "hf" with a warning."""
    spec = arch_spec(model)
    engine = engine_name(engine)
    on_fast_path = spec is not None and (head != "score" or spec.score_outputs is not None)
    kind = getattr(model.config, "model_type", "?")
    if engine == "auto":
        engine = "fast" if on_fast_path else "hf"
        if engine == "hf":
            warnings.warn(f"rmfast: architecture {kind!r} is not on the fast path; using the plain Hugging Face path "
                          "(correct, slower)", stacklevel=stacklevel)
    elif engine == "fast" and not on_fast_path:
        what = "is not on the fast path" if spec is None else "has no reward head the fast path reads"
        raise UserError(f"--engine fast: architecture {kind!r} {what}; use --engine auto or hf (the plain Hugging Face "
                        "path, correct and slower)")
    if head == "score" and spec is not None and spec.score_outputs is not None and head_index >= spec.score_outputs:
        raise UserError(f"--head-index {head_index} is out of range: the score head has {spec.score_outputs} outputs")
    return engine


#: CPU kinds where the compiled layer was measured clearly faster than the eager one (compile="auto"
#: compiles there): an AMX Xeon, ~2x in bf16 (earlier sessions). Measured not worth it: AMD Zen 4 with
#: AVX-512 BF16, 1.07x in bf16; the same CPU with AVX2 kernels, 1.00x in fp32 (benchmarks/results/cpu_kinds/).
COMPILE_CPU_KINDS = ("AMX",)


def compile_mode(compile) -> str:
    """``compile`` as one of :data:`COMPILE_MODES` (a bool is on/off); anything else is a UserError."""
    if isinstance(compile, bool):
        return "on" if compile else "off"
    if compile not in COMPILE_MODES:
        raise UserError(f"unknown --compile {compile!r}; use auto, on or off")
    return compile


def choose_compile(compile, device: torch.device, engine: str, eng: Engine | None = None,
                   stacklevel: int = 3) -> tuple[bool, str]:
    """Whether the fast engine runs the compiled CPU decoder layer, and why: (decision, reason).

    Never decided from the job's size (see the module docstring). ``auto`` compiles where it pays on
    this machine, for every job alike: a CPU of a kind in :data:`COMPILE_CPU_KINDS`, the fast
    engine, a prompt whose block-diagonal attention adds at most ``MAX_BLOCKDIAG_EXTRA`` of a layer's
    FLOPs (long prompts on many heads), and ``RMFAST_COMPILE`` not ``0`` (e.g. no C++ compiler).
    ``on`` compiles wherever it can; where it cannot (the plain-HF engine, a GPU) one line says so.
    """
    from .. import cpu as cpu_mod
    from ..fast.engine import MAX_BLOCKDIAG_EXTRA

    compile = compile_mode(compile)
    if compile == "off":
        return False, "off"
    why = ("the plain Hugging Face path runs the model's own forward" if engine != "fast" else
           None if device.type == "cpu" else f"on {device.type} the layer runs eagerly around the Triton kernels")
    if compile == "on":
        if why is not None:
            warnings.warn(f"rmfast: --compile on applies to the fast engine's CPU layer ({why}); running eagerly",
                          stacklevel=stacklevel)
            return False, f"on, but {why}"
        return True, "on"
    kind = cpu_mod.cpu_info().kind
    if why is not None:
        return False, f"auto: {why}"
    if os.environ.get("RMFAST_COMPILE", "1") == "0":
        return False, "auto: RMFAST_COMPILE=0"
    if kind not in COMPILE_CPU_KINDS:
        return False, f"auto: eager on this CPU kind ({kind}), where compiling was measured not to pay"
    if eng is not None and eng.blockdiag_overhead() > MAX_BLOCKDIAG_EXTRA:
        return False, "auto: the prompt's block-diagonal attention would add over half a layer's FLOPs"
    return True, f"auto: compiled on this CPU kind ({kind}), measured ~2x the eager layer"


#: rows of more tokens than this take the cascade form on CUDA; up to it, the Triton shared-prefix kernel
#: (a vocabulary scan's rows are 1-3 tokens). PREDICTED, not yet measured (no GPU lent to this change): the
#: shared-prefix kernel's own-key phase loads a K and a V row from L2 per (query, own key) on CUDA cores, the
#: cascade writes and reads back two fp32 part outputs per query; they cross at ~10.5 row tokens for head
#: dims 64-256 in bf16 on an H100 (:func:`rmfast.bench.cascade_cost.crossover_row_tokens`; a test ties the
#: two). ``make gpu-check`` times both forms; this constant is to follow what it measures.
CASCADE_MIN_ROW_TOKENS = 10


def choose_attention(attention, device: torch.device, engine: str, compiled: bool,
                     row_tokens: int | None) -> tuple[str, str]:
    """The rows' attention form (:data:`rmfast.fast.ops.ATTENTION_FORMS`) and why: (form, reason).

    ``row_tokens``: the most tokens a row of the job feeds the layers (a scan: 1 + the suffix), None where
    the job scores texts of any length. ``auto``: on CUDA (Triton present) the shared-prefix Triton kernel
    for rows of at most :data:`CASCADE_MIN_ROW_TOKENS` tokens, the cascade for longer or unknown rows (both
    support sliding windows and softcaps, so no model is routed away from either); ``RMFAST_KERNELS=torch``
    there: the ``bmm`` reference; on CPU the compiled layer's block-diagonal form, or the eager CPU rule
    (torch's flash kernel for long prompts, ``bmm`` below). ``RMFAST_KERNELS`` is read here, once per job.
    A named form runs as asked (the cascade on CPU: its torch twin, for tests), except where the compiled
    CPU layer cannot run it.
    """
    if engine != "fast":
        return "hf", "the plain Hugging Face path runs the model's own attention"
    base = ops.device_attention(device, compiled)
    triton = ops.uses_triton(device)
    if attention != "auto":
        if attention not in ops.ATTENTION_FORMS:
            raise UserError(f"unknown attention {attention!r}; use auto or one of {', '.join(ops.ATTENTION_FORMS)}")
        if compiled != (attention == "block-diagonal"):
            raise UserError(f"attention {attention}: " + ("the compiled CPU layer runs the block-diagonal form; use "
                            "compile off" if compiled else "the block-diagonal form is the compiled CPU layer's; use "
                            "compile on"))
        kernels = "Triton kernels" if triton else "torch twin"
        return attention, f"asked for ({kernels})" if attention in ("cascade", "triton") else "asked for"
    if base != "triton":
        why = {"block-diagonal": "the compiled CPU layer's form",
               "cpu-flash": f"the CPU's eager form (torch's flash kernel for prompts of {ops.FLASH_MIN_PROMPT}+ tokens, "
                            "bmm below)",
               "reference": f"no Triton kernels on {device.type} (RMFAST_KERNELS=torch or triton missing)"}[base]
        return base, why
    if row_tokens is not None and row_tokens <= CASCADE_MIN_ROW_TOKENS:
        return "triton", (f"rows of at most {row_tokens} tokens (<= {CASCADE_MIN_ROW_TOKENS}): the shared-prefix "
                          "Triton kernel")
    what = "rows of any length (texts)" if row_tokens is None else f"rows of up to {row_tokens} tokens"
    return "cascade", f"{what} (> {CASCADE_MIN_ROW_TOKENS} tokens): cascade, prompt and response parts on tensor cores"


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


def score_meaning(head: str, head_index: int = 0, random_head_seed: int | None = None) -> str:
    """What a job's ``score`` column is, in words: its head, units and direction (the manifest's
    ``score_meaning``, copied into the Parquet's schema metadata). A seeded random head says so first.

    >>> score_meaning("score", random_head_seed=0).split(":")[0]
    'RANDOM score head (seed 0)'
    """
    if head == "logprob":
        return ("log p(response | prompt) + log p(end of turn | prompt, response) under the language model, in "
                "nats (natural log); higher = more likely")
    if random_head_seed is not None:
        return (f"RANDOM score head (seed {random_head_seed}): a seeded random one-output head on the model's "
                "final hidden state, not a reward; no ranking to read (for hidden states only)")
    return f"the reward model's score head (output {head_index}), in its own units; higher = preferred"


def run_fields(manifest: dict) -> dict:
    """The :data:`RUN_FIELDS` of a job's manifest. ``model`` is the loader's provenance, which names the
    content (a GGUF's sha256, a hub revision, a folder's :func:`rmfast.loading.loader.content_sha256`): a model
    whose weights changed is another job, never a resume of the old one's scores."""
    return {k: manifest[k] for k in RUN_FIELDS if k in manifest}


def run_key(manifest: dict) -> str:
    """The key a job's checkpoint is saved under: a hash of its :func:`run_fields`."""
    return hashlib.sha256(json.dumps(run_fields(manifest), sort_keys=True, default=str).encode()).hexdigest()[:16]


def row_tokens(template: Template, head: str, n: int, on_engine: bool) -> int:
    """Tokens an n-token response's row feeds through the layers: on the fast engine only the row's own
    (the response and the suffix; for the logprob head the response less its first token, plus the
    end-of-turn continuation), on the plain-HF path the whole sequence."""
    if not on_engine:
        return len(template.prefix_ids) + n + len(template.suffix_ids)
    return n + len(template.suffix_ids) if head == "score" else n - 1 + len(template.continuation_ids)


def batch_rows(model, template: Template, head: str, n: int, on_engine: bool, batch_size) -> int:
    """Rows per batch for n-token responses: ``batch_size`` rows, or auto's, bounded by memory
    (:mod:`rmfast.scoring.memory`). Needs no prompt pass: a plan decides it this way, and so does a
    caller that has not built its plan yet (:class:`rmfast.scoring.scorer.RewardScorer`)."""
    device = next(model.parameters()).device
    tpr = max(1, row_tokens(template, head, n, on_engine))
    per_row = row_bytes(model, tpr, prefix_len=len(template.prefix_ids), head=head, full_sequence=not on_engine)
    bs = parse_batch_size(batch_size)
    return auto_batch_size(device, tpr, per_row) if bs == "auto" else cap_batch_size(bs, device, per_row)


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
    _rows: dict = field(default_factory=dict, repr=False)
    _pads: dict = field(default_factory=dict, repr=False)  # (n, rows) -> PadSizes

    @property
    def decisions(self) -> dict:
        """Each choice the plan made, its value and its reason in words (recorded in the manifest)."""
        return {"compile": {"value": bool(self.eng is not None and self.eng.compile), "reason": self.compile_reason},
                "attention": {"value": self.eng.attention if self.eng is not None else self.attention,
                              "reason": self.attention_reason},
                "padding": {"value": ("measured sizes" if self._pads else "full batch") if self.fixed_shapes else "none",
                            "reason": self.padding()}}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokens_per_row(self, n: int, template: Template | None = None) -> int:
        """Tokens an n-token response's row feeds through the layers (:func:`row_tokens`)."""
        return row_tokens(template or self.template, self.head, n, self.eng is not None and template is None)

    def rows_per_batch(self, n: int, template: Template | None = None) -> int:
        """Rows per batch for n-token responses (:func:`batch_rows`), decided once per shape (a memory
        warning is given once)."""
        key = (n, None if template is None else len(template.prefix_ids) + len(template.suffix_ids))
        if key not in self._rows:
            self._rows[key] = batch_rows(self.model, template or self.template, self.head, n,
                                         self.eng is not None and template is None, self.batch_size)
        return self._rows[key]

    @torch.no_grad()
    def score(self, cands, rows: int | None = None, template: Template | None = None, states=None,
              lens: bool = False):
        """Scores of ``cands`` ((B, n) token ids, or a list of B equal-length id lists): (B,) float32.

        ``rows``: the batch's row count (default :meth:`rows_per_batch`); with ``fixed_shapes`` a
        shorter batch is padded to it (copies of its first row, dropped after). ``template``: rows
        that merged with the shared template carry their own (plain-HF path).
        ``states`` (canonical names, :func:`rmfast.states.parse_layers`) and ``lens``: then a
        :class:`Scored`, taken from the same forward; the scores are the same bits either way.
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
        if on_engine:
            out = self.eng.score(cands, taps) if taps is not None else self.eng.score(cands)
        else:
            hf_taps = None if taps is None else taps | ({"normed"} if LAST_NORMED in idx or lens else set())
            out = hf_scores(self.model, template or self.template, cands.tolist(), head=self.head,
                            head_index=self.head_index, batch_size=max(rows, cands.shape[0]), taps=hf_taps)
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
        give every row a full batch's bits (:mod:`rmfast.scoring.padding`), where that is measured (the
        eager fast engine on CPU, the plan's own template); else the full ``rows``."""
        if self.eng is None or template is not None or self.eng.compile or self.device.type != "cpu":
            return rows
        key = (int(n), int(rows))
        if key not in self._pads:
            from ..loading.files import cache_root

            try:
                cache = cache_root()
            except UserError:  # an unusable cache folder: verdicts for this job only
                cache = None
            self._pads[key] = PadSizes(self.eng, n, rows, cache)
        return self._pads[key].rows_for(B)

    def padding(self) -> str:
        """How short batches were padded, for the manifest (the measured verdicts, or why the full row count)."""
        if not self.fixed_shapes:
            return "none: every batch holds just its rows (a row's last bits may depend on its batch)"
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
            raise UserError("--lens reads a score head through the final norm; this scan's head is "
                            f"{self.head} (a logprob lens would read the LM head: not built)")
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
        m, p = self.model, next(self.model.parameters())
        return {
            "rmfast_version": __version__,
            "model": model_info or {"name": getattr(m.config, "name_or_path", None) or type(m).__name__},
            "architecture": (getattr(m.config, "architectures", None) or [type(m).__name__])[0],
            "prompt": prompt,
            "template": self.template.manifest(),
            "head": self.head,
            "head_index": self.head_index,
            "score_meaning": score_meaning(self.head, self.head_index, (model_info or {}).get("random_head_seed")),
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


def plan_scoring(model, template: Template, *, head: str = "auto", head_index: int = 0, engine: str = "auto",
                 compile="auto", batch_size="auto", fixed_shapes: bool = True, stacklevel: int = 3,
                 share_with: ScoringPlan | None = None, attention: str = "auto",
                 response_tokens: int | None = None) -> ScoringPlan:
    """Decide how a job scores (see the module docstring for every option and its default).

    The fast engine is built here, its prompt encoded once. Raises UserError on bad options.
    ``share_with``: a fast-engine plan of the same model (another prompt) whose layers (the fused
    weight copies) this plan's engine uses too; their rows can then share batches (:func:`score_together`).
    ``attention``, and ``response_tokens`` (the longest response the job scores, in tokens: 1 for a vocabulary
    scan; None: texts of any length): :func:`choose_attention`.

    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> tmpl = rmfast.template.build_template(lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
    >>> plan = plan_scoring(lm.model, tmpl)  # doctest: +SKIP
    >>> plan.score([[1234], [5678]])  # (2,) float32 log-probabilities  # doctest: +SKIP
    """
    head = choose_head(model, head, head_index)
    engine = choose_engine(model, head, head_index, engine, stacklevel + 1)
    device = next(model.parameters()).device
    compile_mode(compile)  # checked before the prompt pass
    layers = share_with.eng.layers if share_with is not None and share_with.eng is not None else None
    shape = None
    if engine == "fast":  # what choose_compile reads of the engine, known before its prompt pass
        P = len(template.prefix_ids)
        shape = _PromptShape(lambda: blockdiag_overhead(arch_spec(model), P))
    compiled, why = choose_compile(compile, device, engine, shape, stacklevel + 1)
    most = None if response_tokens is None else row_tokens(template, head, int(response_tokens), True)
    form, form_why = choose_attention(attention, device, engine, compiled, most)
    eng = None
    if engine == "fast":
        eng = Engine(model, template, head=head, head_index=head_index, layers=layers, compile=compiled, attention=form)
    return ScoringPlan(model, template, head, head_index, engine, compiled, parse_batch_size(batch_size),
                       fixed_shapes, eng, compile_reason=why, attention=form, attention_reason=form_why)


class _PromptShape(NamedTuple):
    """The engine's prompt shape as :func:`choose_compile` reads it (``blockdiag_overhead()``)."""

    blockdiag_overhead: object


def score_together(plans: list[ScoringPlan], ids: list[list], batch_rows_: int, states=None):
    """Rows of one or several prompts' plans in one batch: ``ids[i]`` lists the token-id lists of plan i's
    rows (any lengths). Returns (sum of rows,) float32 in that order (plan 0's rows first); with
    ``states`` (canonical names) a :class:`Scored` (no lens), states taken at each row's final position.

    One plan, one length: :meth:`ScoringPlan.score`. Otherwise the fast engine's ragged rows
    (:func:`rmfast.fast.engine.score_prompts`; the plans share layers, ``share_with``): each row read at
    its own final position, attention per prompt, everything else over all rows at once.
    """
    if len(plans) == 1 and len({len(r) for r in ids[0]}) == 1:
        return plans[0].score(ids[0], batch_rows_, states=states)
    if any(p.eng is None or not p.eng.can_score_ragged() for p in plans):
        raise ValueError("rows of several lengths or prompts in one batch need the fast engine's score head (not gated)")
    resp, lens = [], []
    for rows in ids:
        n = max(len(r) for r in rows)
        x = torch.zeros(len(rows), n, dtype=torch.long)  # (B_i, n), right-padded
        for k, r in enumerate(rows):
            x[k, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        resp.append(x)
        lens.append(torch.tensor([len(r) for r in rows]))
    L = plans[0].n_layers
    idx, taps = _taps(states, False, L)
    out = score_prompts([p.eng for p in plans], resp, lens, taps)
    if taps is None:
        return out.float().cpu().numpy()
    scores, got = out
    return Scored(scores.float().cpu().numpy(), _named_states(plans[0].eng, idx, got, scores.shape[0], L), None)
