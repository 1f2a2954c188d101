"""GCG: the longest-response search of paper A (:mod:`.search`), its candidate selection
(:mod:`.select`) and results (:mod:`.result`).

>>> from rmfast.gcg import GCGConfig, run  # doctest: +SKIP
"""

from .result import GCGResult, RandomSearchResult
from .search import GCGConfig, allowed_tokens, random_search, run

__all__ = ["GCGConfig", "GCGResult", "RandomSearchResult", "run", "random_search", "allowed_tokens"]
