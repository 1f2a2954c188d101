"""What a non-editable install gets: every file the package reads at run time is in the wheel.

`make setup` installs editable, so a data file missing from pyproject's package-data would only show on a
`pip install .` (the explorer would fail to find its page). Two checks: the package-data globs cover every
non-Python file under src/rmfast (fast, always), and a built wheel holds them (where setuptools is here).
"""
from __future__ import annotations

import fnmatch
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "rmfast"


def _data_files() -> list[str]:
    # package-relative paths of every file that is not Python source or a cache
    return sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


def test_package_data_covers_every_data_file():
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rmfast"]
    files = _data_files()
    assert "py.typed" in files and "explorer/explorer.html" in files
    missed = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missed, f"add these to [tool.setuptools.package-data] in pyproject.toml: {missed}"


def test_wheel_holds_the_data_files(tmp_path):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("building a wheel without build isolation needs setuptools")
    # built from a copy, so the checkout gets no build/ folder
    src = tmp_path / "src"
    shutil.copytree(PKG, src / "src" / "rmfast", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "setuptools" in r.stderr and "require" in r.stderr.lower():
        pytest.skip("this setuptools is older than the build-system's; " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "dist").glob("rmfast-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in _data_files() if f"rmfast/{f}" not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert "rmfast/scoring/scorer.py" in names
