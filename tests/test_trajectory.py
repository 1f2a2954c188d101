"""The trajectory analysis: planted answers on tiny synthetic runs, the CLI, and paper B's
published checkpoint ranks (Fig. 4's shape; skipped when ``../shared/data`` is absent)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rmfast.analysis.paper_b.trajectory import (from_scans, load_trajectory_inputs, step_of, trajectory,
                                        write_trajectory)
from rmfast.cli import main

from conftest import SHARED_DATA

TRAIN = SHARED_DATA / "iclr2026" / "reward_model_training"
real = pytest.mark.skipif(not TRAIN.is_dir(), reason=f"shared data absent ({TRAIN})")

WORDS = ["power", "skill", "drive", "love", "care", "trust"]  # 3 Agency, 3 Communion
DIC = pd.DataFrame({"term": WORDS, "category": ["Agency"] * 3 + ["Communion"] * 3})


def _planted() -> pd.DataFrame:
    """Two runs over steps 0, 10, 20. 'llama': Agency words climb from the bottom to the top;
    'gemma': Communion words stay on top. Token 'care' goes from rank 1 to 6 in the llama run."""
    rows = []
    orders = {  # best first, per step
        "llama": {0: ["care", "love", "trust", "power", "skill", "drive"],
                  10: ["love", "power", "trust", "skill", "drive", "care"],
                  20: ["power", "skill", "drive", "love", "trust", "care"]},
        "gemma": {s: ["love", "care", "trust", "power", "skill", "drive"] for s in (0, 10, 20)},
    }
    for run, by_step in orders.items():
        for step, order in by_step.items():
            for i, w in enumerate(order):
                rows.append({"run": run, "base": run.capitalize(), "step": step, "token": w,
                             "score": float(len(order) - i)})
    return pd.DataFrame(rows)


def test_planted_category_medians_gaps_and_changes():
    r = trajectory(_planted(), DIC, k=2)
    cat = r.categories.set_index(["run", "step", "category"])["median_rank"]
    assert cat[("llama", 0, "Agency")] == 5.0 and cat[("llama", 20, "Agency")] == 2.0
    assert cat[("gemma", 10, "Communion")] == 2.0
    assert r.categories["sum_rank"].groupby([r.categories["run"], r.categories["step"]]).sum().eq(21).all()
    gap = r.gaps.set_index(["run", "step"])["median_rank_b_minus_a"]  # Communion minus Agency
    assert gap[("llama", 0)] == -3.0 and gap[("llama", 20)] == 3.0 and gap[("gemma", 20)] == -3.0
    ch = r.changes[r.changes["run"] == "llama"].set_index("token")
    assert ch.loc["care", "change"] == -5.0 and ch.loc["power", "change"] == 3.0
    assert ch.loc["care", "category"] == "Communion"
    assert r.changes[r.changes["run"] == "gemma"]["change"].eq(0).all()


def test_a_category_column_ranks_among_all_tokens_and_says_so():
    """Categories from the input's own column rank each token among all the step's tokens (uncategorised ones too)
    and keep spelling variants apart, where a dictionary ranks its words among themselves, variants averaged: the
    two paths' medians differ (a referee's case: 9.0 against 4.5), so the result says which it used."""
    t = _planted()
    extra = t[t["token"] == "love"].assign(token="Love", score=lambda d: d["score"] - 0.5)  # a spelling variant
    t = pd.concat([t, extra, t[t["token"] == "care"].assign(token="zzz", score=-1.0)], ignore_index=True)
    t["category"] = t["token"].str.lower().map(dict(zip(DIC["term"], DIC["category"])))  # "zzz": none
    by_col = trajectory(t)
    by_dic = trajectory(t.drop(columns="category"), DIC)
    col = by_col.categories.set_index(["run", "step", "category"])["median_rank"]
    dic = by_dic.categories.set_index(["run", "step", "category"])["median_rank"]
    # step 0 of gemma, best first: love, Love, care, trust, power, skill, drive, zzz. The column: Communion's 4 tokens
    # ranks 1-4, Agency's 5-7 (zzz, uncategorised, 8th); the dictionary: 6 words (love and Love one), ranks 1-6
    assert (col[("gemma", 0, "Communion")], col[("gemma", 0, "Agency")]) == (2.5, 6.0)
    assert (dic[("gemma", 0, "Communion")], dic[("gemma", 0, "Agency")]) == (2.0, 5.0)
    assert any("category column" in n and "different scales" in n for n in by_col.notes)
    assert not any("category column" in n for n in by_dic.notes)


def test_planted_extremes_and_correlation_with_final():
    r = trajectory(_planted(), DIC, k=2)
    ex = r.extremes
    top = ex[(ex["run"] == "llama") & (ex["step"] == 20) & (ex["end"] == "top")]
    assert top["token"].tolist() == ["power", "skill"]
    bottom = ex[(ex["run"] == "llama") & (ex["step"] == 0) & (ex["end"] == "bottom")]
    assert bottom["token"].tolist() == ["drive", "skill"]  # worst first
    fc = r.final_corr.set_index(["run", "step"])["spearman"]
    assert fc[("llama", 20)] == pytest.approx(1.0) and fc[("gemma", 0)] == pytest.approx(1.0)
    # llama step 0 vs 20: ranks (1..6 for care, love, trust, power, skill, drive) vs
    # (6, 4, 5, 1, 2, 3): Spearman of these two orderings
    expect = np.corrcoef([1, 2, 3, 4, 5, 6], [6, 4, 5, 1, 2, 3])[0, 1]
    assert fc[("llama", 0)] == pytest.approx(expect)


def test_dictionary_variants_are_averaged_and_other_tokens_dropped():
    d = pd.DataFrame({"step": 1, "token": [" Love", "love", "care", "zebra"],
                      "score": [4.0, 0.0, 1.0, 9.0]})
    dic = pd.DataFrame({"term": ["love", "care"], "category": ["C", "C"]})
    r = trajectory(d, dic)
    assert r.dropped["rows"].sum() == 1  # zebra
    ranks = r.changes.set_index("token")["rank_first"]
    assert ranks["love"] == 1.0 and ranks["care"] == 2.0  # love = mean(4, 0) = 2 > 1
    # the token tables read the dictionary's words only: said (final_corr over 30 of 2,691 tokens had been silent)
    assert any("the token tables (extremes, final_corr, changes) read its 2 words found, ranked among themselves, "
               "not the 4 tokens scanned" in n for n in r.notes), r.notes


def test_rank_input_and_category_level_input():
    d = _planted().drop(columns="score")
    d["rank"] = d.groupby(["run", "step"]).cumcount() + 1
    a = trajectory(_planted(), DIC).categories
    b = trajectory(d, DIC).categories
    assert a["median_rank"].tolist() == b["median_rank"].tolist()
    lvl = a[["run", "base", "step", "category", "median_rank"]]
    r = trajectory(lvl)
    assert r.categories["median_rank"].tolist() == a.sort_values(
        ["run", "base", "category", "step"])["median_rank"].tolist()
    assert r.extremes.empty and any("category-level" in n for n in r.notes)


def test_steps_from_checkpoint_names_and_scan_frames():
    assert step_of("out/checkpoint-250") == 250 and step_of("m_step_3") == 3
    s = _planted().rename(columns={"token": "text"})
    s["model"] = "rm-" + s["run"] + "/checkpoint-" + s["step"].astype(str)
    s["prompt"] = "Best?"
    t = from_scans(s.drop(columns=["step", "run"]))
    assert sorted(t["step"].unique()) == [0, 10, 20]
    assert set(t["run"]) == {"rm-llama | Best?", "rm-gemma | Best?"}
    assert len(trajectory(t, DIC).categories) == 2 * 3 * 2


def test_candidate_sets_of_a_store_are_trajectories_apart_and_mixed_scores_are_noted():
    """A store's two candidate sets were pooled into one trajectory, a word in both averaged over both (the sweep
    walk: a Communion-Agency gap of 3.0 where the set alone gave 9.5); each set is its own run now, --pool-candidates
    pools them, said either way. A run whose checkpoints' scores mean different things is noted."""
    from rmfast.analysis.data.ledger import Ledger
    from rmfast.analysis.data.scans import MEANING_ATTR

    s = _planted().rename(columns={"token": "text"})
    s = s[s["run"] == "llama"]
    s["model"] = "rm/checkpoint-" + s["step"].astype(str)
    s["prompt"] = "Best?"
    words = s.assign(candidates="big2")
    other = s.assign(candidates="vocab", score=-s["score"])  # the same texts, ordered the other way
    both = pd.concat([words, other], ignore_index=True).drop(columns=["step", "run"])
    ledger = Ledger()
    t = from_scans(both, ledger=ledger)
    assert set(t["run"]) == {"rm | Best? | big2", "rm | Best? | vocab"}
    assert any("each set's trajectory apart" in n for n in ledger.notes)
    apart = trajectory(t, DIC).categories.set_index(["run", "step", "category"])["median_rank"]
    alone = trajectory(from_scans(words.drop(columns=["step", "run"])), DIC).categories
    np.testing.assert_array_equal(apart.loc["rm | Best? | big2"].to_numpy(), alone["median_rank"].to_numpy())
    ledger = Ledger()
    pooled = from_scans(both, pool=True, ledger=ledger)
    assert set(pooled["run"]) == {"rm | Best?"} and any("pooled" in n for n in ledger.notes)
    mixed = both[both["candidates"] == "big2"].copy()
    mixed.attrs[MEANING_ATTR] = {"rm/checkpoint-0": "log p(response | prompt)", "rm/checkpoint-10": "reward",
                                 "rm/checkpoint-20": "reward"}
    ledger = Ledger()
    from_scans(mixed, ledger=ledger)
    assert any("not one quantity" in n for n in ledger.notes), ledger.notes


def test_write_and_cli(tmp_path, capsys):
    csv = tmp_path / "traj.csv"
    _planted().to_csv(csv, index=False)
    files = write_trajectory(trajectory(load_trajectory_inputs([csv]), DIC), tmp_path / "a")
    assert "trajectory_changes.png" in files and (tmp_path / "a" / "trajectory_gaps.csv").exists()
    dic = tmp_path / "dic.csv"
    DIC.rename(columns={"term": "token_decoded", "category": "Category"}).to_csv(dic, index=False)
    out = tmp_path / "b"
    assert main(["analyze", "trajectory", str(csv), "--dictionary", str(dic), "--out", str(out)]) == 0
    got = pd.read_csv(out / "trajectory_changes.csv")
    assert sorted(got.loc[got["token"] == "care", "change"]) == [-5.0, 0.0]
    assert main(["analyze", "trajectory", str(csv)]) == 2  # no --out
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"token": ["a"], "score": [1.0]}).to_csv(bad, index=False)
    assert main(["analyze", "trajectory", str(bad), "--out", str(out), "--overwrite"]) == 2
    assert "step" in capsys.readouterr().err
    # a folder holding another trajectory: refused, or replaced whole with --overwrite (a second run into it had
    # replaced some files and left the others from the first beside them)
    assert main(["analyze", "trajectory", str(csv), "--out", str(out)]) == 2
    assert "already holds a trajectory" in capsys.readouterr().err
    before = {f.name for f in out.glob("trajectory_*")}
    assert main(["analyze", "trajectory", str(csv), "--out", str(out), "--overwrite"]) == 0  # no --dictionary now
    after = {f.name for f in out.glob("trajectory_*")}
    assert "trajectory_categories.csv" in before and "trajectory_categories.csv" not in after and after < before
    # a user's own trajectory_* file or folder there is theirs: kept, and no crash (a folder had raised
    # IsADirectoryError after the new files were written; a notes file was deleted)
    (out / "trajectory_backup").mkdir()
    (out / "trajectory_notes.txt").write_text("mine")
    assert main(["analyze", "trajectory", str(csv), "--dictionary", str(dic), "--out", str(out), "--overwrite"]) == 0
    assert (out / "trajectory_notes.txt").read_text() == "mine" and (out / "trajectory_backup").is_dir()


@real
def test_published_checkpoint_ranks_reproduce_fig4_shape():
    """Fig. 4 from the authors' CSVs: the analysis equals a direct read of the files, and the
    Gemma/Llama contrast (Llama ranks Agency higher, Gemma Communion) holds at every checkpoint
    of the Fig. 4a run and at the final checkpoint of most data sizes."""
    from rmfast.analysis.paper_b.reproduce import fig4_shape

    r = trajectory(load_trajectory_inputs([TRAIN]))
    raw = pd.concat([pd.read_csv(f).assign(run=f.stem.removeprefix("rank_results_"))
                     for f in sorted(TRAIN.glob("rank_results_*.csv"))])
    raw = raw.drop_duplicates(["run", "model_id", "Category", "checkpoint"])
    got = r.categories.merge(raw, left_on=["run", "model_id", "category", "step"],
                             right_on=["run", "model_id", "Category", "checkpoint"])
    assert len(got) == len(r.categories) == len(raw)
    assert (got["median_rank"] == got["sum_value"]).all()
    shape = fig4_shape(r.categories)
    assert set(shape["run"]) == set(raw["run"])
    sky = shape[shape["run"] == "sky_80k"]
    assert len(sky) == 10 and sky["holds"].all()
    final = shape.sort_values("step").groupby("run").last()
    assert final["holds"].sum() > len(final) / 2
    # the per-category comparison is what the columns say, computed from the raw file
    last = raw[raw["run"] == "sky_80k"]
    last = last[last["checkpoint"] == last["checkpoint"].max()]
    val = {(b, c): v for b, c, v in zip(last["base_model"], last["Category"], last["sum_value"])}
    assert val[("Llama", "Agency")] < val[("Gemma", "Agency")]
    assert val[("Gemma", "Communion")] < val[("Llama", "Communion")]


def test_a_dictionary_that_matches_no_candidate_is_one_line(tmp_path, capsys):
    """A vocabulary x-ray given a nouns dictionary (a walkthrough's slip) matched nothing: exit 0, one file of
    dropped rows and no table; now a one-line error naming it (the library still returns the empty tables: the
    training callback's summary of such an x-ray has no gaps, and training goes on)."""
    d = pd.DataFrame({"step": [1, 1, 2, 2], "token": ["ators", "vel"] * 2, "score": [1.0, 2.0, 2.0, 1.0]})
    d.to_csv(tmp_path / "t.csv", index=False)
    pd.DataFrame({"term": ["kind", "bold"], "category": ["C", "A"]}).to_csv(tmp_path / "dic.csv", index=False)
    argv = ["analyze", "trajectory", str(tmp_path / "t.csv"), "--dictionary", str(tmp_path / "dic.csv"), "--out",
            str(tmp_path / "traj")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "none of the 2 candidates is a word of --dictionary" in err and "(e.g. 'ators', 'vel')" in err, err
    assert not (tmp_path / "traj").exists() or not list((tmp_path / "traj").iterdir())
    assert main(argv[:3] + argv[5:]) == 0  # without it: the token tables


def test_ids_sharing_a_decoded_text_are_kept_apart():
    """300 ids of a vocabulary scan became 188 'tokens': ids decoding to one text (byte pieces, '\ufffd') were averaged
    into one row of every token table. They are kept apart by id (with a note); a dictionary still matches by text."""
    d = pd.DataFrame({"step": [1] * 4 + [2] * 4, "token": ["\ufffd", "\ufffd", "a", "b"] * 2,
                      "token_id": [7, 8, 1, 2] * 2, "score": [4.0, 1.0, 3.0, 2.0, 1.0, 4.0, 3.0, 2.0]})
    r = trajectory(d, k=2)
    ch = r.changes.set_index("token")
    assert set(ch.index) == {"\ufffd [id 7]", "\ufffd [id 8]", "a", "b"}
    assert ch.loc["\ufffd [id 7]", "change"] == -3.0 and ch.loc["\ufffd [id 8]", "change"] == 3.0
    assert r.final_corr["n_tokens"].tolist() == [4, 4] and any("kept apart" in n for n in r.notes)
    # one label across the run's steps: id 7 alone at step 2 is still '\ufffd [id 7]' (it had dropped out of changes)
    d2 = d[~((d["step"] == 2) & (d["token_id"] == 8))]
    ch2 = trajectory(d2, k=2).changes.set_index("token")
    assert "\ufffd [id 7]" in ch2.index and ch2.loc["\ufffd [id 7]", "change"] == -2.0



@real
def test_the_published_sum_value_is_said_to_be_read_as_a_median():
    """The files call the column sum_value; rmfast reads it as the median rank (the authors' script computes a median):
    said in a note, where the rename had been silent (the data's README calls it a sum; a new user's walk)."""
    from rmfast.analysis.data.ledger import Ledger
    from rmfast.analysis.paper_b.published import load_checkpoint_ranks

    ledger = Ledger()
    load_checkpoint_ranks(TRAIN, ledger=ledger)
    assert any("sum_value is read as the category's MEDIAN rank" in n for n in ledger.notes)
