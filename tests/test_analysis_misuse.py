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
    # a random head is said even alone (a new user's walk: analyze's tables showed it as any model's ranking)
    with pytest.warns(UserWarning, match=r"m: a RANDOM score head \(--random-head-seed 0\): its scores are no reward"):
        load_scans([worst])


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


def test_what_reading_a_dictionary_leaves_out_or_counts_twice_is_said(tmp_path):
    """Blank rows, repeated rows and a term under two categories were taken silently."""
    (tmp_path / "d.csv").write_text("term,category\nkind,C\n,C\nwarm,\nkind,C\nbold,A\nbold,C\nable,A\n")
    dic = load_dictionary(tmp_path / "d.csv")
    assert sorted(map(tuple, dic[["term", "category"]].values)) == [("able", "A"), ("bold", "A"), ("bold", "C"),
                                                                   ("kind", "C")]
    res = categories(_dict_scans(), tmp_path / "d.csv", mixed=False, n_perm=20)
    notes = "\n".join(res.notes)
    assert "d.csv: 2 row(s) without a term or a category left out" in notes, notes
    assert "d.csv: 1 repeated term-category row(s) counted once" in notes, notes
    assert "1 dictionary term(s) are in two or more categories (e.g. 'bold': A, C)" in notes, notes


def test_a_small_n_perm_still_enumerates_every_relabelling():
    """--n-perm 5 drew 5 random relabellings where all 10 (5 models, 2 vs 3) can be enumerated: now exact."""
    from rmfast.analysis.stats.permutation import permutation_test

    v = np.array([1.0, 1.2, 3.0, 3.1, 2.9])
    r = permutation_test(v, np.array([1, 1, 0, 0, 0], bool), n_perm=5)
    assert r["exact"] and r["n_perm"] == 10 and r["p_value"] == pytest.approx(0.1)  # the observed split alone
    big = permutation_test(np.arange(30.0), np.arange(30) < 15, n_perm=5)  # C(30, 15) ~ 1.6e8: drawn
    assert not big["exact"] and big["n_perm"] == 5


def test_a_p_value_that_underflows_to_zero_is_said_to_be_below_the_floor():
    from rmfast.analysis.paper_a.human import human_comparison

    n = 3000
    x = np.arange(n, dtype=float)
    human = pd.DataFrame({"text": [f"item{i}" for i in range(n)], "human_score": x})
    scans = pd.DataFrame({"model": "m", "prompt": BEST, "text": human["text"],
                          "score": x + np.random.default_rng(0).normal(scale=n / 20, size=n)})
    res = human_comparison(scans, human, k=3)
    assert (res.correlations[["spearman_p", "kendall_p"]] == 0).all(axis=None)
    assert any("2 p-value(s) printed as 0 are below ~1e-308" in s for s in res.notes), res.notes
    weak = scans.assign(score=np.random.default_rng(1).normal(size=n))
    assert not any("below ~1e-308" in s for s in human_comparison(weak, human, k=3).notes)
