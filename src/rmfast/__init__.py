"""rmfast: exhaustive, exact, fast reward-model scanning.

Example:
    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> res = rmfast.scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
    >>> res.top(10)  # doctest: +SKIP
"""

import os as _os

# Bit-identical fp32 results across processes: MKL's GEMMs otherwise pick code paths by the operands'
# memory alignment, so the same ids scored in two processes can differ in the last bit (measured:
# 102 of 300 log-probs on a Zen 4, 14 with AVX2 kernels). MKL reads this once, at its first call, so
# it is set here, before rmfast or its user runs any math through torch; a user's own value is kept.
# rmfast.cpu.mkl_cbwr() tells whether it took effect (the manifest records it).
_os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from .version import __version__  # noqa: E402,F401

__all__ = ["scan", "run_scan", "score_texts", "Selection", "ScanResult", "load", "LoadedModel", "build_template",
           "Template", "plan_scoring", "ScoringPlan", "Engine", "UserError", "RewardScorer", "ScoringOptions",
           "ScoreStats", "Ranked", "rmfast_reward"]

from .errors import UserError  # noqa: E402
from .cpu import isolate_compile_cache as _isolate_compile_cache  # noqa: E402  (imports no torch)

# inductor's on-disk cache, one folder per CPU kind and kernel level (rmfast.cpu says why): set
# now, on import, because loading a model through transformers already fixes the folder for the process;
# a user's own TORCHINDUCTOR_CACHE_DIR is kept. Without importing torch.
_isolate_compile_cache()

# The API is imported when first used (PEP 562), not by ``import rmfast``: torch, transformers and
# inductor take seconds to import, and ``rmfast --help`` imports this package first (issue 37:
# `rmfast --help` took 8-11 s). name -> its module.
_API = {"scan": "scoring.pipeline", "run_scan": "scoring.pipeline", "score_texts": "scoring.pipeline",
        "Selection": "scoring.pipeline", "ScanResult": "scoring.pipeline", "plan_scoring": "scoring.plan",
        "ScoringPlan": "scoring.plan", "RewardScorer": "scoring.scorer", "build_template": "template",
        "Template": "template", "load": "loading.loader", "LoadedModel": "loading.loader", "Engine": "fast.engine",
        # the backend's other names (what RewardScorer takes and gives, and the TRL adapter)
        "ScoringOptions": "scoring.options", "ScoreStats": "scoring.score_stats", "Ranked": "scoring.scorer",
        "rmfast_reward": "integrations.grpo"}


def __getattr__(name: str):
    import importlib

    if name in _API:
        value = getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
        globals()[name] = value  # looked up once
        return value
    if name == "gcg":  # rmfast.gcg.run
        return importlib.import_module(f"{__name__}.gcg")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API) | {"gcg"})

