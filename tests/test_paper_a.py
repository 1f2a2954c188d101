"""Paper A's statistics (method="paper") beside rmfast's: planted answers worked out by hand,
and the published EloEverything data (skipped when ../shared/data is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy.stats")

from rmfast.analysis import agreement, exposure, human_comparison, sentiment
from rmfast.analysis.data.lexicons import load_bnc_rows
from rmfast.analysis.render.plots import significance
from rmfast.analysis.paper_a.prompt_agreement import prompt_agreement
from rmfast.analysis.stats.rank_stats import footrule, ndcg
from rmfast.analysis.stats.rbo import paper_ranking, rbo_truncated
from rmfast.errors import UserError

SHARED = Path(os.environ.get("RMFAST_SHARED_DATA",
                             Path(__file__).resolve().parents[1].parent / "shared" / "data"))
ELO = SHARED / "eloeverything"
real = pytest.mark.skipif(not ELO.is_dir(), reason=f"shared data absent ({ELO})")


# ------------------------------------------------------------------ human rank gaps
def _human_planted():
    # items in CSV order x, y, z, w; human Elo ranks x=1, y=2, z=3, w=4
    human = pd.DataFrame({"text": list("xyzw"), "human_score": [4.0, 3, 2, 1]})
    scores = {"m1": [1.0, 4, 3, 2], "m2": [1.0, 3, 4, 2]}  # model ranks: x=4 in both
    scans = pd.concat([pd.DataFrame({"model": m, "prompt": "p", "text": list("xyzw"),
                                     "score": s}) for m, s in scores.items()])
    return scans, human


def test_paper_rank_gap_is_median_with_the_human_rank():
    scans, human = _human_planted()
    paper = human_comparison(scans, human, k=4, method="paper").ranks.set_index("text")
    # x: ranks (human 1, m1 4, m2 4) → median 4, gap 3; y: (2, 1, 2) → 2, gap 0;
    # z: (3, 2, 1) → 2, gap −1; w: (4, 3, 3) → 3, gap −1
    assert paper["model_rank"].to_dict() == {"x": 4.0, "y": 2.0, "z": 2.0, "w": 3.0}
    assert paper["rank_diff"].to_dict() == {"x": 3.0, "y": 0.0, "z": -1.0, "w": -1.0}
    ours = human_comparison(scans, human, k=4).ranks.set_index("text")
    # means x 4, y 1.5, z 1.5, w 3 → re-ranked 4, 1.5, 1.5, 3
    assert ours["model_rank"].to_dict() == {"x": 4.0, "y": 1.5, "z": 1.5, "w": 3.0}


def test_paper_rank_gap_ties_keep_the_csv_order():
    scans, human = _human_planted()
    d = human_comparison(scans, human, k=2, method="paper").differences
    low = d[d["direction"] == "models rank higher"]
    assert list(low["text"]) == ["z", "w"]  # both −1: nsmallest keeps the CSV's first (z)
    with pytest.raises(UserError, match="unknown method"):
        human_comparison(scans, human, method="authors")


def test_each_direction_lists_only_items_of_its_own_sign(recwarn):
    """With k past half the items, "humans rank higher" ran on into items the models rank higher (rank_diff < 0),
    under the wrong label; each list now holds its own sign only, a note saying when fewer than k qualify."""
    scans, human = _human_planted()  # gaps (paper): x +3, y 0, z -1, w -1
    for method in ("paper", "rmfast"):
        res = human_comparison(scans, human, k=4, method=method)
        d = res.differences
        up, down = d[d["direction"] == "humans rank higher"], d[d["direction"] == "models rank higher"]
        assert (up["rank_diff"] > 0).all() and (down["rank_diff"] < 0).all(), d
        assert list(up["text"]) == ["x"] and set(down["text"]) <= {"z", "w", "y"} and "y" not in set(up["text"])
        assert any("fewer than k = 4" in n for n in res.notes), res.notes


# ------------------------------------------------------------------ AFINN / BNC joins
def test_paper_sentiment_join_does_not_strip_and_counts_zero_as_negative():
    lex = pd.DataFrame({"word": ["good", "nice", "great", "bad", "awful", "meh"],
                        "valence": [1, 2, 3, -1, -3, 0]})
    text = [" good", "good", "nice", "great", "bad", "awful", "meh"]
    score = [9.0, 1.0, 2.0, 3.0, -1.0, -3.0, 0.0]  # " good" would break the slope if matched
    d = pd.DataFrame({"model": "m", "prompt": "best?", "text": text, "score": score})
    paper = sentiment(d, lex, method="paper", min_words=2).slopes.set_index("sign")
    assert paper.loc["positive", "n"] == 3 and paper.loc["positive", "slope"] == pytest.approx(1.0)
    # negatives: bad (−1, −1), awful (−3, −3) and meh (0, 0): slope exactly 1 on raw scores
    assert paper.loc["negative", "n"] == 3 and paper.loc["negative", "slope"] == pytest.approx(1.0)
    ours = sentiment(d, lex, standardize=False, min_words=2).slopes.set_index("sign")
    # rmfast strips: " good" and "good" are one word, fitted once at their mean score (5), not as two observations
    assert ours.loc["positive", "n"] == ours.loc["positive", "n_words"] == 3 and ours.loc["negative", "n"] == 2
    assert ours.loc["positive", "slope"] == pytest.approx(np.polyfit([1, 2, 3], [5.0, 2.0, 3.0], 1)[0])


BNC = ("\tWord\tPoS\t\tFreq\tRa\tDisp\n"
       "\tlove\tNoC\t%\t150\t99\t0.92\n\t@\t@\tlove\t148\t99\t0.92\n\t@\t@\tloves\t2\t50\t0.9\n"
       "\tlove\tVerb\t%\t100\t99\t0.91\n\t@\t@\tloved\t60\t99\t0.9\n"
       "\thate\tVerb\t:\t30\t99\t0.9\n\tbad\tAdj\t:\t98#\t100\t0.95#\n\tgood\tAdj\t:\t400\t99\t0.9\n")


def test_bnc_rows_as_r_reads_them(tmp_path):
    p = tmp_path / "bnc.txt"
    p.write_text(BNC)
    rows = load_bnc_rows(p)
    assert rows[rows["word"] == "love"]["frequency"].tolist() == [150.0, 100.0]
    assert np.isnan(rows.loc[rows["word"] == "bad", "frequency"].item())  # "98#" is NA in R


def test_paper_exposure_fits_one_row_per_lemma_and_pos(tmp_path):
    p = tmp_path / "bnc.txt"
    p.write_text(BNC)
    lex = pd.DataFrame({"word": ["love", "hate", "bad", "good"], "valence": [3, -3, -3, 3]})
    text = ["love", "hate", "bad", "good", " good"]
    # planted: score = 2·ln(freq) + valence on the paper's rows (love twice: 150 and 100)
    d = pd.DataFrame({"model": "m", "prompt": "best?", "text": text,
                      "score": [0.0, 2 * np.log(30) - 3, 0.0, 2 * np.log(400) + 3, 0.0]})
    love = pd.DataFrame({"model": "m", "prompt": "best?", "text": ["love"], "score": [0.0]})
    res = exposure(pd.concat([d, love]), p, lex, method="paper", min_words=2)
    # paper: love's two lemma rows (NoC 150, Verb 100) × its 2 copies, hate, good; bad is NA
    assert sorted(res.tokens["text"]) == ["good", "hate"] + ["love"] * 4
    assert sorted(res.tokens.loc[res.tokens["text"] == "love", "frequency"]) == [100, 100, 150, 150]
    ours = exposure(pd.concat([d, love]), p, lex, min_words=2, standardize=False).tokens
    # rmfast: the form "love" (148) once per copy, bad's flagged 98 kept, " good" stripped
    assert sorted(ours["text"]) == [" good", "bad", "good", "hate", "love", "love"]
    assert set(ours.loc[ours["text"] == "love", "frequency"]) == {148.0}
    with pytest.raises(UserError, match="AFINN first"):
        exposure(d, p, lex, method="paper", missing_valence="zero")


def test_paper_exposure_slope_recovered(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    freq = np.exp(rng.normal(3, 1, 40)).round()
    val = rng.integers(-4, 5, 40)
    (tmp_path / "b.txt").write_text("\tWord\tPoS\t\tFreq\tRa\tDisp\n" + "".join(
        f"\t{w}\tNoC\t:\t{int(f)}\t1\t1\n" for w, f in zip(words, freq)))
    lex = pd.DataFrame({"word": words, "valence": val})
    d = pd.DataFrame({"model": "m", "prompt": "p", "text": [w.upper() for w in words],
                      "score": 0.5 * np.log(freq) - 0.25 * val + 1})
    s = exposure(d, tmp_path / "b.txt", lex, method="paper").slopes.iloc[0]
    assert s["slope_log_freq"] == pytest.approx(0.5) and s["slope_valence"] == pytest.approx(-0.25)


# ------------------------------------------------------------------ RBO, footrule, NDCG
def test_rbo_truncated_planted():
    # depth 2: d=1 {a}∩{b}=0; d=2 {a,b}∩{b,a}=2 → (1−p)·p·2/2 = 0.09 at p = 0.9
    assert rbo_truncated(["a", "b"], ["b", "a"]) == pytest.approx(0.09)
    items = list(range(500))  # identical long lists: 1 − 0.9^132 (depth 132, no extrapolation)
    assert rbo_truncated(items, items) == pytest.approx(1 - 0.9**132)
    assert paper_ranking([2.0, 5.0, 1.0], ["x", "y", "z"]) == ["y", "x", "z"]


def test_footrule_and_ndcg_planted():
    assert footrule([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == 0.0  # D = 12 = ⌊25/2⌋
    assert footrule([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], method="paper") == pytest.approx(0.04)
    true = np.array([1.0, 0.0, 2.0])  # the paper's gains 2^s − 1: 1, 0, 3
    # pred orders items 1, 0, 2: DCG = 0 + 1/log2(3) + 3/2 ; ideal 3 + 1/log2(3)
    want = (1 / np.log2(3) + 1.5) / (3 + 1 / np.log2(3))
    assert ndcg(true, [2.0, 3.0, 1.0], method="paper") == pytest.approx(want)
    # rmfast's gains: the scores min-max scaled first (0.5, 0, 1 -> 2^g − 1 = √2 − 1, 0, 1)
    g = np.sqrt(2) - 1
    assert ndcg(true, [2.0, 3.0, 1.0]) == pytest.approx((g / np.log2(3) + 0.5) / (1 + g / np.log2(3)))
    # reward scores below zero (most RMs' on EloEverything): the paper's gains are negative, its ideal DCG <= 0 and
    # NDCG undefined (NaN, issue 52 §2; the paper's code said 0.0); rmfast's read the order whatever the scale
    neg = [-1.0, -2.0, -3.0, -4.0]
    assert np.isnan(ndcg(neg, neg, method="paper")) and np.isnan(ndcg(neg, neg[::-1], method="paper"))
    assert ndcg(neg, neg) == 1.0 > ndcg(neg, neg[::-1]) and ndcg(neg, neg) == ndcg([x * 7 + 3 for x in neg], neg)
    assert np.isnan(ndcg([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))  # no order to recover
    # k=1 with pred's best = item 2 (gain 3): rmfast's ideal is 3 → 1; the paper's ideal
    # takes the first row only (gain 1) → 3
    assert ndcg(true, [0.0, 1.0, 5.0], k=1) == 1.0
    assert ndcg(true, [0.0, 1.0, 5.0], k=1, method="paper") == pytest.approx(3.0)


def test_ndcg_undefined_is_nan_ties_are_deterministic_and_baselines_give_the_scale():
    """Issue 52 §2: the paper's raw-gain NDCG is undefined where the ideal DCG <= 0 (never 0.0); ties in the
    order are broken deterministically (rmfast: the gains averaged over each tied run, so the input order does not
    move the value); a random and a reversed order on the same scores are the scale NDCG is read against."""
    from rmfast.analysis.stats.rank_stats import ndcg_baselines

    mixed = np.array([-3.0, 0.5, -2.0, -1.0])  # paper gains 2^s − 1: ideal DCG < 0
    assert np.isnan(ndcg(mixed, mixed, method="paper"))
    true, pred = np.array([1.0, 0.0, 0.5, 0.2]), np.array([1.0, 1.0, 0.0, 0.0])
    perm = np.array([1, 0, 3, 2])  # the same items, tied pairs swapped in input order
    assert ndcg(true, pred) == pytest.approx(ndcg(true[perm], pred[perm]), abs=1e-15)
    g = 2.0 ** true - 1
    disc = 1 / np.log2(np.arange(2, 6))
    want = ((g[0] + g[1]) / 2 * (disc[0] + disc[1]) + (g[2] + g[3]) / 2 * (disc[2] + disc[3])) / np.sum(
        np.sort(g)[::-1] * disc)
    assert ndcg(true, pred) == pytest.approx(want)
    rng = np.random.default_rng(0)
    s = rng.normal(size=200)
    b = ndcg_baselines(s)
    draws = [ndcg(s, rng.permutation(s)) for _ in range(300)]
    assert b["random"] == pytest.approx(np.mean(draws), abs=0.005)  # the exact expectation
    assert b["reversed"] == pytest.approx(ndcg(s, -s)) and b["reversed"] < b["random"] < 1.0


def test_the_ndcg_row_names_the_order_counts_undefined_pairs_and_prints_baselines():
    """Issue 52 §2, §5: every NDCG beside a random and a reversed order on the same scores; the paper's undefined
    NDCG counted as undefined, not averaged in as 0.0; whose order and whose gains named."""
    from rmfast.analysis.paper_a.reproduce import _ndcg_row

    rng = np.random.default_rng(2)
    base = rng.normal(size=60)
    d = pd.DataFrame({"model": np.repeat(["a", "b", "c"], 60), "prompt": "p",
                      "text": [f"w{i:02d}" for i in range(60)] * 3,
                      "score": np.r_[base - 5, base + rng.normal(0, 0.3, 60) - 5, base + 5]})
    paper, ours = (agreement(d, n_perm=0, method=m).pairs for m in ("paper", "rmfast"))
    row = _ndcg_row(paper, ours, "p")
    n_nan = int(paper[["ndcg_a_b", "ndcg_b_a"]].isna().to_numpy().sum())
    assert n_nan == 4  # a's and b's scores are all below zero: their ideal DCG < 0
    assert f"undefined in {n_nan}/6 ordered pairs" in row["value"]
    assert "random order" in row["value"] and "reversed order" in row["value"]
    assert "model b's order with model a's scores as gains" in row["measure"]


def test_agreement_paper_method_columns():
    x = np.arange(20.0)
    d = pd.DataFrame({"model": np.repeat(["a", "b"], 20), "prompt": "p",
                      "text": [f"w{i:02d}" for i in range(20)] * 2, "score": np.r_[x, x]})
    paper = agreement(d, n_perm=0, method="paper").pairs.iloc[0]
    ours = agreement(d, n_perm=0).pairs.iloc[0]
    assert paper["rbo"] == pytest.approx(1 - 0.9**20) and ours["rbo"] == pytest.approx(1.0)
    assert paper["footrule"] == ours["footrule"] == 1.0
    assert paper["ndcg_a_b"] == pytest.approx(1.0) and ours["ndcg_b_a"] == pytest.approx(1.0)
    # every NDCG beside its two baselines on the same scores (issue 52 §2)
    assert ours["ndcg_random_a_b"] < 1.0 and ours["ndcg_reversed_a_b"] < ours["ndcg_random_a_b"]
    assert {"ndcg_random_b_a", "ndcg_reversed_b_a"} <= set(ours.index)
    tied = d.assign(score=np.r_[x // 2, x])  # model a scores in pairs: its ties are broken by each method's order
    assert any("breaks the ties in each model's own token-id order" in n for n in agreement(tied, n_perm=0, method="paper").notes)
    assert any("breaks the ties in the shared vocabulary's order" in n for n in agreement(tied, n_perm=0).notes)


# ------------------------------------------------------------------ prompts, p-values
def test_prompt_agreement_planted():
    d = pd.DataFrame({"model": "m", "prompt": np.repeat(["p", "q", "r"], 4),
                      "text": list("abcd") * 3,
                      "score": [1.0, 2, 3, 4, 4, 3, 2, 1, 1, 2, 4, 3]})
    m = prompt_agreement(d).matrix("m")
    # p vs r: one discordant pair (c, d) of 6 → tau = (5 − 1)/6
    assert m.loc["p", "q"] == -1.0 and m.loc["p", "r"] == pytest.approx(4 / 6)
    # two shared texts: tau +-1 with p = 1, no correlation at all; left out with a note (agreement refuses below 3)
    two = d.assign(score=d["score"].where(~((d["prompt"] == "r") & d["text"].isin(["a", "b"]))))
    res = prompt_agreement(two)
    assert set(zip(res.pairs["prompt_a"], res.pairs["prompt_b"])) == {("p", "q")}
    assert any("prompts 'p' and 'r' share 2 scored text(s); fewer than 3" in n for n in res.notes), res.notes
    with pytest.raises(UserError, match="sharing at least 3 scored texts"):
        prompt_agreement(d[d["text"].isin(["a", "b"])])


def test_significance_levels():
    assert [significance(p) for p in (1e-9, 0.001, 0.0099, 0.049, 0.2)] == \
        ["***", "**", "**", "*", "ns"]


# ------------------------------------------------------------------ published data
@real
def test_paper_method_reproduces_fig5b_and_a7():
    from rmfast.analysis import load_eloeverything
    from rmfast.analysis.paper_a.reproduce import GE, PAPER_RANK_GAPS

    data = load_eloeverything(ELO)
    paper = human_comparison(data.scans, data.human, k=10, method="paper").differences
    for prompt, lists in PAPER_RANK_GAPS.items():
        for direction, items in lists.items():
            got = paper[(paper["prompt"] == prompt) & (paper["direction"] == direction)]
            assert list(got["text"]) == items, (prompt, direction)
    ours = human_comparison(data.scans, data.human, k=10).differences
    up = ours[(ours["prompt"] == GE) & (ours["direction"] == "humans rank higher")]
    assert "Black people" not in set(up["text"])
    assert len(set(up["text"]) & set(PAPER_RANK_GAPS[GE]["humans rank higher"])) == 7
