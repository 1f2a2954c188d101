"""rmfast: exhaustive, exact, fast reward-model scanning.

Example:
    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> res = rmfast.scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
    >>> res.top(10)  # doctest: +SKIP
"""

__version__ = "0.1.0"

__all__ = ["scan", "ScanResult", "load", "LoadedModel", "build_template", "Template", "Engine", "UserError"]


from .errors import UserError  # noqa: E402
from .scan import ScanResult, scan  # noqa: E402  (binds rmfast.scan to the function, not the module)
from .template import Template, build_template  # noqa: E402


def __getattr__(name):
    # The loader pulls in gguf/accelerate machinery: import it on first use.
    if name in ("load", "LoadedModel"):
        import importlib

        mod = importlib.import_module(".load", __name__)
        # Importing the submodule binds rmfast.load to the module; rebind the public names.
        globals().update(load=mod.load, LoadedModel=mod.LoadedModel)
        return globals()[name]
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(name)
