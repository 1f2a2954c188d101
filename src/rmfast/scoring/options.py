"""One options value for every scoring job: :class:`ScoringOptions`, passed whole.

The CLI (:func:`add_arguments`, :meth:`ScoringOptions.from_args`), the Python API (``scan``, ``score_ids``,
``score_texts``, ``run_scan``), a sweep's model entry, the TRL callback, GCG's config and
:class:`rmfast.scoring.scorer.RewardScorer` all build ONE :class:`ScoringOptions` and hand it whole to
:func:`rmfast.scoring.plan.plan_scoring`, which decides everything from it once and records why. A field's
default and its one-line doc live here only: the CLI's help is generated from them and the README's options
table is tested against them (``tests/test_options.py``).

Importing this module is cheap (no torch): ``rmfast --help`` builds its parsers from it.

>>> o = ScoringOptions(engine="reference")
>>> o.engine, o.head, o.batch_size          # the old engine name is canonicalised; defaults are "auto"
('hf', 'auto', 'auto')
>>> o.replace(batch_size="64").batch_size   # validated like every field: a count is an int
64
>>> ScoringOptions(compile="sometimes")
Traceback (most recent call last):
rmfast.errors.UserError: unknown compile='sometimes'; use auto, on or off
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field, fields

from ..errors import UserError

HEADS = ("auto", "score", "logprob")
ENGINES = ("auto", "fast", "hf")
#: older names of option values, accepted and canonicalised
ENGINE_ALIASES = {"reference": "hf"}
COMPILE_MODES = ("auto", "on", "off")
#: the attention forms of the rows' pass (kept equal to :data:`rmfast.fast.ops.ATTENTION_FORMS` by a test;
#: repeated here so that building the CLI imports no torch)
ATTENTION_FORMS = ("triton", "cascade", "cpu-flash", "block-diagonal", "reference")
KERNELS = ("auto", "triton", "torch")
PROJECTIONS = ("auto", "fused", "separate")
COMPAT_MODES = ("decode-retokenize", "authors")


def _opt(default, doc: str, *, flag: bool = True, choices=None, metavar=None, api_only: bool = False):
    """A field with its one-line doc (the CLI help and the README table read it). ``flag``: added by
    :func:`add_arguments` (else a command's own flag); ``api_only``: no command line has it (Python callers)."""
    return field(default=default, metadata={"doc": doc, "flag": flag, "choices": choices, "metavar": metavar,
                                            "api_only": api_only})


#: rows of more tokens than this take the cascade form on CUDA; up to it, the Triton shared-prefix kernel
#: (a vocabulary scan's rows are 1-3 tokens). MEASURED on the H100 (gpu_h100_2026-11-27, 8B bf16, ~8,192 row
#: tokens a batch): the shared-prefix kernel faster through 16 row tokens (187 vs 195 ms at 12, 192 vs 195 at 16),
#: the cascade from 24 (189 vs 193 ms). The cost model predicted ~10.5
#: (:func:`rmfast.bench.cascade_cost.crossover_row_tokens`: the cascade's fp32 part outputs cost less than it
#: assumes); ``make gpu-check`` times both forms on every run.
CASCADE_MIN_ROW_TOKENS = 16


@dataclass(frozen=True)
class ScoringOptions:
    """Every option that decides how candidates are scored. Frozen: a job's options cannot change under it;
    :meth:`replace` gives a changed copy (validated again)."""

    head: str = _opt("auto", "auto: score for reward models/classifiers, logprob (log p of the response and the "
                             "end of turn) for causal LMs", choices=HEADS)
    head_index: int = _opt(0, "output of a multi-output score head")
    engine: str = _opt("auto", "auto: the shared-prompt engine (fast) where the architecture is on the fast path, "
                               "else the plain Hugging Face forward of each whole conversation (hf; 'reference' is "
                               "its old name)", choices=ENGINES + tuple(ENGINE_ALIASES))
    compile: str = _opt("auto", "torch.compile the fast engine's CPU decoder layer: auto compiles on the CPU kinds "
                                "where it was measured to pay (AMX Xeon), for every job alike (never decided from "
                                "the job's size), else eager (on a GPU too, until measured); on: a one-off compile of "
                                "seconds wherever it can (on a GPU: the token scan's layer around the Triton kernel); off",
                        choices=COMPILE_MODES)
    batch_size: int | str = _opt("auto", "rows per batch, or auto: ~4k tokens per batch on CPU, ~128k on CUDA, "
                                         "bounded by free memory")
    attention: str = _opt("auto", "the rows' attention form: auto (on CUDA the Triton shared-prefix kernel for rows "
                                  f"of up to {CASCADE_MIN_ROW_TOKENS} tokens, the cascade above; on CPU its own forms) "
                                  "or one of "
                                  + ", ".join(ATTENTION_FORMS), choices=("auto",) + ATTENTION_FORMS)
    kernels: str = _opt("auto", "the fused kernels: auto (Triton on CUDA where installed, else torch; the "
                                "RMFAST_KERNELS variable, read once per job, overrides auto), triton or torch",
                        choices=KERNELS)
    projections: str = _opt("auto", "the fast engine's q|k|v and gate|up weights: auto (one fused GEMM each on CPU; "
                                    "on a GPU the model's own, separate, until measured), fused (a copy of those "
                                    "weights, ~2/3 of each layer's) or separate", choices=PROJECTIONS)
    dtype: str = _opt("auto", "auto|bfloat16|float16|float32: on CPU bf16 only where this CPU multiplies it "
                              "clearly faster than fp32 (measured once, cached), else fp32; on CUDA the model's "
                              "dtype", flag=False)
    device: str = _opt("auto", "auto|cpu|cuda|cuda:N (auto: CUDA where available; under torchrun the rank's GPU)",
                       flag=False)
    device_map: str | None = _opt(None, "e.g. auto: spread a large model over the GPUs (accelerate; the plain-HF "
                                        "path)", flag=False)
    share_batches: str | bool = _opt("auto", "RewardScorer: rows of several conversations share a batch (waves): "
                                             "auto (on CUDA; off on CPU, where it measured no clear gain), True or False",
                                     flag=False, api_only=True)
    compat: str | None = _opt(None, "decode-retokenize: the papers' decode round trip; authors: their whole "
                                    "scoring loop (plain-HF path, padded batches)", flag=False)

    def __post_init__(self):
        engine = ENGINE_ALIASES.get(self.engine, self.engine)
        object.__setattr__(self, "engine", engine)
        if self.head not in HEADS:
            raise UserError(f"unknown head {self.head!r}; use auto, score or logprob")
        object.__setattr__(self, "head_index", whole_number(self.head_index, "--head-index", 0))
        if engine not in ENGINES:
            raise UserError(f"unknown engine {engine!r}; use auto, fast or hf")
        if isinstance(self.compile, bool):  # the API's True/False
            object.__setattr__(self, "compile", "on" if self.compile else "off")
        if self.compile not in COMPILE_MODES:
            raise UserError(f"unknown --compile {self.compile!r}; use auto, on or off")
        object.__setattr__(self, "batch_size", parse_batch_size(self.batch_size))
        if self.attention != "auto" and self.attention not in ATTENTION_FORMS:
            raise UserError(f"unknown attention {self.attention!r}; use auto or one of {', '.join(ATTENTION_FORMS)}")
        if self.kernels not in KERNELS:
            raise UserError(f"unknown kernels {self.kernels!r}; use auto, triton or torch")
        if self.projections not in PROJECTIONS:
            raise UserError(f"unknown projections {self.projections!r}; use auto, fused or separate")
        if self.share_batches not in ("auto", True, False):
            raise UserError(f"share_batches={self.share_batches!r}: give 'auto', True or False")
        if self.compat is not None and self.compat not in COMPAT_MODES:
            raise UserError(f"unknown --compat {self.compat!r}; use {', '.join(COMPAT_MODES)}")

    def replace(self, **changes) -> "ScoringOptions":
        """A copy with ``changes`` (option names only; validated)."""
        return dataclasses.replace(self, **_known(changes))

    @classmethod
    def of(cls, options: "ScoringOptions | None" = None, **changes) -> "ScoringOptions":
        """``options`` (default: the defaults) with keyword ``changes``, the API's older keyword form
        (``engine="hf"``); a name that is not an option is a TypeError, as any unknown keyword."""
        base = options if options is not None else cls()
        if not isinstance(base, ScoringOptions):
            raise TypeError(f"options must be a ScoringOptions, got {type(base).__name__}")
        return base.replace(**changes) if changes else base

    @classmethod
    def of_changed(cls, options: "ScoringOptions | None" = None, **kw) -> "ScoringOptions":
        """``options`` with those keyword options that differ from their defaults (a signature that lists the
        options with their defaults, beside ``options=``: ``scan``, ``RewardScorer``)."""
        defaults = cls()
        return cls.of(options, **{k: v for k, v in kw.items() if v != getattr(defaults, k)})

    @classmethod
    def from_args(cls, args) -> "ScoringOptions":
        """The options of a parsed command line (the options it does not have keep their defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _known(changes: dict) -> dict:
    names = {f.name for f in fields(ScoringOptions)}
    bad = sorted(set(changes) - names)
    if bad:
        raise TypeError(f"not a scoring option: {', '.join(bad)} (the options: {', '.join(sorted(names))})")
    return changes


def parse_batch_size(bs) -> int | str:
    """``"auto"`` or a positive integer (a string from the command line or a YAML file, or an int).

    >>> parse_batch_size("512"), parse_batch_size("auto")
    (512, 'auto')
    """
    if bs == "auto" or bs is None:
        return "auto"
    try:
        n = int(bs)
    except (TypeError, ValueError):
        raise UserError(f"--batch-size {bs!r} is not a positive integer or auto") from None
    if isinstance(bs, bool) or n < 1 or str(bs).strip() != str(n):
        raise UserError(f"--batch-size {bs!r} is not a positive integer or auto")
    return n


def whole_number(value, name: str, least: int) -> int:
    """``value`` as an int >= ``least`` (numpy's ints too); a bool, a float, a string or None is refused in one
    line naming ``name`` (written as the CLI's option where it is one: ``--head-index``).

    >>> whole_number(3, "k", 1)
    3
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise UserError(f"{name} must be an integer >= {least}, got {value!r}") from None
    if n < least:
        raise UserError(f"{name} must be an integer >= {least}, got {n}")
    return n


def nonneg_int(text) -> int:
    """An argparse ``type=``: an integer >= 0 (the CLI's own one-line message names the option)."""
    import argparse

    try:
        n = int(text)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (got {text!r})")
    return n


def flag(name: str) -> str:
    """The command-line flag of an option: ``head_index`` -> ``--head-index``."""
    return "--" + name.replace("_", "-")


def option_fields(cli_only: bool = True) -> list:
    """The option fields (with ``cli_only``: those :func:`add_arguments` adds; dtype, device, device_map and
    compat have their own commands' flags)."""
    return [f for f in fields(ScoringOptions) if f.metadata["flag"] or not cli_only]


def add_arguments(p, *, batch_what: str | None = None) -> None:
    """Add the scoring options to an argparse parser: one flag per field, its help the field's doc plus the
    default. ``batch_what``: what --batch-size counts on this command, where that is not rows per batch."""
    for f in option_fields():
        doc = f.metadata["doc"]
        if f.name == "batch_size" and batch_what:
            doc = f"{batch_what}, or auto (bounded by free memory)"
        kw = {"default": f.default, "help": f"{doc} (default {f.default})"}
        if f.metadata["choices"]:
            kw["choices"] = list(f.metadata["choices"])
        if f.name == "head_index":
            kw["type"] = nonneg_int
        p.add_argument(flag(f.name), **kw)
