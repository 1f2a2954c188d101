"""``rmfast bench``: rmfast against the plain Hugging Face baselines and the GEMM peak, in one process.

For each model (same prompt, same candidate ids), in one run:

* **naive** — the papers' pipeline: the full templated sequence per candidate, batched
  (:func:`rmfast.scoring.hf_path.hf_scores`); the better of a couple of batch sizes.
* **hf-cache** — the best plain-HF approach: the prompt's K/V computed once with
  ``model(prefix, use_cache=True)``; per batch the ``DynamicCache`` is deep-copied and
  ``batch_repeat_interleave(B)``-ed (HF appends to the cache along the sequence axis, so every
  batch needs its own per-row copy), and candidate + template suffix go through
  ``model(input_ids=..., cache=cache)`` (``past_key_values=`` before transformers renamed it). Score
  head: ``model.model(...)`` hidden state at the final position -> ``model.score``. Logprob head:
  the same log-softmax terms the engine sums.
* **rmfast** — :class:`rmfast.fast.engine.Engine` at ``scan``'s automatic batch size.
* **GEMM peak** — ``torch.matmul`` throughput on the model's own projection shapes
  (q/k/v/o, gate/up/down, and the LM-head chunk for the logprob head) with M = the tokens of one
  rmfast batch, and the candidates/s that peak allows.

Model FLOPs per candidate (the "useful" work, the same number for every method):
``2 * N_gemm * t`` for the score head, ``2 * (N_gemm + V * D) * t`` for the logprob head, where
``N_gemm`` is the decoder's projection parameters (non-embedding, norms excluded), ``t`` the tokens
a candidate row runs through the layers (score: 1 + len(suffix); logprob: len(continuation)),
``V * D`` the LM head. Attention over the prompt (P * D per token per layer) is not counted.

Every method's scores are checked against rmfast's on the timed candidates (rank correlation and
max difference); a disagreement makes the command exit 1 after writing its results.

Modules: :mod:`~rmfast.bench.models` (the configurations), :mod:`~rmfast.bench.machine` (machine,
memory, timing), :mod:`~rmfast.bench.flops` (FLOPs, GEMM peak, GPU cost model),
:mod:`~rmfast.bench.baselines` (hf-cache, naive, agreement), :mod:`~rmfast.bench.run` (one model
through every method), :mod:`~rmfast.bench.output` (CSV/JSON, plot, table),
:mod:`~rmfast.bench.random_init` (full-size architectures of :mod:`rmfast.loading.registry` with random weights:
``--random-init``), :mod:`~rmfast.bench.best_of_n` (``--workload best-of-n``: N responses of mixed lengths per
prompt, RewardScorer vs HF on right-padded full conversations; FLOP ratios with and without attention),
:mod:`~rmfast.bench.states_overhead` (``--workload states``: the extra time of a scan with ``--states last_prenorm`` /
``all`` over a plain one). This package
re-exports what the ``rmfast bench`` command uses.
"""

# What ``rmfast bench`` uses, imported when first used (PEP 562): ``rmfast --help`` builds this command's
# options from :mod:`.models` alone, without torch (issue 37's start-up). name -> (module, its name there).
_EXPORTS = {"COST_MODELS": ("flops", "COST_MODELS"), "H100_SXM": ("flops", "H100_SXM"),
            "format_cost_model": ("flops", "format_cost_model"), "gpu_cost_model": ("flops", "gpu_cost_model"),
            "loadavg": ("machine", "loadavg"), "log": ("machine", "log"), "machine_info": ("machine", "machine_info"),
            "BENCH_MODELS": ("models", "BENCH_MODELS"), "DEFAULT_MODELS": ("models", "DEFAULT_MODELS"),
            "DEFAULT_PROMPT": ("models", "DEFAULT_PROMPT"), "DEFAULT_OUT": ("models", "DEFAULT_OUT"),
            "resolve_models": ("models", "resolve_models"), "random_init_names": ("models", "random_init_names"),
            "format_table": ("output", "format_table"), "plot": ("output", "plot"),
            "write_outputs": ("output", "write_outputs"),
            "random_init_bench_models": ("random_init", "random_init_bench_models"),
            "random_init_model": ("random_init", "random_init_model"), "bench_model": ("run", "bench_model"),
            "device_defaults": ("run", "device_defaults")}

__all__ = sorted([*_EXPORTS, "versions"])


def __getattr__(name: str):
    import importlib

    if name == "versions":
        from ..cpu import versions

        return versions
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
