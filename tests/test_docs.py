"""The docs name real things: every ``rmfast.x.y`` they mention imports (a module, or an attribute of one), and
every repository file they point to exists. A reader copies these names; a module moved without its docs is a
broken copy-paste (four were found by reading, 2026-11-27)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _mentions(pattern: str) -> dict[str, str]:
    """Each match of ``pattern`` in the docs -> the first 'file:line' naming it."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            for m in re.finditer(pattern, line):
                found.setdefault(m.group(0).rstrip(".,;:"), f"{doc.relative_to(ROOT)}:{i}")
    return found


#: names in the docs that are not Python objects, and what they are
NOT_OBJECTS = {"rmfast.xray": "the TRL callback's logger"}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_rmfast_name_in_the_docs_exists():
    names = _mentions(r"\brmfast(\.[A-Za-z_][A-Za-z0-9_]*)+")
    assert len(names) > 40  # the pattern still finds the docs' names
    for stmt, where in _mentions(r"from rmfast[\w.]* import [\w, ]+").items():  # snippets' imports
        module, _, what = stmt[len("from "):].partition(" import ")
        names.update({f"{module}.{n.strip()}": where for n in what.split(",") if n.strip()})
    bad = [f"{where}: {name}" for name, where in sorted(names.items()) if name not in NOT_OBJECTS and not _resolves(name)]
    assert not bad, "the docs name what does not exist:\n" + "\n".join(bad)


def _exists(ref: str) -> bool:
    """A path, or a test's node id (``tests/test_x.py::test_y``: the file defines the function)."""
    path, _, func = ref.partition("::")
    f = ROOT / path
    return f.exists() and (not func or f"def {func.split('[')[0]}(" in f.read_text())


def test_every_repository_path_in_the_docs_exists():
    paths = _mentions(r"(?<![\w./-])(?:src|tests|benchmarks|docs|examples)/[^\s`'\")\]]*")
    assert len(paths) > 20
    # patterns (<name>, *, {a,b}) and run outputs (benchmarks/out/, not in the repository) are not checked
    bad = [f"{where}: {p}" for p, where in sorted(paths.items()) if not _exists(p)
           and not any(c in p for c in "<*{") and not p.startswith("benchmarks/out/")]
    assert not bad, "the docs point to files that do not exist:\n" + "\n".join(bad)
