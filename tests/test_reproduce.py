"""``rmfast reproduce``: a tiny planted dataset (fast) and the published data (skipped when
../shared/data is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy.stats")
pytest.importorskip("matplotlib")

from rmfast.analysis import reproduce
from rmfast.analysis.paper_a.reproduce import GE, HP
from rmfast.cli import main
from rmfast.errors import UserError

SHARED = Path(os.environ.get("RMFAST_SHARED_DATA",
                             Path(__file__).resolve().parents[1].parent / "shared" / "data"))


def _planted(tmp_path: Path) -> Path:
    """Two prompts, three models, 12 items; model m1 = the human order, m2 its reverse."""
    data = tmp_path / "data"
    (data / "eloeverything").mkdir(parents=True)
    items = [f"item {i}" for i in range(12)]
    elo = np.arange(1200, 1080, -10.0)
    rng = np.random.default_rng(0)
    for prompt in (GE, HP):
        df = pd.DataFrame({"elo_rank": range(1, 13), "elo_score": elo, "name": items,
                           "elo_matches": 5, "org/m1": elo / 100, "org/m2": -elo / 100,
                           "org/m3": rng.normal(size=12)})
        df.to_csv(data / "eloeverything" / (prompt.rstrip("?") + ".csv"), index=False)
    return data


def test_reproduce_planted(tmp_path):
    data, out = _planted(tmp_path), tmp_path / "out"
    findings = reproduce.run(data, out, ("a", "b"))
    by_id = {f["id"]: f for f in findings}
    assert {"A-fig5b-a7", "A-fig5c", "A-figA5", "A-figA6", "A-pvalues", "A-methods",
            "B-data"} <= set(by_id)
    assert by_id["B-data"]["summary"].startswith("not available: no folder")  # no iclr2026/ planted
    # the planted items under the paper's prompts are not the paper's: the verdict is computed
    assert by_id["A-fig5b-a7"]["holds"] is False
    assert "GE: paper method 0/10 and 0/10, rmfast's 0/10 and 0/10" in by_id["A-fig5b-a7"]["summary"]
    assert by_id["A-figA6"]["holds"] is None  # no paper model names in the planted data
    for f in findings:
        for name in f["files"]:
            assert (out / name).stat().st_size > 0
    rho = pd.read_csv(out / "A-fig5c_spearman.csv").groupby("model")["spearman_rho"]
    assert rho.min()["org/m1"] == pytest.approx(1.0)  # per prompt: m1 is the human order
    assert rho.max()["org/m2"] == pytest.approx(-1.0)
    md, page = (out / "index.md").read_text(), (out / "index.html").read_text()
    assert "A-figA5_kendall_GE.png" in md and "<img src='A-figA5_kendall_GE.png'" in page
    # figures scale to their column (a fixed 880 px image overflowed a narrower page)
    assert ".i img{max-width:100%;height:auto}" in page and ".i{flex:1 1 0;min-width:0}" in page
    with pytest.raises(UserError, match="already exists"):
        reproduce.run(data, out, ("a",))
    (out / "stale.txt").write_text("old")
    reproduce.run(data, out, ("a",), overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "index.html").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temp left


def test_reproduce_bad_inputs(tmp_path, capsys):
    with pytest.raises(UserError, match="does not exist"):
        reproduce.run(tmp_path / "nowhere", tmp_path / "out", ("a",))
    with pytest.raises(UserError, match="unknown paper"):
        reproduce.run(tmp_path, tmp_path / "out", ("c",))
    assert main(["reproduce", "--data", str(tmp_path / "nowhere"), "--out",
                 str(tmp_path / "o")]) == 2
    assert "--data DIR" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "eloeverything").is_dir(), reason="shared data absent")
def test_reproduce_paper_a_published(tmp_path, capsys):
    assert main(["reproduce", "--data", str(SHARED), "--papers", "a", "--out",
                 str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    for fid in ("A-fig5b-a7", "A-fig5c", "A-figA5", "A-figA6"):
        line = next(ln for ln in err.splitlines() if ln.startswith(fid + " "))
        assert " holds " in line, line
    # on every prompt, not GE alone: only its GE place depends on the median-with-human statistic
    assert ("'Black people' (humans higher): GE #3 under method='paper', #21 under rmfast's; HP #1 under "
            "method='paper', #1 under rmfast's; GW #2 under method='paper', #1 under rmfast's") in err
    assert "holds" in (tmp_path / "r" / "index.html").read_text()
    # issue 52 §2, §5: every index line names its statistic, its n and its direction
    md = (tmp_path / "r" / "index.md").read_text()
    assert "Kendall tau-b between human Elo and each model's scores (positive: same order), n = 7,530" in md
    assert "Spearman rho between each model's scores and human Elo" in md and "n = 7,530 items each" in md
    assert "Kendall tau-b between two prompts' scores" in md and "rank gap = model rank" in md
    assert "NDCG of model b's order with model a's scores as gains" in md
    assert "undefined in 63/90 ordered pairs" in md and "random order 0.926–0.969" in md
    # the docs' paper-vs-rmfast figures are the ones reproduce writes (paper_methods.md quoted an RBO it never wrote)
    doc = (Path(__file__).parents[1] / "docs" / "paper_methods.md").read_text()
    rows = pd.read_csv(tmp_path / "r" / "A-methods.csv").set_index("difference")["value"]
    rbo, rho = rows["rbo"].split("; rho ")
    assert f"max difference {rbo}, Spearman between the two {rho}" in doc, rows["rbo"]


def test_index_html_has_the_summary_table_one_verdict_word_and_what_cannot_be_drawn(tmp_path):
    data, out = _planted(tmp_path), tmp_path / "out"
    findings = reproduce.run(data, out, ("a", "b"))
    page = (out / "index.html").read_text()
    head = page[:page.index("<div class='f'")]  # the summary table comes before the figures
    assert "<h2>Summary</h2>" in head
    for f in findings:
        assert f"<a href='#{f['id']}'>{f['id']}</a>" in head
    for f in findings:  # the verdict is its own column: the summary does not repeat it
        assert not f["summary"].startswith(("holds", "does not hold")), f["summary"]
    assert "holds</b>: holds" not in page and "does not hold</b>: does not hold" not in page
    tail = page[page.index("id='not-reproducible'"):]
    assert "Fig. 1-2" in tail and "EloEverything" in tail and "log-probabilities" in tail
    md = (out / "index.md").read_text()
    assert "## What the published data does not allow" in md


def test_a_data_folder_with_none_of_the_data_is_refused(tmp_path):
    """--data pointing at a folder with neither paper's files: one UserError naming the folder, nothing written
    (it wrote an index of "not available" findings and exited 0)."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds none of the papers' data"):
        reproduce.run(tmp_path / "empty", tmp_path / "out", ("a", "b"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
