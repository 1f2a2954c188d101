"""Lazy imports of the heavy, optional dependencies (the ``[analysis]`` extra).

``import rmfast`` must work without scipy, matplotlib or statsmodels; the analyses import
them only when they run, through :func:`require`, which turns a missing package into a
one-line :class:`~rmfast.errors.UserError` naming the fix.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ...errors import EXTRAS, UserError, missing_package


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` or raise a UserError saying what to install for ``feature``.

    >>> require("json", "a test").dumps([1])
    '[1]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        err = missing_package(exc, feature)
        if err is None:  # a package no extra installs (or a broken install): named with the error itself
            raise UserError(f"{feature} needs the Python package '{module.split('.')[0]}' ({exc.__class__.__name__}: "
                            f"{exc}); install it with: pip install {module.split('.')[0]}") from None
        raise err from None


def stats():
    """``scipy.stats``, imported on first use."""
    return require("scipy.stats", "this analysis")


def plots_available(skipped: str) -> bool:
    """Whether matplotlib imports; without it one note on stderr naming the extra and what is left out (``skipped``),
    and the caller writes everything else as usual: a missing plotting package is no reason to fail a job whose
    tables are written (``analyze lens --out`` wrote its CSV, then exited 2, and the rerun refused to overwrite it)."""
    import sys

    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        if missing_package(e) is None:  # installed but broken: its own error, not "not installed"
            raise
        print(f"rmfast: note: {skipped} left out: matplotlib is not installed (pip install "
              f"'rmfast[{EXTRAS['matplotlib']}]'); everything else is written as usual", file=sys.stderr)
        return False
    return True
