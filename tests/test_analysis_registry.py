"""The registry of analyses (rmfast.analysis.registry): one line per analysis, read by the CLI, the report,
``rmfast reproduce`` and the package docstring; and the public API of rmfast.analysis, imported lazily."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from rmfast.analysis import registry
from rmfast.cli import build_parser, main

ANALYZE = Path(__file__).resolve().parents[1] / "src" / "rmfast" / "cli" / "analyze.py"

#: rmfast.analysis.__all__ before the modules were grouped into subpackages: it keeps working
PUBLIC = {"AgreementResult", "BestWorstResult", "CategoryResult", "DistributionResult", "ExposureResult",
          "ExtremesResult", "HumanData", "HumanResult", "Ledger", "Result", "SentimentResult", "agreement",
          "best_worst", "categories", "distributions", "exposure", "extremes", "human_comparison", "load_afinn",
          "load_dictionary", "load_eloeverything", "load_frequencies", "load_human_scores",
          "load_model_metadata", "load_scans", "match_metadata", "mds", "normalize_word", "permutation_test",
          "rbo", "rsa_test", "select", "shared_vocabulary", "sentiment", "validate_scans"}


def _analyze_choices() -> tuple[str, ...]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["analyze"]
    return tuple(next(a for a in sub._actions if a.dest == "name").choices)


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_analysis_is_reachable_from_the_cli(name, capsys):
    with pytest.raises(SystemExit) as e:  # rmfast analyze NAME --help exits 0
        main(["analyze", name, "--help"])
    assert e.value.code == 0
    assert name in capsys.readouterr().out  # the help's table of analyses names it


def test_every_cli_analysis_is_registered():
    assert _analyze_choices() == registry.names()
    assert main(["analyze", "no-such-analysis", "--help"]) == 2  # a name the registry lacks is refused
    # every analysis name that analyze.py branches on is a registered one
    branched = {n.comparators[0].value for n in ast.walk(ast.parse(ANALYZE.read_text()))
                if isinstance(n, ast.Compare) and len(n.comparators) == 1
                and isinstance(n.comparators[0], ast.Constant) and isinstance(n.comparators[0].value, str)
                and isinstance(n.ops[0], ast.Eq)
                and (getattr(n.left, "id", None) == "name" or getattr(n.left, "attr", None) == "name")}
    assert branched and branched <= set(registry.names()), branched - set(registry.names())


def test_the_registry_is_one_line_each_and_its_functions_load():
    assert len(set(registry.names())) == len(registry.ANALYSES)
    for a in registry.ANALYSES:
        fn = a.load()
        assert callable(fn) and fn.__name__ == a.function.split(":")[1]
        assert fn.__module__ == f"rmfast.analysis.{a.function.split(':')[0]}"
        assert a.title and "\n" not in a.title
    for letter in registry.PAPERS:
        assert registry.load_paper(letter).__name__ == f"reproduce_paper_{letter}"
    from rmfast.analysis import reproduce

    assert reproduce.PAPERS == tuple(registry.PAPERS)


def test_the_package_docstring_lists_the_registry():
    import rmfast.analysis as A

    assert registry.table() in A.__doc__
    for a in registry.ANALYSES:
        assert f"{a.name} " in A.__doc__ and a.function.split(":")[1] in A.__doc__


def test_the_public_api_is_kept_and_lazy():
    import rmfast.analysis as A

    assert set(A.__all__) == PUBLIC
    for name in PUBLIC:  # each name resolves to the object of its module
        obj = getattr(A, name)
        assert getattr(sys.modules[obj.__module__], name) is obj
    code = ("import sys, rmfast.analysis; print(sorted(m for m in sys.modules if m == 'pandas' or "
            "m.startswith('rmfast.analysis.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "['rmfast.analysis.registry']"


def test_the_report_titles_its_sections_from_the_registry(monkeypatch):
    pytest.importorskip("scipy")
    from types import SimpleNamespace

    from rmfast.analysis.report import _section_specs
    from rmfast.analysis.representations import views

    monkeypatch.setattr(views, "has_representations", lambda *a: False)
    x = SimpleNamespace(join="text", dictionaries=("d/big2.csv",), k=10, scans=None, states=None, similarity_csv=None)
    specs = {key: title for key, title, *_ in _section_specs(x)}
    titles = {a.name: a.title for a in registry.ANALYSES}
    for key in ("distributions", "agreement", "human", "sentiment", "exposure", "best-worst"):
        assert specs[key] == titles[key]
    assert specs["categories-big2.csv"] == f"{titles['categories']}: big2.csv"
