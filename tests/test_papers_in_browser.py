"""``reproduce``'s index and the HTML report in a real browser (Chromium via Playwright, as
tests/test_explore.py drives the explorer): at a fixed window size every figure loads and fits
its column, the page never scrolls sideways, and the summary table comes first. Screenshots go
to ``$RMFAST_SCREENSHOTS`` when set (to look at them), else to the test's tmp folder.

Skips in one line when Playwright or a Chromium is missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("scipy.stats")
pytest.importorskip("matplotlib")

from rmfast.analysis import reproduce

from test_reproduce import _planted

WINDOW = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def browser():
    sync = pytest.importorskip("playwright.sync_api", reason="playwright not installed "
                               "(pip install 'rmfast[browser]')")
    exe = os.environ.get("RMFAST_CHROMIUM") or next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
         if shutil.which(n)), None)
    pw = sync.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
    except Exception as exc:
        pw.stop()
        pytest.skip(f"no browser for Playwright ({str(exc).splitlines()[0][:120]}); install chromium")
    yield b
    b.close()
    pw.stop()


def _shot(page, tmp_path: Path, name: str) -> Path:
    out = Path(os.environ.get("RMFAST_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / name), full_page=True)
    return out / name


def _check_page(page) -> None:
    """Every image loaded and no wider than its column; nothing scrolls sideways."""
    imgs = page.evaluate("""[...document.images].map(i => ({src: i.getAttribute('src'),
        loaded: i.complete && i.naturalWidth > 0, w: i.getBoundingClientRect().width,
        col: i.parentElement.getBoundingClientRect().width}))""")
    assert imgs, "no figures on the page"
    bad = [i["src"][:60] for i in imgs if not i["loaded"] or i["w"] > i["col"] + 1]
    assert not bad, bad
    assert page.evaluate("document.documentElement.scrollWidth") <= WINDOW["width"]


def test_reproduce_index_in_chromium(tmp_path, browser):
    data, out = _planted(tmp_path), tmp_path / "out"
    findings = reproduce.run(data, out, ("a", "b"))
    page = browser.new_page(viewport=WINDOW)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((out / "index.html").as_uri())
    _check_page(page)
    rows = page.locator("table.s").first.locator("tr")
    assert rows.count() == len(findings) + 1  # the summary: one row per finding, first on the page
    assert page.locator("h2").first.inner_text() == "Summary"
    assert "holds: holds" not in page.inner_text("body")
    assert page.locator("#not-reproducible").is_visible()
    shot = _shot(page, tmp_path, "reproduce_index.png")
    assert shot.stat().st_size > 20_000 and errors == []


def test_report_in_chromium(tmp_path, browser):
    from rmfast.analysis.report import build_report, write_report

    from test_report import _inputs

    scans, human = _inputs(tmp_path)
    html = build_report(scans, human=human, metadata=tmp_path / "meta.csv",
                        afinn=tmp_path / "afinn.txt", frequencies=tmp_path / "freq.csv",
                        dictionaries=[tmp_path / "big2.csv"], n_perm=200, k=5)
    path = write_report(tmp_path / "report.html", html)
    page = browser.new_page(viewport=WINDOW)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    _check_page(page)
    shot = _shot(page, tmp_path, "report.png")
    assert shot.stat().st_size > 20_000 and errors == []
