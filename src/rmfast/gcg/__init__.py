"""GCG: the longest-response search of paper A (:mod:`.search`), its candidate selection
(:mod:`.select`) and results (:mod:`.result`).

>>> from rmfast.gcg import GCGConfig, run  # doctest: +SKIP
"""

# imported when first used (PEP 562): the CLI's parser reads GCGConfig's defaults without torch
_EXPORTS = {"GCGConfig": "config", "GCGResult": "result", "GCGInterrupted": "result", "RandomSearchResult": "result",
            "run": "search",
            "random_search": "search", "allowed_tokens": "tokens"}

__all__ = ["GCGConfig", "GCGResult", "GCGInterrupted", "RandomSearchResult", "run", "random_search", "allowed_tokens"]


def __getattr__(name: str):
    import importlib

    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
