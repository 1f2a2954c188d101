"""Paper B's statistics (planted answers) and its reproduction from the published data.

The real-data tests recompute Fig. 1 the way the authors' R script does, in plain pandas and
scipy (inner join on the token, ``rank(-score)`` with averaged ties, median per model ×
category × prompt, Welch t per panel), and compare with rmfast's path. They skip when
``../shared/data`` is absent."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

stats = pytest.importorskip("scipy.stats")

from rmfast.analysis.categories import categories
from rmfast.analysis.permutation import (MKINFER_R, bonferroni, mkinfer_perm_t_test,
                                         permutation_test, welch_t)
from rmfast.errors import UserError

from conftest import SHARED_DATA

IC = SHARED_DATA / "iclr2026"
DIC = SHARED_DATA / "lexicons" / "big2_nouns.csv"
real = pytest.mark.skipif(not (IC.is_dir() and DIC.exists()), reason=f"shared data absent ({IC})")


# ---- the statistics, planted answers -------------------------------------------------------

def _split_p(x, y) -> float:
    """Exact permutation p by enumerating every split of the pooled values (an n! enumeration
    of orderings counts each split nx!·ny! times, so the fractions agree)."""
    z = np.concatenate([x, y])
    t0 = abs(float(welch_t(np.asarray(x), np.asarray(y))))
    hits = total = 0
    for idx in combinations(range(len(z)), len(x)):
        mask = np.zeros(len(z), bool)
        mask[list(idx)] = True
        hits += abs(float(welch_t(z[mask], z[~mask]))) >= t0 - 1e-12
        total += 1
    return hits / total


def test_mkinfer_p_value_is_welch_and_exact_perm_p_matches_split_enumeration():
    x, y = np.array([1.0, 2.5, 3.0]), np.array([2.0, 3.5, 4.0, 6.0])
    r = mkinfer_perm_t_test(x, y)
    w = stats.ttest_ind(x, y, equal_var=False)
    assert r["t"] == pytest.approx(w.statistic, rel=1e-12)
    assert r["p_value"] == pytest.approx(w.pvalue, rel=1e-10)
    assert r["df"] == pytest.approx(w.df, rel=1e-10)
    assert r["exact"] and r["n_perm"] == math.factorial(7)  # 7! < 9999: R enumerates orderings
    assert r["perm_p_value"] == pytest.approx(_split_p(x, y), abs=1e-12)


def test_mkinfer_monte_carlo_p_is_close_to_the_exact_one_and_floored_at_1_over_R():
    rng = np.random.default_rng(1)
    x, y = rng.normal(0, 1, 5), rng.normal(0.8, 1, 5)  # 10! > 9999: Monte-Carlo
    r = mkinfer_perm_t_test(x, y, seed=3)
    exact = _split_p(x, y)
    assert not r["exact"] and r["n_perm"] == MKINFER_R
    assert abs(r["perm_p_value"] - exact) < 4 * math.sqrt(exact * (1 - exact) / MKINFER_R) + 1e-4
    far = mkinfer_perm_t_test(np.arange(30.0), np.arange(30.0) + 100, R=999)
    assert far["perm_p_value"] == pytest.approx(1 / 999) and far["p_value"] < 1e-30


def test_mkinfer_null_groups_give_large_p():
    v = np.random.default_rng(2).normal(size=60)
    r = mkinfer_perm_t_test(v[::2], v[1::2], R=2000)
    assert r["p_value"] > 0.05 and r["perm_p_value"] > 0.05


def test_rmfast_permutation_test_planted_separation_4_vs_6():
    v = np.array([1.0, 2.0, 3.0, 4.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0])
    a = np.arange(10) < 4
    r = permutation_test(v, a)
    # the observed split is the only one as extreme: the mirror one (A = the 4 largest) leaves a
    # spread-out B, so its Welch |t| is smaller
    mirror = abs(float(welch_t(v[-4:], v[:-4])))
    assert mirror < abs(r["t"])
    assert r["exact"] and r["n_perm"] == 210 and r["p_value"] == pytest.approx(1 / 210)


def test_bonferroni_caps_at_one():
    assert bonferroni([0.01, 0.3, 0.6], 4).tolist() == pytest.approx([0.04, 1.0, 1.0])


def _planted_medians(effect: float, seed: int = 0) -> pd.DataFrame:
    """Synthetic scans: 3 'gemma' and 3 'llama' models, 8 prompts (4 positive), 20 words in
    categories A and C; llama scores A words higher by ``effect``."""
    rng = np.random.default_rng(seed)
    words = [f"a{i}" for i in range(10)] + [f"c{i}" for i in range(10)]
    rows = []
    for m in ["org/gemma-x", "org/gemma-y", "org/gemma-z", "org/llama-x", "org/llama-y",
              "org/llama-z"]:
        for p in [f"best {i}?" for i in range(4)] + [f"worst {i}?" for i in range(4)]:
            for w in words:
                s = rng.normal() + (effect if ("llama" in m and w[0] == "a") else 0.0)
                rows.append((m, p, w, s))
    return pd.DataFrame(rows, columns=["model", "prompt", "text", "score"])


def test_categories_paper_method_welch_over_rows_per_category_framing_panel():
    d = _planted_medians(effect=2.0)
    dic = pd.DataFrame({"term": d["text"].unique(), "category": [
        "A" if w[0] == "a" else "C" for w in d["text"].unique()]})
    groups = {m: ("Gemma" if "gemma" in m else "Llama") for m in d["model"].unique()}
    res = categories(d, dic, group_by=groups, method="paper", mixed=False, n_perm=999)
    pt = res.permutation
    assert len(pt) == 4 and set(pt["framing"]) == {"positive", "negative"}
    assert (pt["n_a"] == 12).all() and (pt["n_b"] == 12).all()  # 3 models × 4 prompts per group
    med = res.medians
    for r in pt.itertuples():
        sub = med[(med["framing"] == r.framing) & (med["category"] == r.category)]
        w = stats.ttest_ind(sub.loc[sub["group"] == "Gemma", "median_rank"],
                            sub.loc[sub["group"] == "Llama", "median_rank"], equal_var=False)
        assert r.p_value == pytest.approx(w.pvalue, rel=1e-9)
        assert r.p_bonferroni == pytest.approx(min(1.0, 4 * w.pvalue), rel=1e-9)
    a_pos = pt[(pt["category"] == "A") & (pt["framing"] == "positive")].iloc[0]
    assert a_pos.mean_b < a_pos.mean_a and a_pos.p_bonferroni < 0.01  # llama ranks A higher
    with pytest.raises(UserError, match="method"):
        categories(d, dic, group_by=groups, method="R")


def test_paper_mixed_recovers_planted_effects_and_uses_nlme_df():
    from rmfast.analysis.paper_b import paper_mixed

    rng = np.random.default_rng(5)
    rows = []
    beta = {"llama": -4.0, "comm": 2.0, "neg": -30.0, "llama:comm": 8.0}
    for i in range(12):
        base = "Llama" if i % 2 else "Gemma"
        u = rng.normal(0, 2.0)
        for p in range(20):
            fr = "negative" if p % 2 else "positive"
            for cat in ("Agency", "Communion"):
                y = (100 + u + beta["llama"] * (base == "Llama") + beta["comm"] * (cat == "Communion")
                     + beta["neg"] * (fr == "negative")
                     + beta["llama:comm"] * (base == "Llama") * (cat == "Communion")
                     + rng.normal(0, 1.0))
                rows.append((f"m{i}", base, f"p{p}", fr, cat, y))
    med = pd.DataFrame(rows, columns=["model", "group", "prompt", "framing", "category",
                                      "median_rank"])
    out = paper_mixed(med).set_index("term")
    assert out.loc["base_modelLlama:CategoryCommunion", "coef"] == pytest.approx(8.0, abs=0.5)
    assert out.loc["prompt_framingnegative", "coef"] == pytest.approx(-30.0, abs=0.5)
    assert out.loc["base_modelLlama", "df"] == 12 - 1 - 1  # between-model term
    assert out.loc["CategoryCommunion", "df"] == len(med) - 12 - 6  # within-model terms
    assert out.loc["(Intercept)", "df"] == len(med) - 12 - 6


# ---- the published data ---------------------------------------------------------------------

def _authors_fig1() -> pd.DataFrame:
    """Fig. 1's medians as the R script computes them, in plain pandas."""
    dic = pd.read_csv(DIC)
    rows = []
    for f in sorted((IC / "dict_big2_nouns").glob("big2_rewards_*.csv")):
        w = pd.read_csv(f, keep_default_na=False)
        long = w.melt(id_vars="response", var_name="prompt", value_name="score")
        long["model"] = f.stem
        rows.append(long)
    d = pd.concat(rows).merge(dic, left_on="response", right_on="token_decoded")
    d["rank"] = d.groupby(["model", "prompt"])["score"].rank(ascending=False)
    d["base"] = np.where(d["model"].str.contains("gemma", case=False), "Gemma", "Llama")
    d["framing"] = np.where(d["prompt"].str.split("_").str[0].isin(["best", "greatest", "good"]),
                            "positive", "negative")
    return (d.groupby(["model", "base", "Category", "prompt", "framing"])["rank"].median()
            .rename("median").reset_index())


@real
def test_fig1_medians_and_paper_tests_equal_the_authors_recipe(tmp_path):
    from rmfast.analysis.paper_b import reproduce_paper_b

    found = reproduce_paper_b(IC, tmp_path)
    assert [f["id"] for f in found] == ["B-fig1", "B-fig1-rmfast", "B-fig1-lmm", "B-fig4a",
                                        "B-fig4b"]
    for f in found:
        assert {"id", "title", "paper_claim", "holds", "summary", "files"} <= set(f)
        assert f["holds"] in (True, False, None)
        assert all((tmp_path / x).exists() for x in f["files"])
    ref = _authors_fig1()
    assert len(ref) == 10 * 2 * 54
    ours = pd.read_csv(tmp_path / "B_fig1_medians.csv")
    assert len(ours) == len(ref)
    assert sorted(ours["median_rank"]) == pytest.approx(sorted(ref["median"]))
    tests = pd.read_csv(tmp_path / "B_fig1_tests_paper.csv")
    assert len(tests) == 4 and (tests["n_a"] + tests["n_b"] == 270).all()
    for r in tests.itertuples():
        sub = ref[(ref["framing"] == r.framing) & (ref["Category"] == r.category)]
        w = stats.ttest_ind(sub.loc[sub["base"] == "Gemma", "median"],
                            sub.loc[sub["base"] == "Llama", "median"], equal_var=False)
        assert r.p_value == pytest.approx(w.pvalue, rel=1e-9)
    # the recorded verdicts are what the tables say
    llama_better = tests["mean_b"] < tests["mean_a"]
    claimed = (tests["category"] == "Agency") == (tests["framing"] == "positive")
    assert found[0]["holds"] == bool((llama_better == claimed).all()
                                     and (tests["p_bonferroni"] < 0.05).all())
    ours_t = pd.read_csv(tmp_path / "B_fig1_tests_rmfast.csv")
    assert (ours_t["n_a"] + ours_t["n_b"] == 10).all()  # models, not model × prompt rows
    assert found[1]["holds"] == bool((ours_t["p_bonferroni"] < 0.05).all())


@real
def test_fig1_mixed_model_matches_an_independent_statsmodels_fit(tmp_path):
    smf = pytest.importorskip("statsmodels.formula.api")
    from rmfast.analysis.paper_b import paper_mixed

    ref = _authors_fig1()
    med = ref.rename(columns={"base": "group", "Category": "category", "median": "median_rank"})
    out = paper_mixed(med).set_index("term")
    ref["fr"] = pd.Categorical(ref["framing"], ["positive", "negative"])
    fit = smf.mixedlm("median ~ C(base) * C(Category) * C(fr)", ref, groups=ref["model"]).fit(
        reml=True)
    # same model, terms in another order: compare the sorted coefficients
    assert sorted(out["coef"]) == pytest.approx(sorted(fit.fe_params), rel=1e-6, abs=1e-6)
    assert out.loc["base_modelLlama", "df"] == 8 and out.loc["CategoryCommunion", "df"] == 1064
