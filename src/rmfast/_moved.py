"""Old module paths (before the modules were grouped by role) keep working: ``import rmfast.pipeline``
gives :mod:`rmfast.scoring.pipeline`, the same module object, so monkeypatching either name patches both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old name under rmfast -> the module it is now
MOVED = {
    "engine": "fast.engine", "layer": "fast.layer", "ops": "fast.ops", "models.arch": "fast.arch",
    "models.heads": "fast.heads", "loader": "loading.loader", "embedded": "loading.embedded",
    "registry": "loading.registry", "checkpoints": "loading.training_checkpoints",
    "models.custom_heads": "loading.custom_heads", "models.support": "loading.support",
    "resolve": "scoring.plan", "pipeline": "scoring.pipeline", "candidates": "scoring.candidates",
    "reference": "scoring.hf_path", "audit": "scoring.audit", "vocab": "scoring.vocab",
    "results": "scoring.results", "gcg_result": "gcg.result", "gcg_select": "gcg.select",
    "store": "sweep.store", "dist": "sweep.dist",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        old = fullname.partition("rmfast.")[2] if fullname.startswith("rmfast.") else None
        if old in MOVED or old == "models":
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        old = spec.name.partition("rmfast.")[2]
        if old == "models":  # the old package: a namespace for its moved modules
            return None
        return importlib.import_module(f"rmfast.{MOVED[old]}")

    def exec_module(self, module):
        if module.__name__ == "rmfast.models":
            module.__path__ = []  # a package, so that rmfast.models.<x> is looked up


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
