"""The analyses misused as a hurried researcher does (a walkthrough of docs/paper_methods*.md, 2026-11-29): each
mismatch is one line or a note naming it, never a statistic computed on what the user did not mean."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli_run import one_line_error, run
from rmfast.analysis.data.lexicons import load_dictionary
from rmfast.analysis.data.scans import load_scans
from rmfast.analysis.paper_a.best_worst import best_worst
from rmfast.analysis.paper_b.categories import categories
from rmfast.errors import UserError

BEST, WORST = "What is the best thing?", "What is the worst thing?"
WORDS = ["kind", "warm", "fair", "loyal", "brave", "bold", "able", "smart", "table", "chair", "lamp", "door"]


def _write(path: Path, prompt: str, ids, *, head="score", seed=0):
    rng = np.random.default_rng(seed + len(str(path)))
    df = pd.DataFrame({"token_id": np.asarray(ids, dtype="int64"), "token": [f"t{i}" for i in ids],
                       "text": [WORDS[i % len(WORDS)] + str(i // len(WORDS) or "") for i in ids],
                       "score": rng.normal(size=len(ids))})
    df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
    df.to_parquet(path)
    model = {"name": "m", **({"random_head_seed": seed} if head == "score" else {})}
    Path(str(path) + ".json").write_text(json.dumps({"model": model, "prompt": prompt, "head": head}))
    return path


def test_best_and_worst_scans_of_other_heads_are_other_models(tmp_path):
    """A log-prob "best" scan and a reward head's "worst" scan were paired as one model (the variant labels were given
    within one prompt only): now each keeps its head in its name under every prompt, and nothing is paired."""
    lp = _write(tmp_path / "lp.parquet", BEST, range(40), head="logprob")
    worst = _write(tmp_path / "worst.parquet", WORST, range(40))
    df = load_scans([lp, worst])
    assert set(df["model"]) == {"m [logprob]", "m [score, random_head_seed=0]"}, set(df["model"])
    with pytest.raises(UserError, match=r"no model has both .* are other models"):
        best_worst(df)
    same = load_scans([_write(tmp_path / "best.parquet", BEST, range(40)), worst])
    assert set(same["model"]) == {"m"} and len(best_worst(same).correlations) == 1


def test_best_and_worst_scans_of_no_common_token_are_one_line(tmp_path):
    df = load_scans([_write(tmp_path / "b.parquet", BEST, range(0, 30)),
                     _write(tmp_path / "w.parquet", WORST, range(30, 60))])
    with pytest.raises(UserError, match=r"scans share no token .* scan the same token_ids"):
        best_worst(df)  # was ValueError: No objects to concatenate
    two = load_scans([_write(tmp_path / "b2.parquet", BEST, range(2)), _write(tmp_path / "w2.parquet", WORST, range(2))])
    res = best_worst(two, standardize=False)
    assert any("too few for a correlation" in n for n in res.notes), res.notes


def _dict_scans(models=("a", "b")):
    rng = np.random.default_rng(1)
    return pd.concat([pd.DataFrame({"model": m, "prompt": p, "text": WORDS, "score": rng.normal(size=len(WORDS))})
                      for m in models for p in (BEST, WORST)], ignore_index=True)


def test_a_dictionary_that_matches_few_or_none_of_the_words_says_so():
    scans = _dict_scans()
    many = [f"w{i}" for i in range(40)]
    dic = pd.DataFrame({"term": ["kind", "warm"] + many, "category": ["C", "C"] + ["A"] * 40, "wildcard": False})
    res = categories(scans, dic, mixed=False, n_perm=20)
    assert any("category A: 0 of its 40 dictionary words" in n for n in res.notes), res.notes
    assert any("category C: 2 of its 2 dictionary words are in the scans" in n for n in res.notes), res.notes
    none = pd.DataFrame({"term": many, "category": "A", "wildcard": False})
    with pytest.raises(UserError, match="no scored text is a word of the dictionary"):  # was an empty table, exit 0
        categories(scans, none, mixed=False, n_perm=20)


def test_a_long_dictionary_whose_category_column_has_another_name_is_refused(tmp_path):
    """Read as wide, 'word,cat' made every word one category named 'cat'."""
    (tmp_path / "d.csv").write_text("word,cat\nkind,Communion\nbold,Agency\n")
    with pytest.raises(UserError, match=r"column 'cat' holds labels \('Agency', 'Communion'\).*rename 'cat' to category"):
        load_dictionary(tmp_path / "d.csv")
    (tmp_path / "w.csv").write_text("DicTerm,Agency,Communion\nbold,X,\nkind,,x\nable,1,\n")  # marks: still wide
    assert sorted(load_dictionary(tmp_path / "w.csv")["category"]) == ["Agency", "Agency", "Communion"]


def test_the_output_of_an_analysis_never_replaces_its_input(tmp_path, capsys):
    scan = _write(tmp_path / "s.parquet", BEST, range(30))
    before = scan.read_bytes()
    rc, _, err = run(["analyze", "distributions", scan, "--out", scan, "--overwrite"], capsys)
    assert one_line_error(rc, err) and "is the input this command reads" in err, err
    assert scan.read_bytes() == before


def test_too_few_permutations_to_reach_significance_are_said():
    res = categories(_dict_scans("abcd"), pd.DataFrame({"term": WORDS[:6], "category": ["C"] * 3 + ["A"] * 3,
                                                        "wildcard": False}),
                     group_by={"a": "G1", "b": "G1", "c": "G2", "d": "G2"}, mixed=False, n_perm=1)
    assert any("no test here can reach p < .05" in n for n in res.notes), res.notes
