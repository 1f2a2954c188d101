"""Every decision of a scoring job, made once from its :class:`rmfast.scoring.options.ScoringOptions`, each
with its reason in words: :func:`decide` (no prompt pass needed) and the ``choose_*`` rules it applies.

=============  ==============================================================================================
decision       rule (one site each: ``tests/test_options.py::test_one_site_per_decision``)
=============  ==============================================================================================
device         where the model's weights are; chosen at load by :func:`rmfast.loading.loader.resolve_device`
               (``--device auto``: CUDA where available; torchrun: the rank's GPU), recorded here with why
dtype          the model's; chosen at load by :func:`rmfast.loading.loader.dtype_and_choice` (CPU ``auto``:
               measured bf16 vs fp32), recorded here with the measurement
head           :func:`choose_head`
engine         :func:`choose_engine` (also: ``--device-map`` and ``--compat authors`` take the plain-HF path)
compile        :func:`choose_compile` (per CPU kind; a job kind that never compiles says why: :data:`EAGER_JOBS`)
kernels        :func:`choose_kernels` (``RMFAST_KERNELS`` read here, once per job)
attention      :func:`choose_attention`
rows per batch :meth:`Decisions.rows_per_batch` (:func:`choose_rows_per_batch`: memory-bounded, per response length)
padding        :class:`rmfast.scoring.plan.ScoringPlan` (needs the engine: measured on CPU)
=============  ==============================================================================================
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..errors import UserError, UserNote
from ..fast import ops
from ..fast.arch import arch_spec, bidirectional
from ..fast.engine import MAX_BLOCKDIAG_EXTRA, blockdiag_overhead, fused_elementwise
from ..template import Template
from .batching import MEM_FRACTION, auto_batch_size, available_memory, cap_batch_size, row_bytes
from .options import CASCADE_MIN_ROW_TOKENS, COMPILE_MODES, ENGINE_ALIASES, ScoringOptions, parse_batch_size

#: the jobs a plan is made for (the manifest's ``decisions.job``)
JOBS = ("scan", "texts", "gcg", "random-search", "sweep", "bench", "scorer", "trl", "logprobs", "implicit", "audit",
        "serve")
#: jobs that run the eager layer whatever ``compile`` says, and why (never a job's size: its kind)
EAGER_JOBS = {
    "scorer": "RewardScorer: every conversation's prompt is another shape, and each shape would be a compile",
    "audit": "the bf16 audit rescores its rows once, in one batch, on an fp32 copy: a compile would not be repaid",
    "logprobs": "next-token log-probs run the model's own forward",
    "serve": "the reward server: every prompt and batch width is another shape, and its GEMMs keep fixed rows "
             "(rmfast.serve.core), which a compiled graph would not",
}
#: jobs where ``compile=auto`` means eager (``on`` still compiles), and why
AUTO_EAGER_JOBS = {
    "trl": "an x-ray during training scans a few prompts per checkpoint: a one-off compile of seconds each run is "
           "not repaid",
}


def engine_name(engine: str) -> str:
    """The engine option's canonical value ("reference" -> "hf"); unknown values are a UserError."""
    return ScoringOptions(engine=ENGINE_ALIASES.get(engine, engine)).engine


def compile_mode(compile) -> str:
    """``compile`` as one of :data:`COMPILE_MODES` (a bool is on/off); anything else is a UserError."""
    return ScoringOptions(compile=compile).compile


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
    ``random_head_seed`` loads (``--random-head-seed N`` of scan, score, gcg; a sweep's ``random_head_seed``).
    """
    if head == "auto":
        head = default_head(model)
    if head not in ("score", "logprob"):
        raise UserError(f"unknown head {head!r}; use score or logprob")
    if head == "logprob" and not hasattr(model, "lm_head"):
        raise UserError("--head logprob needs a causal language model; this model has no LM head (use --head score)")
    if head == "score" and lm_only(model):
        from ..loading.loader import recorded_source

        name = ((recorded_source(model) or {}).get("name") or getattr(model.config, "name_or_path", None)
                or type(model).__name__)  # the model's name, not a converted copy's folder in the cache
        raise UserError(score_on_lm(name))
    if head == "score" and head_index < 0:
        raise UserError("--head-index must be >= 0")
    return head


def head_output_read(model, head_index: int, stacklevel: int = 3, say: bool = True) -> str:
    """Which output of a multi-output score head is the reward, for the head's reason; said in one note too: a
    2- or 3-label classifier was read at output 0 without a word (a sentiment model's "negative" logit ranks its
    best responses last). "" for a one-output head (every reward model, the gated heads' one score included)."""
    if getattr(model, "rmfast_head", None) is not None:
        return ""
    n = getattr(getattr(model, "score", None), "out_features", None) or int(getattr(model.config, "num_labels", 1) or 1)
    if n <= 1:
        return ""
    labels = getattr(model.config, "id2label", None) or {}
    label = labels.get(head_index, labels.get(str(head_index)))
    named = f" ({label!r})" if label is not None and str(label) != f"LABEL_{head_index}" else ""
    if say:  # (a scan's bf16 audit rescoring its rows had said it a second time)
        warnings.warn(UserNote(f"rmfast: the score head has {n} outputs; output {head_index}{named} is read as the "
                               "reward (--head-index picks another)"), stacklevel=stacklevel)
    return f"; output {head_index}{named} of the head's {n}"


def choose_lm_head_dtype(model) -> tuple[str | None, str]:
    """(the dtype an LM head multiplies in for next-token log-probs, why): float32 for a plain, non-float32 ``Linear`` of
    real weights whose forward is its class's (:func:`rmfast.logprobs.fp32_lm_head`: a bf16 head's logits kept 8 bits,
    SmolLM2's 49,152 log-probs 298 values), else the head's own (a hooked or offloaded head, accelerate's device_map,
    keeps its forward: a meta weight cannot be cast, and a replaced forward would drop the hook)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    w = getattr(head, "weight", None)
    own = None if w is None else str(w.dtype).replace("torch.", "")
    if w is None or w.dtype == torch.float32:
        return own, "the head's own (float32)" if w is not None else "no LM head weight to read"
    if not isinstance(head, torch.nn.Linear) or w.device.type == "meta" or "forward" in vars(head) \
            or hasattr(head, "_hf_hook"):
        return own, "the head's own: hooked, offloaded or not a plain Linear (its forward is kept)"
    return "float32", f"float32 on the model's {own} last state: {own} logits would keep its few bits (ties in rank)"


def choose_engine(model, head: str, head_index: int, engine: str, stacklevel: int = 3) -> str:
    """"auto" -> "fast" where the architecture is on the fast path, else "hf" with a warning."""
    spec = arch_spec(model)
    engine = engine_name(engine)
    on_fast_path = spec is not None and (head != "score" or spec.score_outputs is not None)
    kind = repr(getattr(model.config, "model_type", "?"))
    if bidirectional(model.config):  # the engine is causal by construction
        kind += " with bidirectional attention (use_bidirectional_attention)"
    if engine == "auto":
        engine = "fast" if on_fast_path else "hf"
        if engine == "hf":
            warnings.warn(f"rmfast: architecture {kind} is not on the fast path; using the plain Hugging Face path "
                          "(correct, slower)", stacklevel=stacklevel)
    elif engine == "fast" and not on_fast_path:
        what = "is not on the fast path" if spec is None else "has no reward head the fast path reads"
        raise UserError(f"--engine fast: architecture {kind} {what}; use --engine auto or hf (the plain Hugging Face "
                        "path, correct and slower)")
    if head == "score" and spec is not None and spec.score_outputs is not None and head_index >= spec.score_outputs:
        raise UserError(f"--head-index {head_index} is out of range: the score head has {spec.score_outputs} outputs")
    return engine


#: CPU kinds where the compiled layer was measured clearly faster than the eager one (compile="auto"
#: compiles there): an AMX Xeon, ~2x in bf16 (earlier sessions). Measured not worth it: AMD Zen 4 with
#: AVX-512 BF16, 1.07x in bf16; the same CPU with AVX2 kernels, 1.00x in fp32 (benchmarks/results/cpu_kinds/).
COMPILE_CPU_KINDS = ("AMX",)


def choose_compile(compile, device: torch.device, engine: str, eng: Engine | None = None,
                   stacklevel: int = 3) -> tuple[bool, str]:
    """Whether the fast engine runs its compiled decoder layer, and why: (decision, reason).

    On a GPU only ``on`` compiles (the layer around the Triton shared-prefix kernel, issue 33 item 3: inductor
    fuses the norms, RoPE, activation and residuals between the GEMMs). Measured on an H100 (2026-11-26,
    ``benchmarks/results/gpu_h100_2026-11-26_b``): the compiled layer scans 1.26x (Llama-3.1-8B), 1.21x
    (Gemma-2-27B), 1.36x (Gemma-2-9B) as fast as the eager one, after a one-off compile of 9-16 s (2-3 s with
    inductor's disk cache warm) per engine, i.e. per prompt. It pays for a job of more than ~45 s of eager
    scanning (a cold compile) and costs time below that: the 8B's whole vocabulary (7.7 s eager) came out
    slower compiled (6.2 s + the compile). Since the eager layer runs its norms, RoPE and SiLU·up as Triton kernels
    (the "elementwise" decision), the compiled one is only 1.05x as fast (8B: 20,926 vs 19,973 cand/s,
    ``benchmarks/results/gpu_h100_2026-11-26_d``). A decision never taken from the job's size (see the module
    docstring), so ``auto`` stays eager on a GPU and says when ``on`` pays. The rest is the CPU's rule.

    Never decided from the job's size (see the module docstring). ``auto`` compiles where it pays on
    this machine, for every job alike: a CPU of a kind in :data:`COMPILE_CPU_KINDS`, the fast
    engine, a prompt whose block-diagonal attention adds at most ``MAX_BLOCKDIAG_EXTRA`` of a layer's
    FLOPs (long prompts on many heads), and ``RMFAST_COMPILE`` not ``0`` (e.g. no C++ compiler).
    ``on`` compiles wherever it can; where it cannot (the plain-HF engine) one line says so.
    """
    from .. import cpu as cpu_mod

    compile = compile_mode(compile)
    if compile == "off":
        return False, "off"
    if engine == "fast" and device.type != "cpu":  # a GPU: the layer around the Triton shared-prefix kernel
        if compile == "on":
            return True, (f"on: the {device.type} layer compiled around the Triton shared-prefix kernel (token scans; "
                          "the cascade form runs eagerly)")
        return False, (f"auto: eager on {device.type}, with the Triton elementwise kernels; the compiled layer "
                       "(--compile on) scans 1.05x as fast (measured on an H100) after a one-off compile of 9-16 s per "
                       "prompt: it pays only for scans of several minutes")
    why = "the plain Hugging Face path runs the model's own forward" if engine != "fast" else None
    if compile == "on":
        if why is not None:
            warnings.warn(UserNote(f"rmfast: --compile on applies to the fast engine's layer ({why}); running eagerly"),
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


def score_on_lm(name: str) -> str:
    """The line refusing ``--head score`` on a causal LM (said before the load where the files tell: cli.common)."""
    return (f"--head score needs a reward model or classifier, and {name} is a causal LM (no score head: its "
            "next-token logits would be read as rewards); use --head logprob (or auto), or load it with a seeded "
            "random score head (--random-head-seed N; random_head_seed: N in a sweep; rmfast.load(..., "
            "random_head_seed=N))")


#: the line refusing ``--lens`` where the head is not a score head (said before the load where the files tell)
LENS_NEEDS_SCORE = ("--lens reads a score head through the final norm; this scan's head is {head} (a logprob lens "
                    "would read the LM head: not built): scan a reward model, or give this LM a seeded score head "
                    "with --random-head-seed N")


def choose_attention(attention, device: torch.device, engine: str, compiled: bool,
                     row_tokens: int | None, triton: bool | None = None) -> tuple[str, str]:
    """The rows' attention form (:data:`rmfast.fast.ops.ATTENTION_FORMS`) and why: (form, reason).

    ``row_tokens``: the most tokens a row of the job feeds the layers (a scan: 1 + the suffix), None where
    the job scores texts of any length. ``auto``: on CUDA (Triton present) the shared-prefix Triton kernel
    for rows of at most :data:`CASCADE_MIN_ROW_TOKENS` tokens, the cascade for longer or unknown rows (both
    support sliding windows and softcaps, so no model is routed away from either); ``RMFAST_KERNELS=torch``
    there: the ``bmm`` reference; on CPU the compiled layer's block-diagonal form, or the eager CPU rule
    (torch's flash kernel for long prompts, ``bmm`` below). ``triton``: the kernels decision
    (:func:`choose_kernels`; None: made here). A named form runs as asked (the cascade on CPU: its torch twin;
    the block-diagonal form eagerly on CPU: both for tests), except where the compiled CPU layer cannot run it.
    """
    if engine != "fast":
        return "hf", "the plain Hugging Face path runs the model's own attention"
    if triton is None:
        triton = choose_kernels("auto", device)[0]
    base = "triton" if triton else ("block-diagonal" if compiled else "cpu-flash") if device.type == "cpu" else "reference"
    if attention != "auto":
        if attention not in ops.ATTENTION_FORMS:
            raise UserError(f"unknown attention {attention!r}; use auto or one of {', '.join(ops.ATTENTION_FORMS)}")
        if compiled and device.type == "cpu" and attention != "block-diagonal":
            raise UserError(f"attention {attention}: the compiled CPU layer runs the block-diagonal form; use compile off")
        if attention == "block-diagonal" and device.type != "cpu":
            raise UserError("attention block-diagonal is a CPU form; use auto on " + device.type)
        if attention == "triton" and not ops.triton_runs_on(device):
            raise UserError(f"--attention triton runs a Triton kernel, which needs CUDA (on {device.type}: "
                            "TRITON_INTERPRET=1, for tests); use --attention auto or cascade (its torch twin)")
        kernels = "Triton kernels" if triton else "torch twin"
        return attention, f"asked for ({kernels})" if attention in ("cascade", "triton") else "asked for"
    if base != "triton":
        why = {"block-diagonal": "the compiled CPU layer's form",
               "cpu-flash": f"the CPU's eager form ({ops.cpu_flash_rule()})",
               "reference": f"no Triton kernels on {device.type} (RMFAST_KERNELS=torch or triton missing)"}[base]
        return base, why
    if row_tokens is not None and row_tokens <= CASCADE_MIN_ROW_TOKENS:
        return "triton", (f"rows of at most {row_tokens} tokens (<= {CASCADE_MIN_ROW_TOKENS}): the shared-prefix "
                          "Triton kernel")
    what = "rows of any length (texts)" if row_tokens is None else f"rows of up to {row_tokens} tokens"
    return "cascade", (f"{what} (> {CASCADE_MIN_ROW_TOKENS} tokens): cascade, prompt and response parts on tensor "
                       "cores; rows of several lengths packed back to back, no padding (a sliding window by each "
                       "token's own position)")


class _PromptShape(NamedTuple):
    """The engine's prompt shape as :func:`choose_compile` reads it (``blockdiag_overhead()``)."""

    blockdiag_overhead: object


def elementwise_reason(device: torch.device, triton: bool, compiled: bool) -> str:
    """Why the layer's elementwise work runs as it does (:func:`rmfast.fast.engine.fused_elementwise` decides)."""
    if fused_elementwise(device, triton, compiled):
        return ("the eager layer on CUDA: RMSNorm, RoPE and SiLU·up as one Triton kernel each (torch's chains of "
                "small ops were a third of the H100's device time and most of its launches), the same roundings")
    if compiled:
        return "the compiled layer: inductor fuses the elementwise work itself"
    return "torch's ops: " + ("no CUDA device" if device.type != "cuda" else "the kernels decision is torch")


# make gpu-check's profile, H200 2026-11-29 (benchmarks/results/gpu_h200_2026-11-29/profile.txt)
_FUSED_ON_GPU = ("the fused form measured within noise of separate on a GPU: separate / fused 0.98-1.05 on an H200 "
                 "(8B shapes), 1.036 on an H100's scan")


def choose_projections(model, device: torch.device, projections: str = "auto") -> tuple[bool, str]:
    """Whether the fast engine's layers run q|k|v and gate|up as one GEMM weight each (fused) or as the model stores
    them (separate), and why (:func:`rmfast.fast.layer.build_layers`' ``fuse``; the Triton elementwise kernels read
    either layout). ``auto``: fused on CPU, where one GEMM call instead of three saves measurable overhead on the
    small models a CPU runs (unless the copy would take more than half the available memory); separate elsewhere:
    the copy costs device memory and bought little where measured (``make gpu-check``'s profile times both in one
    process; Llama-3.1-8B shapes: on an H200, 2026-11-29, separate / fused 0.98-1.05 over four shapes, 1.00 on the
    scan; an H100 run measured 3.6% on the scan; neither a gain on best-of-N). ``fused`` on a device without room for
    the copy is refused (UserError), before any work."""
    spec = arch_spec(model)
    stored = spec is not None and len(spec.layers[0].qkv) == 1 and len(spec.layers[0].gate_up) == 1
    copy = 0 if spec is None or stored else sum(m.weight.numel() * m.weight.element_size()
                                                for L in spec.layers for m in (*L.qkv, *L.gate_up))
    gib = copy / 2**30
    # the fused copy's room: None where it fits (or costs nothing), else the bytes free that it would overfill
    free = available_memory(device) if copy and (projections == "fused" or device.type == "cpu") else None
    crowded = free is not None and copy > MEM_FRACTION * free
    if projections != "auto":
        if projections == "fused" and crowded:
            raise UserError(f"--projections fused copies {gib:.1f} GiB of weights, more than half the "
                            f"{free / 2**30:.1f} GiB free on {device}; use --projections auto")
        fuse = projections == "fused"
        return fuse, "asked for" + (f" (a copy of {gib:.1f} GiB)" if fuse and copy else "")
    if device.type == "cpu":
        if crowded:  # a big model: the copy would not fit beside it
            return False, (f"CPU, but fusing would copy {gib:.1f} GiB of weights, more than half the "
                           f"{free / 2**30:.1f} GiB available: the model's own q, k, v, gate, up weights")
        return True, "CPU: q|k|v and gate|up as one GEMM each (fewer, bigger GEMM calls on the small models a CPU runs)"
    if stored:
        return False, ("separate GEMMs on row slices of the model's own fused q|k|v and gate|up (no copy either way); "
                       f"{_FUSED_ON_GPU}")
    return False, (f"the model's own q, k, v, gate, up weights (fusing them would copy {gib:.1f} GiB onto the device; "
                   f"{_FUSED_ON_GPU})")


def choose_kernels(kernels: str, device: torch.device) -> tuple[bool, str]:
    """Whether the fused kernels run as Triton, and why: (triton, reason). ``auto``: Triton on CUDA where it is
    installed; the ``RMFAST_KERNELS`` variable (torch|triton), read here once per job, overrides auto
    (``triton`` on CPU needs ``TRITON_INTERPRET=1``: tests only)."""
    env = os.environ.get("RMFAST_KERNELS", "auto")
    asked = kernels if kernels != "auto" else env if env in ("torch", "triton") else "auto"
    if asked == "triton" and not ops.triton_runs_on(device):
        what = "--kernels triton" if kernels == "triton" else "RMFAST_KERNELS=triton"
        raise UserError(f"{what}: Triton kernels need CUDA (on {device.type}: TRITON_INTERPRET=1, for tests, or Triton "
                        "is not installed); use --kernels auto or torch")
    if asked != "auto":
        return asked == "triton", f"RMFAST_KERNELS={env}" if kernels == "auto" else "asked for"
    on = ops.uses_triton(device)
    return on, (f"auto: Triton on {device.type}" if on else
                "auto: torch kernels (no CUDA)" if device.type != "cuda" else "auto: torch kernels (Triton not installed)")


def device_reason(options: ScoringOptions, device: torch.device) -> str:
    """Why the job runs on ``device`` (chosen at load from ``options.device``)."""
    if options.device_map not in (None, "", "none"):
        return f"--device-map {options.device_map}: the model spread by accelerate (first weights on {device})"
    asked = str(options.device or "auto")
    if asked == "auto":
        return "auto: " + ("CUDA is available" if device.type == "cuda" else "no CUDA device here")
    return "asked for" if asked == str(device) or asked == device.type else f"asked for {asked}"


#: where a job that chose the dtype a model was loaded in for ``auto`` says why (a sweep store's pin: one dtype per
#: model in a store), for :func:`dtype_reason`
DTYPE_WHY_ATTR = "_rmfast_dtype_why"


def dtype_reason(model, options: ScoringOptions) -> str:
    """Why the weights are in their dtype: the measured CPU choice, CUDA's config rule, a job's own choice for
    ``auto`` (:data:`DTYPE_WHY_ATTR`), or asked for."""
    from .. import cpu

    if getattr(model, DTYPE_WHY_ATTR, None):
        return f"auto: {getattr(model, DTYPE_WHY_ATTR)}"
    c = cpu.recorded(model)
    if c:
        return f"auto on CPU [{c.get('cpu_kind')}]: {c.get('reason')}"
    if str(options.dtype) != "auto":
        return "asked for"
    dev = next(model.parameters()).device
    return ("auto on CUDA: the config's dtype where bf16/fp16, else bf16" if dev.type == "cuda" else
            "as the caller loaded the model")


@dataclass
class Decisions:
    """What :func:`decide` chose for a job: every value and its reason (:meth:`record`)."""

    options: ScoringOptions
    job: str
    device: torch.device
    head: str
    engine: str
    compile: bool
    triton: bool
    attention: str
    fixed_shapes: bool
    share_batches: bool = False
    ragged: bool = False  # a scorer's rows of several lengths and conversations may share a batch (its head allows)
    elementwise: bool = False  # the layer's norms, RoPE and SiLU·up as Triton kernels (fused_elementwise)
    packed_rows: bool = False  # ragged rows run packed back to back, no pad token (the cascade form)
    rows_cap: bool = False  # a packed batch holds at most batch_size rows too (a batch size asked for), else tokens only
    host_overlap: bool = False  # a token scan's vocabulary hash and decoding on a host thread while the device scores
    fuse: bool = False  # q|k|v and gate|up as one GEMM weight each (the "projections" decision, choose_projections)
    reasons: dict = field(default_factory=dict)

    @property
    def head_index(self) -> int:
        return self.options.head_index

    def record(self, name: str, value, reason: str) -> None:
        self.reasons[name] = {"value": value, "reason": reason}

    def record_rows_rule(self, rule, why: str) -> None:
        """``rmfast serve``'s rows rule (:func:`rmfast.fast.ops.gemm_rows`: ``(how, rows)``, or None for torch's own
        GEMMs) with its reason, and what it changes of the attention (under it the CPU's eager form runs no prompt
        through torch's flash kernel: :func:`rmfast.fast.ops.cpu_flash_rule`) and of the elementwise work
        (:func:`rmfast.fast.ops.alike_rule`)."""
        alike = ops.alike_rule(self.device.type) if rule is not None else None
        self.record("gemm_rows", f"{rule[0]} {rule[1]}" if rule else "torch", why + (f"; elementwise: {alike}" if alike else ""))
        if rule is not None and self.attention == "cpu-flash":
            self.record("attention", "cpu-flash", f"the CPU's eager form under the rows rule ({ops.cpu_flash_rule(rule)})")

    def rows_per_batch(self, model, template: Template, n: int, own_template: bool = False) -> int:
        """Rows per batch for n-token responses on ``template`` (``own_template``: a row that carries its
        own, plain-HF path): :func:`choose_rows_per_batch`, before any prompt pass."""
        return choose_rows_per_batch(model, template, self.head, n, self.engine == "fast" and not own_template,
                          self.options.batch_size)


def decide(model, options: ScoringOptions | None = None, job: str = "scan", *, template: Template | None = None,
           response_tokens: int | None = None, stacklevel: int = 3) -> Decisions:
    """Every decision of a job from its options, each recorded with its reason; no prompt pass.

    ``template``: the job's prompt (the compile rule reads its length; None: a caller that has many,
    :class:`rmfast.scoring.scorer.RewardScorer`). ``response_tokens``: the longest response in tokens (1 for
    a vocabulary scan; None: texts of any length), for the attention form.
    """
    o = options if options is not None else ScoringOptions()
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; one of {JOBS}")
    device = next(model.parameters()).device
    if device.type == "cpu":
        from ..cpu import mkl_mode_noted

        mkl_mode_noted(stacklevel + 1)  # one note a process where MKL started first (a library caller's torch math)
    head = choose_head(model, o.head, o.head_index)
    engine, engine_why = _engine_rule(model, head, o, job, stacklevel + 1)
    shape = None
    if engine == "fast" and template is not None:  # what choose_compile reads of the engine, before its prompt pass
        P = len(template.prefix_ids)
        shape = _PromptShape(lambda: blockdiag_overhead(arch_spec(model), P))
    if job in EAGER_JOBS and o.compile != "off":
        compiled, compile_why = False, f"{o.compile}, but eager: {EAGER_JOBS[job]}"
    elif job in AUTO_EAGER_JOBS and o.compile == "auto":
        compiled, compile_why = False, f"auto: eager: {AUTO_EAGER_JOBS[job]}"
    elif job == "bench" and o.compile == "auto" and engine == "fast" and device.type == "cpu":
        compiled, compile_why = choose_compile("on", device, engine, shape, stacklevel + 1)
        compile_why = "auto in the bench: the compiled layer is timed beside the eager one on every CPU"
    else:
        compiled, compile_why = choose_compile(o.compile, device, engine, shape, stacklevel + 1)
    triton, kernels_why = choose_kernels(o.kernels, device)
    most = None if response_tokens is None or template is None else row_tokens(template, head, int(response_tokens), True)
    form, form_why = choose_attention(o.attention, device, engine, compiled, most, triton)
    if form == "cpu-flash" and template is not None:  # the form's kernel follows the prompt's length: say which
        P, F = len(template.prefix_ids), ops.cpu_flash_from("prompt")
        long_rows = "" if most is not None and most < F else f" (rows of {F}+ tokens: torch's flash kernel)"
        form_why += (f"; this {P}-token prompt: torch's flash kernel (bmm on layers with a softcap or a window "
                     "shorter than the row)" if P >= F else f"; this {P}-token prompt: bmm{long_rows}")
    # rows of one known length (token scans, GCG) pad a short batch to a full one (or a measured smaller size), so a
    # row's bits do not depend on the job's size; texts of many lengths are not padded (each length would pay a batch)
    fixed = response_tokens is not None
    if compiled and device.type != "cpu" and form != "triton":
        compiled, compile_why = False, f"{o.compile}, but the {form} form runs eagerly (the compiled layer is the Triton form's)"
    d = Decisions(o, job, device, head, engine, compiled, triton, form, fixed)
    d.record("job", job, "the kind of work this plan scores for")
    d.record("device", str(device), device_reason(o, device))
    d.record("dtype", str(next(model.parameters()).dtype).replace("torch.", ""), dtype_reason(model, o))
    d.record("head", head, ("asked for" if o.head != "auto" else f"auto: {'a reward head' if head == 'score' else 'a causal LM'}")
             + (head_output_read(model, o.head_index, stacklevel + 1, say=job != "audit") if head == "score" else ""))
    d.record("engine", engine, engine_why)
    if job == "logprobs":  # the head of its one forward (the engine's logprob head reads in fp32 already)
        d.record("lm_head_dtype", *choose_lm_head_dtype(model))
    d.record("compile", compiled, compile_why)
    d.record("kernels", "triton" if triton else "torch", kernels_why)
    d.record("attention", form, form_why)
    d.elementwise = fused_elementwise(device, triton, compiled)
    d.record("elementwise", "triton" if d.elementwise else "torch", elementwise_reason(device, triton, compiled))
    if engine == "fast":
        d.fuse, why = choose_projections(model, device, o.projections)
        d.record("projections", "fused" if d.fuse else "separate", why)
    else:
        d.record("projections", "as stored", "the plain Hugging Face path runs the model's own modules")
    if job == "scorer":
        one_length = _one_length_why(engine, head, model)  # None: rows of several lengths may share a batch
        d.ragged = one_length is None
        d.share_batches, why = choose_share_batches(o.share_batches, device) if d.ragged else (False, one_length)
        if d.share_batches and form == "block-diagonal":  # asked for both: no form would run as recorded
            raise UserError("attention='block-diagonal' reads one prompt's packed keys per batch, so conversations "
                            "cannot share a batch: pass share_batches=False, or attention='auto'")
        d.record("share_batches", d.share_batches, why)
        _rows_rule(d, model, one_length)
    if job in ("scan", "sweep", "audit"):
        d.host_overlap = device.type != "cpu"
        d.record("host_overlap", d.host_overlap, HOST_OVERLAP_WHY[d.host_overlap])
    d.rows_cap = o.batch_size != "auto"
    d.record("batch_size", o.batch_size, ("asked for" + ("; a packed batch holds at most that many rows too (batch_size=1: "
                                                          "each row alone)" if d.packed_rows else "")) if d.rows_cap else
             "auto: ~4k tokens per batch on CPU, ~128k on CUDA, at most half the free memory, per response length; "
             "on CUDA one-token rows split the model's vocabulary into equal batches (multiples of 256 rows)"
             + ("; a packed batch holds the rows its longest rows' memory fits" if d.packed_rows else ""))
    return d


def _one_length_why(engine: str, head: str, model) -> str | None:
    """Why a scorer runs one conversation's rows of one length per batch, or None where rows of several lengths and
    conversations may share one (:func:`rmfast.fast.engine.ragged_ok`: the fast engine's score head, read at one
    position per row)."""
    from ..fast.engine import ragged_ok

    if engine != "fast":
        return "the plain Hugging Face path: one conversation's rows of one length per batch"
    if not ragged_ok(head, arch_spec(model).custom_head):
        what = (f"the {head} head reads every position of a row" if head != "score" else
                "a gated score head (ArmoRM, QRM) may re-gate inside a row")
        return f"{what}: one conversation's rows of one length per batch"
    return None


def _rows_rule(d: Decisions, model, one_length: str | None) -> None:
    """The "rows" decision of a scorer: rows of several lengths packed back to back (the cascade form: no pad
    token, :class:`rmfast.fast.layer.PackedRows`, sliding windows by each token's position), else right-padded in
    length buckets; one length per batch where the head or path takes no other."""
    if one_length is not None:
        d.record("rows", "one length per batch", one_length)
        return
    if d.attention != "cascade":
        d.record("rows", "padded", f"the {d.attention} form reads rows right-padded: length buckets")
        return
    d.packed_rows = True
    d.record("rows", "packed", "the cascade form: a wave's rows of every length back to back, no pad token "
                               "(sliding windows by each token's own position)")


def _engine_rule(model, head: str, o: ScoringOptions, job: str, stacklevel: int) -> tuple[str, str]:
    """(engine, reason): a spread model and the authors' loop take the plain-HF path; else :func:`choose_engine`."""
    if o.device_map not in (None, "", "none"):
        if o.engine == "fast":
            raise UserError("--engine fast needs the whole model on one device; drop --device-map or use --engine hf")
        if o.engine == "auto":
            warnings.warn(UserNote("rmfast: --device-map: scoring on the plain Hugging Face path (the fast engine needs "
                                   "one device)"), stacklevel=stacklevel)
        return "hf", "--device-map: the model spread over devices runs on the plain Hugging Face path"
    if job == "logprobs":
        return "hf", "next-token log-probs: one forward of the prompt through the model's own layers"
    if o.compat == "authors" and job == "texts":
        if o.engine == "fast":
            raise UserError("--compat authors runs the plain Hugging Face path (it reproduces the published loop, "
                            "padding included); drop --engine fast")
        return "hf", "--compat authors: the published loop (padded batches) on the plain Hugging Face path"
    engine = choose_engine(model, head, o.head_index, o.engine, stacklevel)
    if o.engine != "auto":
        return engine, "asked for"
    return engine, ("auto: the architecture is on the fast path" if engine == "fast" else
                    "auto: the architecture is not on the fast path (plain Hugging Face forward)")


def row_tokens(template: Template, head: str, n: int, on_engine: bool) -> int:
    """Tokens an n-token response's row feeds through the layers: on the fast engine only the row's own
    (the response and the suffix; for the logprob head the response less its first token, plus the
    end-of-turn continuation), on the plain-HF path the whole sequence."""
    if not on_engine:
        return len(template.prefix_ids) + n + len(template.suffix_ids)
    return n + len(template.suffix_ids) if head == "score" else n - 1 + len(template.continuation_ids)


#: the "host_overlap" decision's reasons (a token scan's host-only work: the vocabulary's hash, each id's piece and text)
HOST_OVERLAP_WHY = {
    True: "the vocabulary's hash and each id's piece and text on a host thread while the GPU scores, from the first "
          "batch on (~0.3 s and ~0.3-0.5 s of host work for 128k ids, hidden behind the scan; the hash is not in the run "
          "key, so nothing waits for it before the scan)",
    False: "on CPU in turn: the cores are the compute, a host thread would take them from the scan",
}


def choose_rows_per_batch(model, template: Template, head: str, n: int, on_engine: bool, batch_size) -> int:
    """Rows per batch for n-token responses: ``batch_size`` rows, or auto's, bounded by memory
    (:mod:`rmfast.scoring.batching`). Needs no prompt pass: a plan decides it this way, and so does a
    caller that has not built its plan yet (:meth:`Decisions.rows_per_batch`)."""
    device = next(model.parameters()).device
    tpr = max(1, row_tokens(template, head, n, on_engine))
    per_row = row_bytes(model, tpr, prefix_len=len(template.prefix_ids), head=head, full_sequence=not on_engine)
    bs = parse_batch_size(batch_size)
    if bs != "auto":
        return cap_batch_size(bs, device, per_row)
    vocab = model.get_input_embeddings().num_embeddings if n == 1 and on_engine else None  # a token scan's ids
    return auto_batch_size(device, tpr, per_row, vocab=vocab)


def choose_share_batches(share_batches, device: torch.device) -> tuple[bool, str]:
    """Whether a RewardScorer's conversations share batches (waves), and why: "auto" on CUDA, where a few
    conversations' rows leave the GEMMs narrow; off on CPU, where a batch of a few hundred tokens already runs
    near the GEMM peak and sharing measured 0.97-1.09x, within the noise of those runs (fp32, 16 prompts x 4
    responses: Zen 3 AVX2 0.97x / 1.01x, Zen 4 0.99x / 1.09x; more padding, a per-prompt attention call per
    layer; docs/backend.md)."""
    if share_batches != "auto":
        return bool(share_batches), "asked for"
    on = device.type == "cuda"
    return on, ("auto: on CUDA, where a few conversations' rows leave the GEMMs narrow" if on else
                "auto: off on CPU, where sharing measured 0.97-1.09x, no clear gain (docs/backend.md)")


#: the rows rule's two forms (:func:`rmfast.fast.ops.gemm_rows`): one GEMM of at least PAD_ROWS rows where the
#: probe found this machine's kernels row-invariant from there on, else chunks of CHUNK_ROWS rows
PAD_ROWS = 64
CHUNK_ROWS = 256
#: the probe's reference GEMM (rows) and the row counts it compares with it (odd and even, small and large)
PROBE_ROWS = ops.PAD_MAX_ROWS  # "pad" never runs a GEMM of more rows than the probe compared
PROBE_SIZES = (*range(PAD_ROWS, 513, 8), 65, 127, 333, 1000, 1500, 2048, 3000, 4000)


def choose_gemm_rows(layers, dtype, device) -> tuple:
    """The rows rule of ``rmfast serve`` for this machine and model (:func:`rmfast.fast.ops.gemm_rows`: a row's bits
    whatever else shares its GEMMs) and why, measured on the engine's ``layers``: ("pad", PAD_ROWS)
    where every linear of a layer (its weights' shapes) gives each row the same bits at every row count in
    :data:`PROBE_SIZES` as in one GEMM of :data:`PROBE_ROWS` rows, rows taken at an odd offset; else ("chunk",
    CHUNK_ROWS), which is invariant by construction. A second or so on a CPU."""
    w, _ = layers[0]
    weights = [*w.w_qkv, w.w_o, *w.w_gate_up, w.w_down]
    g = torch.Generator(device="cpu").manual_seed(0)
    seen = set()
    for W in weights:
        if tuple(W.shape) in seen:
            continue
        seen.add(tuple(W.shape))
        X = torch.randn(PROBE_ROWS + 3, W.shape[1], generator=g).to(device=device, dtype=dtype)  # (M, K)
        ref = torch.nn.functional.linear(X[3:], W)  # (PROBE_ROWS, N)
        for m in PROBE_SIZES:
            got = torch.nn.functional.linear(X[3:3 + m], W)
            if not torch.equal(got, ref[:m]):
                return ("chunk", CHUNK_ROWS), (f"measured at start: a {tuple(W.shape)} GEMM of {m} rows gives other bits "
                                               f"than one of {PROBE_ROWS}, so every linear runs in chunks of exactly "
                                               f"{CHUNK_ROWS} rows (invariant by construction)")
    return ("pad", PAD_ROWS), (f"measured at start: every linear of a layer gives a row the same bits at {min(PROBE_SIZES)} "
                               f"to {PROBE_ROWS} rows here ({len(PROBE_SIZES)} sizes, rows at an odd offset), so one "
                               f"GEMM per linear, padded to {PAD_ROWS} rows at least")
