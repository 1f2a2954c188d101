"""Lazy imports of the heavy, optional dependencies (the ``[analysis]`` extra).

``import rmfast`` must work without scipy, matplotlib or statsmodels; the analyses import
them only when they run, through :func:`require`, which turns a missing package into a
one-line :class:`~rmfast.errors.UserError` naming the fix.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ...errors import UserError

_EXTRA = {
    "scipy": "rmfast[analysis]",
    "scipy.stats": "rmfast[analysis]",
    "matplotlib": "rmfast[analysis]",
    "statsmodels": "rmfast[analysis]",
    "statsmodels.formula.api": "rmfast[analysis]",
    "wordfreq": "rmfast[analysis]",
    "afinn": "rmfast[analysis]",
}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` or raise a UserError saying what to install for ``feature``.

    >>> require("json", "a test").dumps([1])
    '[1]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        pkg = _EXTRA.get(module, module.split(".")[0])
        raise UserError(
            f"{feature} needs the Python package '{module.split('.')[0]}' ({exc.__class__.__name__}: {exc}); "
            f"install it with: pip install '{pkg}'"
        ) from None


def stats():
    """``scipy.stats``, imported on first use."""
    return require("scipy.stats", "this analysis")
