"""rmfast: exhaustive, exact, fast reward-model scanning.

Example:
    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> res = rmfast.scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
    >>> res.top(10)  # doctest: +SKIP
"""

from .version import __version__  # noqa: F401

__all__ = ["scan", "ScanResult", "load", "LoadedModel", "build_template", "Template", "Engine", "UserError"]


from .errors import UserError  # noqa: E402
from .pipeline import ScanResult, scan  # noqa: E402  (the function; the module is rmfast.pipeline)
from .template import Template, build_template  # noqa: E402
from .loader import LoadedModel, load  # noqa: E402  (the function; the module is rmfast.loader)
from .engine import Engine  # noqa: E402
from . import gcg  # noqa: E402,F401  (rmfast.gcg.run)
