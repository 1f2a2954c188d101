"""The import layers stay as pyproject.toml's import-linter contracts say (CLI on top, kernels below,
the fast path's, the scoring, analysis and states packages' own order, ops the only door into the kernels)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_layers_contract(capsys):
    cli = pytest.importorskip("importlinter.cli", reason="import-linter is in the test extra: pip install -e '.[test]'")
    rc = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    out = capsys.readouterr().out
    assert rc == 0, out
    n = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert n == 6 and f"{n} kept, 0 broken" in out


def test_library_never_imports_the_cli():
    """Nothing outside rmfast.cli imports it (the contract's top layer, spelled out)."""
    src = ROOT / "src" / "rmfast"
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py")
                 if "cli" not in p.relative_to(src).parts[:1] and p.name != "__main__.py"
                 and any(s in p.read_text() for s in ("from .cli", "from ..cli", "rmfast.cli"))]
    assert offenders == []


def test_design_doc_names_every_layer():
    """docs/design.md spells the contracts out for a reader; every layer of every contract is named there."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    doc = (ROOT / "docs" / "design.md").read_text()
    names = {n.strip() for c in contracts if c["type"] == "layers" for layer in c["layers"] for n in layer.split("|")}
    missing = sorted(n for n in names if f"`{n}`" not in doc and f"| {n}" not in doc and f"{n} |" not in doc)
    assert not missing, f"docs/design.md's import layers lack {missing} (pyproject.toml has them)"
