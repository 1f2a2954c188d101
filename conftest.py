"""Collection for the whole repository: ``tests/`` and the docstring examples of ``src/rmfast``
(pyproject: ``testpaths = ["tests", "src/rmfast"]``, ``--doctest-modules``).

Every rmfast module imports without its optional packages (triton, scipy, matplotlib,
statsmodels...), so every module is collected. An example is skipped, not failed, when what it
needs is absent:

- the ``analysis`` extra (scipy, matplotlib, statsmodels): examples in rmfast.analysis (the report included);
- the shared data folder ``../shared/data`` beside the repository: examples that read it.

Examples that need a model load are marked ``# doctest: +SKIP`` in the docstring itself.
Examples run with the repository root as working directory, so their relative paths
(``../shared/data/...``) mean the same from wherever pytest is started.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem

REPO = Path(__file__).resolve().parent
SHARED = REPO.parent / "shared" / "data"

try:  # as in tests/conftest.py: Triton must be told before its first import (a kernel module's doctest)
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

collect_ignore = ["src/rmfast/__main__.py"]  # importing it runs the CLI

_ANALYSIS = ("scipy", "matplotlib", "statsmodels")


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a broken install, or a module blocked in sys.modules
        return True


def pytest_collection_modifyitems(config, items):
    missing = [m for m in _ANALYSIS if _absent(m)]
    for item in items:
        if not isinstance(item, DoctestItem):
            continue
        source = "".join(ex.source for ex in item.dtest.examples)
        if missing and item.name.startswith("rmfast.analysis"):
            item.add_marker(pytest.mark.skip(reason=f"needs the analysis extra: {', '.join(missing)} not installed"))
        if "../shared/data" in source and not SHARED.is_dir():
            item.add_marker(pytest.mark.skip(reason=f"shared data folder {SHARED} is absent"))


@pytest.fixture(autouse=True)
def _examples_run_from_the_repository_root(request, monkeypatch):
    if isinstance(request.node, DoctestItem):
        monkeypatch.chdir(REPO)
