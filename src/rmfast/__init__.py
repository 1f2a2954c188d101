"""rmfast: exhaustive, exact, fast reward-model scanning.

Example:
    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> res = rmfast.scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
    >>> res.top(10)  # doctest: +SKIP
"""

__version__ = "0.1.0"

__all__ = ["scan", "ScanResult", "load", "LoadedModel", "build_template", "Template", "Engine", "UserError"]


def __getattr__(name):
    # Lazy: `import rmfast` stays cheap (no torch/transformers import until used).
    if name in ("scan", "ScanResult"):
        from . import scan as _s

        return getattr(_s, name)
    if name in ("load", "LoadedModel"):
        from . import load as _l

        return getattr(_l, name)
    if name in ("build_template", "Template"):
        from . import template as _t

        return getattr(_t, name)
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name == "UserError":
        from .errors import UserError

        return UserError
    raise AttributeError(name)
