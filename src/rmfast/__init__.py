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
           "Template", "plan_scoring", "ScoringPlan", "Engine", "UserError", "RewardScorer"]


from .errors import UserError  # noqa: E402
from .scoring.pipeline import ScanResult, Selection, run_scan, scan, score_texts  # noqa: E402
from .scoring.plan import ScoringPlan, plan_scoring  # noqa: E402
from .scoring.scorer import RewardScorer  # noqa: E402
from .template import Template, build_template  # noqa: E402
from .loading.loader import LoadedModel, load  # noqa: E402  (the function; the module is rmfast.loading.loader)
from .fast.engine import Engine  # noqa: E402
from . import gcg  # noqa: E402,F401  (rmfast.gcg.run)
from . import _moved  # noqa: E402

_moved.install()  # the old module paths (rmfast.pipeline, rmfast.loader, ...) still import
from .cpu import isolate_compile_cache as _isolate_compile_cache  # noqa: E402

# inductor's on-disk cache, one folder per CPU kind and kernel level (rmfast.cpu.isolate_compile_cache
# says why): set now, on import, because loading a model through transformers already fixes the
# folder for the process; a user's own TORCHINDUCTOR_CACHE_DIR is kept.
_isolate_compile_cache()
