"""The model configurations ``rmfast bench`` knows, and how ``--models`` names them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..loading import registry

#: where ``rmfast bench`` writes (a folder)
DEFAULT_OUT = os.path.join("benchmarks", "out")


def random_init_names() -> list[str]:
    """Every name ``--random-init`` takes: the registry's aliases, then its base architectures."""
    return registry.names() + list(registry.BASES)

DEFAULT_PROMPT = "What, in one word, is the greatest thing ever?"


@dataclass(frozen=True)
class BenchModel:
    """One benchmark configuration: which model, which head, which template."""

    name: str
    spec: str
    head: str  # "score" | "logprob" | "auto"
    template: str | None = None  # None: the tokenizer's chat template, else lm.default_template
    random_head_seed: int | None = None
    note: str = ""


BENCH_MODELS = {
    "smollm2-135m-instruct": BenchModel(
        "smollm2-135m-instruct", "smollm2-135m-instruct", "score", None, 0,
        "SmolLM2-135M-Instruct as a 1-output classifier, seeded random head (seed 0); chat template",
    ),
    "gemma3-270m": BenchModel(
        "gemma3-270m", "gemma3-270m", "logprob", None, None,
        "Gemma 3 270M base, logprob head, plain template 'User: {prompt}\\nAssistant: {response}': the suffix is "
        "empty, so a one-token candidate's log-prob is one entry of the prompt pass's log-softmax (no per-row work)",
    ),
    "gemma3-270m@eot": BenchModel(
        "gemma3-270m@eot", "gemma3-270m", "logprob", "User: {prompt}\nAssistant: {response}<end_of_turn>", None,
        "Gemma 3 270M base, logprob head, template ending in <end_of_turn>: per row 1 token through the layers "
        "+ the 262,144-way LM head (log p(response) + log p(<end_of_turn> | response))",
    ),
}
DEFAULT_MODELS = "smollm2-135m-instruct,gemma3-270m,gemma3-270m@eot"


def workload_dtype(asked: str | None, device: str, cpu_default: str) -> str:
    """The dtype a bench workload (best-of-N, states) loads its model in: the one asked for (``--dtype``); else on
    CUDA ``"auto"``, what ``rmfast scan`` takes there (the model config's bf16/fp16, else bfloat16:
    :func:`rmfast.loading.loader.dtype_and_choice`); else the workload's CPU default. The first GPU run timed
    best-of-N in fp32 on an H100 because nothing picked a dtype there (issue 32).

    >>> workload_dtype(None, "cuda", "float32"), workload_dtype(None, "cpu", "float32"), workload_dtype("fp32", "cuda", "x")
    ('auto', 'float32', 'fp32')
    """
    if asked:
        return asked
    return "auto" if str(device).startswith("cuda") else cpu_default


def resolve_models(spec: str) -> list[BenchModel]:
    """``--models``: comma-separated names; a known name is its configuration, any other a loadable spec
    benchmarked with its default head and template."""
    out = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        out.append(BENCH_MODELS.get(name) or BenchModel(name, name, "auto", None, None, "user-given model"))
    return out


@dataclass
class ModelChoice:
    """Which model a benchmark workload loads (the fields its config shares; loaded by
    :func:`rmfast.bench.random_init.load_workload_model`).

    Attributes:
        model: a loadable spec (default "smollm2-135m-instruct", the embedded SmolLM2-135M-Instruct).
        name: the model's name in the rows (default None: ``model``, or the random-init label).
        random_head_seed: seeded random one-output score head for a backbone (default 0; None: the model's).
        template: chat template or plain format overriding the model's (default None).
        random_init: instead of ``model``, a registry name built with random weights (default None);
            ``layers``, ``tiny`` and ``init_seed`` (defaults None, False, 0) shape it.
        allow_pickle: load pickled weights where a folder has no safetensors (default False).
    """

    model: str = "smollm2-135m-instruct"
    name: str | None = None
    random_head_seed: int | None = 0
    template: str | None = None
    random_init: str | None = None
    layers: int | None = None
    tiny: bool = False
    init_seed: int = 0
    allow_pickle: bool = False
