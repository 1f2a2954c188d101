"""``rmfast analyze`` / ``rmfast report`` argument handling, outputs and error exits."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy")

from rmfast.cli import main
from rmfast.cli.analyze import ANALYSES, register

BEST, WORST = "What, in one word, is the best thing ever?", "What, in one word, is the worst thing ever?"


def _write_scans(folder: Path, n=60, seed=0):
    rng = np.random.default_rng(seed)
    texts = [f" w{i}" for i in range(n)] + ["good", "bad"]
    for m in ("org/A-gemma", "org/B-llama", "org/C-llama"):
        for prompt in (BEST, WORST):
            s = rng.normal(size=len(texts))
            df = pd.DataFrame({"token_id": np.arange(len(texts), dtype="int64"), "token": texts,
                               "text": texts, "score": s})
            df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
            stem = f"{m.split('/')[1]}_{'best' if prompt == BEST else 'worst'}.parquet"
            df.to_parquet(folder / stem)
            Path(str(folder / stem) + ".json").write_text(json.dumps(
                {"model": {"name": m}, "prompt": prompt}))


def test_register_adds_subcommands_with_func():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze", "distributions", "x.parquet"])
    assert args.func.__name__ == "run_analyze" and args.name == "distributions"
    args = parser.parse_args(["report", "d", "--out", "r.html"])
    assert args.func.__name__ == "run_report"
    assert set(ANALYSES) == {"distributions", "agreement", "sentiment", "exposure",
                             "best-worst", "human", "categories", "extremes", "trajectory",
                             "similarity", "lens"}


def test_analyze_writes_csv_and_prints(tmp_path, capsys):
    _write_scans(tmp_path)
    out = tmp_path / "agree.csv"
    assert main(["analyze", "agreement", str(tmp_path), "--join", "id", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert len(table) == 2 * 3 and {"kendall_tau_b", "spearman_rho", "rbo"} <= set(table.columns)
    assert main(["analyze", "agreement", str(tmp_path), "--table", "mds"]) == 0
    assert "stress1" in capsys.readouterr().out
    assert main(["analyze", "extremes", str(tmp_path), "--k", "2", "--models", "org/A-gemma"]) == 0
    printed = capsys.readouterr().out
    assert "org/A-gemma" in printed and "org/B-llama" not in printed
    assert "' w" in printed  # texts quoted: a token's leading space shows (" w1" and "w1" had printed alike)
    assert main(["analyze", "best-worst", str(tmp_path), "--k", "3"]) == 0


def test_analyze_reports_drops_on_stderr(tmp_path, capsys):
    _write_scans(tmp_path)
    afinn = tmp_path / "afinn.txt"
    afinn.write_text("good\t3\nbad\t-3\n")
    assert main(["analyze", "sentiment", str(tmp_path), "--afinn", str(afinn)]) == 0
    err = capsys.readouterr().err
    assert "rows left out" in err and "token not in the AFINN lexicon" in err


def test_sentiment_without_afinn_file_uses_the_afinn_package(tmp_path, capsys):
    pytest.importorskip("afinn")  # in the `analysis` extra
    _write_scans(tmp_path)
    assert main(["analyze", "sentiment", str(tmp_path)]) == 0
    assert "token not in the AFINN lexicon" in capsys.readouterr().err


def test_analyze_errors_exit_2_with_one_line(tmp_path, capsys):
    _write_scans(tmp_path)
    assert main(["analyze", "human", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rmfast: error: human needs human scores") and "\n" not in err
    # exposure defaults to wordfreq's list now (issue 37 item 14); a frequency file that is not there is one line
    assert main(["analyze", "exposure", str(tmp_path), "--frequencies", str(tmp_path / "no-such-freq.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no-such-freq.csv" in err and "\n" not in err
    assert main(["analyze", "distributions", str(tmp_path / "missing")]) == 2
    assert main(["analyze", "agreement", str(tmp_path), "--table", "nope"]) == 2
    assert "choose one of" in capsys.readouterr().err
    assert main(["analyze", "distributions", str(tmp_path), "--models", "zz"]) == 2


def test_human_from_eloeverything_folder_as_input(tmp_path, capsys):
    df = pd.DataFrame({"elo_rank": [1, 2, 3, 4], "elo_score": [1600, 1500, 1400, 1300],
                       "name": ["Love", "Tea", "War", "Mud"], "elo_matches": 5,
                       "org/A": [4.0, 3.0, 1.0, 2.0], "org/B": [4.0, 3.0, 2.0, 1.0]})
    df.to_csv(tmp_path / "What is best.csv", index=False)
    out = tmp_path / "h.csv"
    assert main(["analyze", "human", str(tmp_path), "--out", str(out)]) == 0
    rho = pd.read_csv(out).set_index("model")["spearman_rho"]
    assert rho["org/B"] == pytest.approx(1.0) and rho["org/A"] == pytest.approx(0.8)


def _elo_folder(folder: Path) -> Path:
    folder.mkdir()
    pd.DataFrame({"elo_rank": [1, 2, 3, 4], "elo_score": [1600, 1500, 1400, 1300],
                  "name": ["Love", "Tea", "War", "Mud"], "elo_matches": 5,
                  "org/A": [4.0, 3.0, 1.0, 2.0], "org/B": [4.0, 3.0, 2.0, 1.0]}
                 ).to_csv(folder / "What is best.csv", index=False)
    return folder


def _item_scan(path: Path, model="me/my-rm", prompt="What is best?") -> Path:
    """An rmfast scan of text candidates (the items), as `rmfast scan --candidates` writes it."""
    from rmfast.scoring.results import TextScanResult

    texts = ["Love", "Tea", "War", "Mud", "Soup"]  # "Soup" has no human score
    TextScanResult(texts, np.array([1.0, 4.0, 3.0, 2.0, 0.0], dtype=np.float32),
                   np.ones(5, dtype=np.int64), [[i] for i in range(5)],
                   {"model": {"name": model}, "prompt": prompt}).to_parquet(path)
    return path


def test_human_says_where_the_model_scores_come_from(tmp_path, capsys):
    elo = _elo_folder(tmp_path / "elo")
    # the EloEverything CSVs alone: their stored model columns (the papers' scores) are the scores
    assert main(["analyze", "human", "--eloeverything", str(elo)]) == 0
    err = capsys.readouterr().err
    assert (f"rmfast: note: model scores: the 2 reward models' published scores stored in the "
            f"EloEverything CSVs in {elo} (paper A), not rmfast scans") in err
    assert f"rmfast: note: human scores: EloEverything Elo (column elo_score) in {elo}" in err
    # an rmfast scan of the items with the human Elo from the CSVs: only the scan is compared
    scan = _item_scan(tmp_path / "items.parquet")
    out = tmp_path / "h.csv"
    assert main(["analyze", "human", str(scan), "--eloeverything", str(elo), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert table["model"].tolist() == ["me/my-rm"] and table["n"].tolist() == [4]
    assert table["spearman_rho"].iloc[0] == pytest.approx(-0.2)  # ranks 4 1 2 3 against 1 2 3 4
    err = capsys.readouterr().err
    assert (f"rmfast: note: model scores: rmfast scans: {scan} (the model scores stored in the "
            "EloEverything CSVs are not used; the CSVs give the human Elo only)") in err
    # ... or with the human scores from any CSV (joined on the item text)
    items = tmp_path / "ratings.csv"
    pd.DataFrame({"item": ["Love", "Tea", "War", "Mud"], "rating": [4, 3, 2, 1]}).to_csv(items,
                                                                                      index=False)
    assert main(["analyze", "human", str(scan), "--human", str(items), "--human-item", "item",
                 "--human-score", "rating", "--out", str(out), "--overwrite"]) == 0
    assert pd.read_csv(out)["spearman_rho"].iloc[0] == pytest.approx(-0.2)
    assert (f"human scores: {items} (column rating, items in column item)"
            in capsys.readouterr().err)


def test_report_says_where_the_model_scores_come_from(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("statsmodels")
    elo = _elo_folder(tmp_path / "elo")
    scan = _item_scan(tmp_path / "items.parquet")
    for inputs, says in (([], "the 2 reward models' published scores stored in the EloEverything CSVs"),
                         ([str(scan)], f"rmfast scans: {scan}")):
        out = tmp_path / "r.html"
        assert main(["report", *inputs, "--eloeverything", str(elo), "--out", str(out),
                     "--n-perm", "20", "--overwrite"]) == 0
        html = out.read_text(encoding="utf-8")
        assert f"<b>Model scores:</b> {says}" in html.replace("&#x27;", "'")
        assert ("my-rm" in html) == bool(inputs)  # the scan replaces the CSVs' model scores


def test_help_is_for_users(capsys):
    """`rmfast analyze --help` shows what a user needs, not notes to the developers."""
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    assert "rmfast analyze" in out and "lead" not in out and ":func:" not in out and ":mod:" not in out
    assert "``" not in out


def test_analysis_tables_with_scores_say_what_score_is(tmp_path, capsys, shared_data):
    """Issue 51 item 5: a table `rmfast analyze --out` writes with a score column carries score_meaning (a column:
    CSV has no schema metadata), per model from its scans' manifests; published scores say so; tables without
    scores are as they were."""
    _write_scans(tmp_path)
    for f in tmp_path.glob("*.parquet.json"):  # A is a reward model, B and C were scanned with the logprob head
        man = json.loads(f.read_text())
        man["score_meaning"] = "reward" if man["model"]["name"] == "org/A-gemma" else "log p, nats"
        f.write_text(json.dumps(man))
    out = tmp_path / "ext.csv"
    assert main(["analyze", "extremes", str(tmp_path), "--k", "2", "--out", str(out)]) == 0
    t = pd.read_csv(out)
    assert (t["score_meaning"] == t["model"].map(lambda m: "reward" if m.startswith("org/A") else "log p, nats")).all()
    assert main(["analyze", "agreement", str(tmp_path), "--join", "id", "--out", str(tmp_path / "agree.csv")]) == 0
    assert "score_meaning" not in pd.read_csv(tmp_path / "agree.csv")
    out = tmp_path / "elo.csv"
    assert main(["analyze", "extremes", "--eloeverything", str(shared_data / "eloeverything"), "--k", "1",
                 "--out", str(out)]) == 0
    assert pd.read_csv(out)["score_meaning"].str.startswith("the reward model's score as published").all()
