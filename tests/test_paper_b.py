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

from rmfast.analysis.paper_b.categories import categories
from rmfast.analysis.stats.permutation import (MKINFER_R, bonferroni, mkinfer_perm_t_test,
                                         permutation_test, welch_t)
from rmfast.errors import UserError

from conftest import SHARED_DATA
from cli_run import run

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
    # a model none of whose texts is a dictionary word is named as left out (it vanished, only counted before)
    gone = d[d["model"] == d["model"].iloc[0]].assign(model="org/no-words", text="zzz-not-a-word")
    res = categories(pd.concat([d, gone]), dic, group_by={**groups, "org/no-words": "Llama"}, method="paper",
                     mixed=False, n_perm=99)
    assert "org/no-words" not in set(res.medians["model"])
    assert any(n.startswith("left out: org/no-words: no scored text of it is a dictionary word") for n in res.notes)


def test_paper_mixed_recovers_planted_effects_and_uses_nlme_df():
    from rmfast.analysis.paper_b.reproduce import paper_mixed

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


def _ten_model_medians(n_cat: int, seed: int = 0) -> pd.DataFrame:
    """4 Gemma vs 6 Llama models, ``n_cat`` categories, 2 prompts per framing: the paper's design in small."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in [f"g{i}" for i in range(4)] + [f"l{i}" for i in range(6)]:
        for fr in ("positive", "negative"):
            for k in range(2):
                for c in range(n_cat):
                    rows.append({"model": m, "prompt": f"{fr}{k}", "category": f"C{c}", "framing": fr,
                                 "group": "Llama" if m[0] == "l" else "Gemma",
                                 "median_rank": 100 + rng.normal(0, 5)})
    return pd.DataFrame(rows)


def test_rmfast_tests_keep_the_papers_family_and_correct_the_pooled_tests_apart():
    """Issue 52 §1: the paper corrects over its category × framing panels (×10 for MFD's five foundations); the
    signed pooled tests are rmfast's exploratory addition and must not enlarge that family (×15 made the smallest
    attainable p 15/210 = 0.071: no test could reach .05). Every row says its family and its smallest p."""
    from rmfast.analysis.data.ledger import Ledger
    from rmfast.analysis.paper_b.categories import FAMILY_PANELS, FAMILY_POOLED, POOLED, _permutations

    tab = _permutations(_ten_model_medians(5), "median_rank", 9999, 0, Ledger())
    panels, pooled = tab[tab["family"] == FAMILY_PANELS], tab[tab["family"] == FAMILY_POOLED]
    assert len(panels) == 10 and len(pooled) == 5 and set(pooled["framing"]) == {POOLED}
    assert (panels["p_bonferroni"] == np.minimum(1, 10 * panels["p_value"])).all()
    assert (pooled["p_bonferroni"] == np.minimum(1, 5 * pooled["p_value"])).all()
    assert panels["correction"].str.startswith("Bonferroni ×10").all()
    assert pooled["correction"].str.startswith("Bonferroni ×5").all()
    assert tab["min_p"].to_numpy() == pytest.approx(1 / 210)
    assert panels["min_p_bonferroni"].to_numpy() == pytest.approx(10 / 210)  # 0.048: .05 is reachable
    assert pooled["min_p_bonferroni"].to_numpy() == pytest.approx(5 / 210)
    # the pooled rows hold a mean of within-model differences, not a mean of model means
    assert (pooled["statistic"] == "mean_of_model_framing_differences").all()
    assert (panels["statistic"] == "mean_of_model_means").all()
    assert "exploratory" in FAMILY_POOLED and "after the data" in FAMILY_POOLED


def test_two_categories_add_the_within_model_contrast_to_the_exploratory_family():
    """Big Two: each model's signed pool of Communion − that of Agency, a contrast free of how far the model's
    whole ranking flips between positive and negative prompts (the real data: p 12/210, not the pooled 2/210)."""
    from rmfast.analysis.data.ledger import Ledger
    from rmfast.analysis.paper_b.categories import FAMILY_POOLED, _permutations, _signed_pool

    med = _ten_model_medians(2, seed=3)
    tab = _permutations(med, "median_rank", 9999, 0, Ledger())
    row = tab[tab["category"] == "C1 − C0"].iloc[0]
    assert row["family"] == FAMILY_POOLED and row["statistic"] == "mean_of_model_category_contrasts"
    sp = _signed_pool(med, "median_rank").pivot(index=["model", "group"], columns="category",
                                                values="median_rank").reset_index()
    c = (sp["C1"] - sp["C0"]).to_numpy()
    llama = (sp["group"] == "Llama").to_numpy()
    assert row["llama_minus_gemma"] == pytest.approx(c[llama].mean() - c[~llama].mean())
    assert row["p_value"] == pytest.approx(permutation_test(c, llama)["p_value"])
    assert (tab[tab["family"] == FAMILY_POOLED]["correction"].str.startswith("Bonferroni ×3")).all()


def _cells_medians(seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(10):
        base = "Llama" if i % 2 else "Gemma"
        u = rng.normal(0, 2.0)
        for p in range(8):
            fr = "negative" if p % 2 else "positive"
            for cat in ("Authority", "Care", "Loyalty"):
                eff = {"Authority": -20.0, "Care": 10.0, "Loyalty": 16.0}[cat] * (base == "Llama")
                y = 100 + u + eff + (5.0 if fr == "negative" else 0.0) * (base == "Llama") + rng.normal(0, 1.0)
                rows.append((f"m{i}", base, f"p{p}", fr, cat, y))
    return pd.DataFrame(rows, columns=["model", "group", "prompt", "framing", "category", "median_rank"])


def test_mixed_model_names_the_base_coefficient_a_cell_contrast_and_adds_the_marginal_effect():
    """Issue 52 §3: with treatment coding the base coefficient is Llama − Gemma at the reference cell (first
    category, positive framing), not a main effect; the model effect averaged over categories and framings is a
    marginal contrast, tested with the between-model df."""
    from rmfast.analysis.paper_b.mixed_model import paper_mixed

    med = _cells_medians()
    out = paper_mixed(med).set_index("term")
    cell = med.groupby(["group", "category", "framing"])["median_rank"].mean()
    diff = (cell["Llama"] - cell["Gemma"])
    assert out.loc["base_modelLlama", "coef"] == pytest.approx(diff[("Authority", "positive")], abs=1e-6)
    assert "reference cell (Authority, positive framing)" in out.loc["base_modelLlama", "meaning"]
    assert "not a main effect" in out.loc["base_modelLlama", "meaning"]
    marg = out.loc["base_modelLlama (marginal)"]
    assert marg["coef"] == pytest.approx(diff.mean(), abs=1e-6)  # balanced: the mean of the 6 cells' contrasts
    assert marg["df"] == 10 - 1 - 1 and "marginal" in marg["meaning"]
    assert marg["p_value"] == pytest.approx(2 * stats.t.sf(abs(marg["coef"] / marg["se"]), 8))
    assert abs(marg["coef"]) < 5 < abs(out.loc["base_modelLlama", "coef"])


def test_a_degenerate_fit_is_not_called_converged():
    """statsmodels can report converged=True on a degenerate fit: a random-effects covariance on the boundary (a
    correlation of ±1, a variance of 0) or a Hessian that is not negative definite must be said."""
    from types import SimpleNamespace

    from rmfast.analysis.paper_b.mixed_model import fit_problems

    good_h = -np.eye(3)
    ok = SimpleNamespace(converged=True, cov_re=np.array([[4.0, 1.0], [1.0, 2.0]]), scale=1.0,
                         bse_fe=np.ones(3), params_object=None,
                         model=SimpleNamespace(hessian=lambda p: (good_h, False)))
    assert fit_problems(ok) == []
    corr1 = SimpleNamespace(**{**vars(ok), "cov_re": np.array([[4.0, 2.0], [2.0, 1.0]])})
    assert any("boundary" in x for x in fit_problems(corr1))
    flat = SimpleNamespace(**{**vars(ok), "model": SimpleNamespace(hessian=lambda p: (np.diag([-1.0, 0.0, -1.0]),
                                                                                      False))})
    assert any("Hessian" in x for x in fit_problems(flat))
    warned = [SimpleNamespace(message="The MLE may be on the boundary of the parameter space.")]
    assert fit_problems(ok, warned) and "boundary" in fit_problems(ok, warned)[0]


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
def test_fig1_medians_and_paper_tests_equal_the_authors_recipe(paper_b_published):
    found, tmp_path = paper_b_published
    # the shared data holds the published MFD 2.0 files: Fig. 1b comes by default
    assert [f["id"] for f in found] == ["B-fig1", "B-fig1-rmfast", "B-fig1-lmm",
                                        "B-fig1-summaries", "B-fig1-units", "B-fig1b",
                                        "B-fig1b-rmfast", "B-fig1b-lmm", "B-fig1b-summaries",
                                        "B-fig4a", "B-fig4b"]
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
    # Fig. 1b from the published MFD 2.0 files: all 2,700 model × prompt × foundation medians equal the
    # authors' recipe in plain pandas (the same recipe as on the synthetic MFD-like set below)
    ref_b = _authors_mfd(IC / "dict_MFD_20", SHARED_DATA / "lexicons" / "mfd2.0.dicx")
    assert len(ref_b) == 10 * 54 * 5
    ours_b = pd.read_csv(tmp_path / "B_fig1b_medians.csv")
    ref_b["model"] = ref_b["model"].str.replace("_", "/", n=1)
    m = ours_b.merge(ref_b, left_on=["model", "prompt", "category"], right_on=["model", "prompt", "cat"],
                     validate="1:1")
    assert len(m) == len(ours_b) == len(ref_b)
    assert m["median_rank"].to_numpy() == pytest.approx(m["median"].to_numpy())


@real
def test_fig1_mixed_model_matches_an_independent_statsmodels_fit(tmp_path):
    smf = pytest.importorskip("statsmodels.formula.api")
    from rmfast.analysis.paper_b.reproduce import paper_mixed

    ref = _authors_fig1()
    med = ref.rename(columns={"base": "group", "Category": "category", "median": "median_rank"})
    out = paper_mixed(med).set_index("term")
    ref["fr"] = pd.Categorical(ref["framing"], ["positive", "negative"])
    fit = smf.mixedlm("median ~ C(base) * C(Category) * C(fr)", ref, groups=ref["model"]).fit(
        reml=True)
    # same model, terms in another order: compare the sorted coefficients (the marginal row is a contrast of them)
    coefs = out.loc[[t for t in out.index if not t.endswith("(marginal)")], "coef"]
    assert sorted(coefs) == pytest.approx(sorted(fit.fe_params), rel=1e-6, abs=1e-6)
    assert out.loc["base_modelLlama", "df"] == 8 and out.loc["CategoryCommunion", "df"] == 1064


# ---- any dictionary, any file-name prefix, from the command line (issue 26) ---------------

FOUNDATIONS = ("Care", "Fairness", "Loyalty")


def _mfd_like(root, *, n_models: int = 4, seed: int = 0):
    """A synthetic MFD-like set in the authors' layout: score CSVs under two prefixes (as the
    authors' dict_MFD_20/ folder), a wide .dicx with <Foundation>_Virtue/_Vice columns, one word
    listed under two categories (the R script ranks it twice). Llama RMs score Care words up."""
    rng = np.random.default_rng(seed)
    folder = root / "dict_MFD_20"
    folder.mkdir(parents=True)
    cols = [f"{f}_{k}" for f in FOUNDATIONS for k in ("Virtue", "Vice")]
    terms, rows = [], []
    for i, c in enumerate(cols):
        for j in range(6):
            t = f"{c.lower()}{j}"
            terms.append((t, c))
    terms.append(("carefair", "Care_Virtue"))
    terms.append(("carefair", "Fairness_Virtue"))
    dic = pd.DataFrame({"DicTerm": sorted({t for t, _ in terms})})
    for c in cols:
        dic[c] = ["X" if (t, c) in set(terms) else "" for t in dic["DicTerm"]]
    dicx = root / "mfd.dicx"
    dic.to_csv(dicx, index=False)
    words = list(dic["DicTerm"]) + ["notaword", "another"]
    prompts = [f"{a}_ever_one" for a in ("best", "good", "worst", "terrible")]
    names = [("org_Gemma-A", "MFD20"), ("org_Gemma-B", "big2"), ("org_Llama-A", "MFD20"),
             ("org_Llama-B", "big2"), ("org_Llama-C", "big2"), ("org_Gemma-C", "MFD20")][:n_models]
    for key, prefix in names:
        up = 2.0 if "Llama" in key else 0.0
        w = pd.DataFrame({"response": words})
        for p in prompts:
            w[p] = [rng.normal() + (up if x.startswith("care") else 0.0) for x in words]
        w.to_csv(folder / f"{prefix}_rewards_{key}.csv", index=False)
    return folder, dicx


def _authors_mfd(folder, dicx, keep: bool = False) -> pd.DataFrame:
    """The authors' MFD recipe in plain pandas: inner join on DicTerm, one row per word ×
    marked column, distinct, rank(-score) over those rows within model × prompt, then the
    category cut at '_' (sub("_.*", "", ...)), median per model × prompt × category."""
    import re

    parts = []
    for f in sorted(folder.glob("*.csv")):
        w = pd.read_csv(f, keep_default_na=False)
        long = w.melt(id_vars="response", var_name="prompt", value_name="score")
        long["model"] = re.sub(r"^.*?_rewards_", "", f.stem)
        parts.append(long)
    dic = pd.read_csv(dicx, dtype=str, keep_default_na=False)
    cats = [c for c in dic.columns if c != "DicTerm"]
    d = pd.concat(parts).merge(dic, left_on="response", right_on="DicTerm")
    d = d.melt(id_vars=["model", "prompt", "response", "score"], value_vars=cats,
               var_name="cat", value_name="value")
    d = d[d["value"] == "X"].drop_duplicates()
    d["rank"] = d.groupby(["model", "prompt"])["score"].rank(ascending=False)
    if not keep:
        d["cat"] = d["cat"].str.replace(r"_.*", "", regex=True)
    return d.groupby(["model", "prompt", "cat"])["rank"].median().rename("median").reset_index()


def _cli(args, capsys):
    from rmfast.cli import main

    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def test_cli_categories_on_a_new_dictionary_equals_the_authors_recipe(tmp_path, capsys):
    folder, dicx = _mfd_like(tmp_path)
    out = tmp_path / "x.csv"
    rc, err = _cli(["analyze", "categories", folder, "--dictionary", dicx, "--method", "paper",
                    "--n-perm", "99", "--out", out], capsys)
    assert rc == 0, err
    # every file counted in one note, under both prefixes
    assert "read 4 (2 MFD20_rewards_*, 2 big2_rewards_*), skipped 0" in err
    got = pd.read_csv(out)
    assert list(got.columns[:5]) == ["model", "prompt", "category", "median_rank", "framing"]
    assert got["model"].nunique() == 4 and set(got["category"]) == set(FOUNDATIONS)
    assert set(got["group"]) == {"Gemma", "Llama"}
    ref = _authors_mfd(folder, dicx)
    ref["model"] = ref["model"].str.replace("_", "/", n=1)
    m = got.merge(ref, left_on=["model", "prompt", "category"],
                  right_on=["model", "prompt", "cat"], validate="1:1")
    assert len(m) == len(ref) == len(got) == 4 * 4 * 3
    assert m["median_rank"].to_numpy() == pytest.approx(m["median"].to_numpy())
    # the ten columns kept on request
    rc, err = _cli(["analyze", "categories", folder, "--dictionary", dicx, "--method", "paper",
                    "--virtue-vice", "keep", "--n-perm", "99", "--out", tmp_path / "ten.csv"],
                   capsys)
    ten = pd.read_csv(tmp_path / "ten.csv")
    assert rc == 0 and ten["category"].nunique() == 6
    ref10 = _authors_mfd(folder, dicx, keep=True)
    assert sorted(ten["median_rank"]) == pytest.approx(sorted(ref10["median"]))
    # the planted effect: Llama RMs rank Care words higher (lower rank)
    tests = pd.read_csv(tmp_path / "x.csv")
    care = tests[tests["category"] == "Care"].groupby("group")["median_rank"].mean()
    assert care["Llama"] < care["Gemma"]


def test_cli_categories_refuses_a_skipped_file_that_drops_a_model(tmp_path, capsys):
    folder, dicx = _mfd_like(tmp_path)
    (folder / "README.md").write_text("notes")  # counted, not a model
    pd.DataFrame({"word": ["a"], "best_ever_one": [1.0]}).to_csv(
        folder / "MFD20_rewards_org_Llama-Z.csv", index=False)  # no 'response': a lost model
    args = ["analyze", "categories", folder, "--dictionary", dicx, "--method", "paper",
            "--n-perm", "99", "--out", tmp_path / "x.csv"]
    rc, err = _cli(args, capsys)
    assert rc == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "MFD20_rewards_org_Llama-Z.csv" in err and "--allow-skipped" in err
    rc, err = _cli(args + ["--allow-skipped"], capsys)
    assert rc == 0
    assert "read 4 (2 MFD20_rewards_*, 2 big2_rewards_*), skipped 2" in err
    assert "models with no file read: org_Llama-Z" in err
    assert pd.read_csv(tmp_path / "x.csv")["model"].nunique() == 4
    # the same model twice (the authors' two prefixes for one RM) is refused
    (folder / "MFD20_rewards_org_Llama-Z.csv").unlink()
    import shutil
    shutil.copy(folder / "big2_rewards_org_Gemma-B.csv", folder / "MFD20_rewards_org_Gemma-B.csv")
    rc, err = _cli(args + ["--overwrite"], capsys)
    assert rc == 2 and "both hold scores for model org_Gemma-B" in err


def test_summaries_name_three_statistics_that_differ_on_planted_data():
    """Model m1: skewed ranks over prompts, so a median over prompts differs from the mean."""
    from rmfast.analysis.paper_b.categories import STATISTICS, group_summaries

    med = pd.DataFrame({"model": ["g1"] * 3 + ["l1"] * 3, "prompt": ["p1", "p2", "p3"] * 2,
                        "category": "A", "median_rank": [1.0, 2.0, 9.0, 4.0, 4.0, 4.0],
                        "framing": "positive", "group": ["G"] * 3 + ["L"] * 3})
    words = pd.DataFrame({"model": ["g1"] * 6 + ["l1"] * 6, "prompt": ["p1", "p1", "p2", "p2",
                          "p3", "p3"] * 2, "category": "A", "rank": [1, 1, 2, 2, 3, 15,
                          4, 4, 4, 4, 4, 4], "n_ranked": 20, "framing": "positive",
                          "group": ["G"] * 6 + ["L"] * 6})
    s = group_summaries(med, words).set_index("statistic")
    assert set(s.index) == set(STATISTICS)
    assert s.loc["mean_of_model_prompt_medians", "value_a"] == pytest.approx(4.0)
    assert s.loc["mean_of_model_medians_over_prompts", "value_a"] == pytest.approx(2.0)
    assert s.loc["r_avg_ranks", "value_a"] == pytest.approx(2.0)  # median of 1,1,2,2,3,15
    assert s.loc["r_avg_ranks", "l_minus_g"] == pytest.approx(2.0)  # L − G, named so


@real
def test_three_statistics_reproduce_the_issue_numbers_and_r_avg_ranks_exactly():
    from rmfast.analysis.paper_b.published import load_big2_rewards
    from rmfast.analysis.paper_b.reproduce import r_avg_ranks

    s = load_big2_rewards(IC)
    res = categories(s, DIC, group_by=dict(zip(s["model"], s["base"])),
                     framing=dict(zip(s["prompt"], s["framing"])), method="paper", mixed=False,
                     n_perm=99)
    summ = res.summaries
    pa = summ[(summ["framing"] == "positive") & (summ["category"] == "Agency")].set_index(
        "statistic")["llama_minus_gemma"]
    assert round(pa["mean_of_model_prompt_medians"], 2) == -4.17
    assert round(pa["mean_of_model_medians_over_prompts"], 2) == -5.81
    assert round(pa["r_avg_ranks"], 2) == -4.21
    # the R block, recomputed independently: per model × category × framing the median over
    # all word × prompt ranks, then the mean per base
    dic = pd.read_csv(DIC)
    rows = []
    for f in sorted((IC / "dict_big2_nouns").glob("big2_rewards_*.csv")):
        w = pd.read_csv(f, keep_default_na=False).melt(id_vars="response", var_name="prompt",
                                                        value_name="score")
        rows.append(w.assign(model=f.stem))
    d = pd.concat(rows).merge(dic, left_on="response", right_on="token_decoded")
    d["rank"] = d.groupby(["model", "prompt"])["score"].rank(ascending=False)
    d["base"] = np.where(d["model"].str.contains("gemma", case=False), "Gemma", "Llama")
    d["fr"] = np.where(d["prompt"].str.split("_").str[0].isin(["best", "greatest", "good"]),
                       "positive", "negative")
    ref = (d.groupby(["model", "base", "Category", "fr"])["rank"].median()
           .groupby(["fr", "Category", "base"]).mean().unstack("base"))
    tab = r_avg_ranks(summ).set_index(["prompt_framing", "Category"])
    assert list(tab.index.get_level_values(0)[:2]) == ["positive", "positive"]  # R's level order
    for (fr, cat), r in ref.iterrows():
        assert tab.loc[(fr, cat), "Gemma"] == pytest.approx(r["Gemma"], rel=1e-12)
        assert tab.loc[(fr, cat), "llama_minus_gemma"] == pytest.approx(r["Llama"] - r["Gemma"],
                                                                       rel=1e-12)


def test_random_slope_widens_the_interaction_se_when_models_differ_in_category_preference():
    from rmfast.analysis.paper_b.reproduce import paper_mixed

    rng = np.random.default_rng(3)
    rows = []
    for i in range(10):
        base = "Llama" if i % 2 else "Gemma"
        slope = rng.normal(0, 6.0)  # each model's own category preference
        for p in range(20):
            fr = "negative" if p % 2 else "positive"
            for cat in ("Agency", "Communion"):
                y = (100 + 3.0 * (base == "Llama") * (cat == "Communion")
                     + slope * (cat == "Communion") + rng.normal(0, 1.0))
                rows.append((f"m{i}", base, f"p{p}", fr, cat, y))
    med = pd.DataFrame(rows, columns=["model", "group", "prompt", "framing", "category",
                                      "median_rank"])
    a = paper_mixed(med).set_index("term")
    b = paper_mixed(med, random_slope=True).set_index("term")
    t = "base_modelLlama:CategoryCommunion"
    assert b.loc[t, "se"] > 4 * a.loc[t, "se"]  # the unit is now the model
    assert b.loc[t, "coef"] == pytest.approx(a.loc[t, "coef"], abs=0.5)
    assert (a["random_effects"] == "intercept per model").all()
    assert (b["random_effects"] == "intercept + category slope per model").all()


def _big2_like(root, rng):
    folder = root / "iclr2026" / "dict_big2_nouns"
    folder.mkdir(parents=True)
    words = [f"ag{i}" for i in range(8)] + [f"co{i}" for i in range(8)]
    (root / "lexicons").mkdir()
    pd.DataFrame({"Category": ["Agency"] * 8 + ["Communion"] * 8,
                  "token_decoded": words}).to_csv(root / "lexicons" / "big2_nouns.csv",
                                                  index=False)
    prompts = [f"{a}_ever_one" for a in ("best", "good", "worst", "terrible")]
    for key in ("org_Gemma-A", "org_Gemma-B", "org_Llama-A", "org_Llama-B"):
        w = pd.DataFrame({"response": words})
        for p in prompts:
            w[p] = rng.normal(size=len(words))
        w.to_csv(folder / f"big2_rewards_{key}.csv", index=False)


def test_reproduce_gains_fig1b_when_mfd_scores_are_given(tmp_path, capsys):
    from rmfast.analysis import reproduce

    data = tmp_path / "data"
    _big2_like(data, np.random.default_rng(0))
    found = reproduce.run(data, tmp_path / "out0", ("b",))
    by = {f["id"]: f for f in found}
    assert by["B-fig1b"]["holds"] is None and "not available" in by["B-fig1b"]["summary"]
    assert "not available" in by["B-fig4"]["summary"]
    # `reproduce` and `analyze categories --method paper` draw the same permutations (reproduce had its own seed)
    rc, _, err = run(["analyze", "categories", data / "iclr2026" / "dict_big2_nouns", "--dictionary",
                      data / "lexicons" / "big2_nouns.csv", "--method", "paper", "--table", "permutation",
                      "--out", tmp_path / "c.csv"], capsys)
    assert rc == 0, err
    keys = ["framing", "category"]
    ours = pd.read_csv(tmp_path / "out0" / "B_fig1_tests_paper.csv").sort_values(keys)
    cli = pd.read_csv(tmp_path / "c.csv").sort_values(keys)
    assert ours["perm_p_value"].tolist() == cli["perm_p_value"].tolist()
    assert (ours["perm_p_value"] < 1).any()  # a test whose draws matter
    folder, dicx = _mfd_like(data / "iclr2026")
    dicx.rename(folder / "mfd.dicx")  # a .dicx inside dict_MFD_20/ is used first
    out = tmp_path / "out"
    found = reproduce.run(data, out, ("b",))
    by = {f["id"]: f for f in found}
    assert {"B-fig1b", "B-fig1b-rmfast", "B-fig1b-lmm", "B-fig1b-summaries"} <= set(by)
    med = pd.read_csv(out / "B_fig1b_medians.csv")
    assert set(med["category"]) == set(FOUNDATIONS) and med["model"].nunique() == 4
    ref = _authors_mfd(folder, folder / "mfd.dicx")
    assert sorted(med["median_rank"]) == pytest.approx(sorted(ref["median"]))
    assert "read 4 (2 MFD20_rewards_*, 2 big2_rewards_*)" in by["B-fig1b"]["summary"]
    assert "[mean_of_model_prompt_medians]" in by["B-fig1b"]["summary"]
    for f in found:
        assert all((out / x).exists() for x in f["files"])
    md = (out / "index.md").read_text()
    assert "[r_avg_ranks" in md and "B_fig1b.png" in md


@real
def test_published_findings_name_statistics_count_distinct_runs_and_reconcile(paper_b_published):
    found, tmp_path = paper_b_published
    by = {f["id"]: f for f in found}
    assert "[mean_of_model_prompt_medians]" in by["B-fig1"]["summary"]
    assert "[mean_of_model_means]" in by["B-fig1-rmfast"]["summary"]
    rm = by["B-fig1-rmfast"]["summary"]  # issue 52 §1: the paper's family ×4, the pooled tests apart
    assert "0/4 of the paper's panel tests" in rm and "smallest attainable p 0.0048" in rm
    assert "Exploratory, rmfast's addition chosen after the data" in rm and "(12/210)" in rm
    assert "[mean_of_model_framing_differences]" in rm
    assert "×10; smallest attainable p 0.0048 (210 relabellings), 0.048 after Bonferroni ×10" in \
        by["B-fig1b-rmfast"]["summary"]
    lmm_b = by["B-fig1b-lmm"]["summary"]  # issue 52 §3
    assert "base_modelLlama -71.63 is Llama − Gemma at the reference cell (Authority, positive framing)" in lmm_b
    assert "marginal contrast" in lmm_b and "did NOT converge" in lmm_b
    assert "-4.17 / -5.81 / -4.21" in by["B-fig1-summaries"]["summary"]
    units = by["B-fig1-units"]["summary"]
    assert "independent" in units and "random slope" in units
    mixed = pd.read_csv(tmp_path / "B_fig1_mixed.csv")
    t = mixed[mixed["term"] == "base_modelLlama:CategoryCommunion"].set_index("random_effects")
    assert t.loc["intercept per model", "coef"] == pytest.approx(8.35, abs=0.01)
    ratio = t.loc["intercept + category slope per model", "se"] / t.loc["intercept per model", "se"]
    assert 3 < ratio < 5  # "roughly quadruples"
    assert by["B-fig1-lmm"]["summary"].count("SE") >= 2
    f4 = by["B-fig4b"]["summary"]
    assert "4/5 distinct runs" in f4 and "uf_13 = uf_27" in f4
    assert "the file's own columns say 85k skywork" in f4
    shape = pd.read_csv(tmp_path / "B_fig4_shape.csv")
    assert set(shape.loc[shape["same_as"].notna(), "run"]) == {"uf_27"}
    assert (tmp_path / "B_fig1.png").stat().st_size > 0


def test_a_measure_equal_for_every_model_gets_no_p_not_zero():
    """A category matched by one word that every model scores best has median rank 1 for every model (the other's
    3): Welch t is 0/0, and the permutation test had given p = 0 (no relabelling reaches a NaN t), Bonferroni 0,
    "***", with a note saying the groups were too small (4 and 6 models). Now no p (NaN) and the note says why; the
    paper's method likewise (R's t.test stops on constant data)."""
    models = [f"org/Gemma-{k}" for k in range(4)] + [f"org/Llama-{k}" for k in range(6)]
    words = ["kind", "bold", "brave", "smart"]
    dic = pd.DataFrame({"term": words, "category": ["C", "A", "A", "A"], "wildcard": False})
    d = pd.DataFrame([{"model": m, "prompt": p, "text": w, "score": s}
                      for m in models for p in ("best thing ever?", "worst thing ever?")
                      for w, s in zip(words, (9.0, 3.0, 2.0, 1.0))])
    res = categories(d, dic, mixed=False)
    perm = res.permutation
    assert len(perm) and perm["t"].isna().all() and perm["p_value"].isna().all(), perm[["t", "p_value"]]
    assert perm["p_bonferroni"].isna().all()
    assert any("the measure is the same for every model (no t, no p)" in n for n in res.notes)
    assert not any("needs at least 2 models per group" in n for n in res.notes)
    paper = categories(d, dic, mixed=False, method="paper").permutation
    assert paper["perm_p_value"].isna().all() and paper["perm_p_bonferroni"].isna().all()
    # a scored text that is no dictionary word is named in a note ("20 rows left out" alone had read as a fault)
    extra = pd.concat([d, d[d["text"] == "kind"].assign(text="discussion", score=0.0)], ignore_index=True)
    notes = categories(extra, dic, mixed=False).notes
    assert any("1 scored text(s) are not words of the dictionary" in n and "'discussion'" in n for n in notes), notes


BIG2 = SHARED_DATA / "iclr2026" / "dict_big2_nouns"


@pytest.mark.skipif(not BIG2.is_dir(), reason=f"published Big Two scores absent ({BIG2})")
def test_the_default_mixed_model_tests_the_group_term_with_the_models_df(tmp_path, capsys):
    """The default (rmfast's) mixed model reported Wald z p-values: the Llama − Gemma term, estimated from 10 models,
    got p = 1.3e-4 where t with nlme's containment df (8, as the paper's fit uses) gives 5.0e-3 (a statistics
    referee's check). Now p_value and the interval are t(df), the z's p is p_z, and a note says the group ×
    category terms count each model's prompts as replicates."""
    out = tmp_path / "mixed.csv"
    rc, _, err = run(["analyze", "categories", BIG2, "--dictionary", SHARED_DATA / "lexicons" / "big2_nouns.csv",
                      "--table", "mixed", "--out", out], capsys)
    assert rc == 0, err
    m = pd.read_csv(out).set_index("term")
    g = m.loc["C(group)[T.Llama]"]
    assert g["df"] == 8 and g["coef"] == pytest.approx(5.5787, abs=1e-3)
    assert g["p_value"] == pytest.approx(5.03e-3, rel=0.01) and g["p_z"] == pytest.approx(1.29e-4, rel=0.01)
    from scipy.stats import t as tdist
    half = tdist.ppf(0.975, 8) * g["se"]
    assert (g["ci_low"], g["ci_high"]) == pytest.approx((g["coef"] - half, g["coef"] + half))
    assert (m.drop(index="C(group)[T.Llama]")["df"] == 1064).all()
    assert "for those terms read the permutation table" in err
