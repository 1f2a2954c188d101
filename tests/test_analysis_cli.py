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
                             "best-worst", "human", "categories", "extremes"}


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
    assert main(["analyze", "exposure", str(tmp_path)]) == 2
    assert "--frequencies" in capsys.readouterr().err
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
