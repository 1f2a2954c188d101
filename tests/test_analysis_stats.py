"""Known-answer tests for every statistic of the analysis layer (synthetic data with
planted effects; each value is also checked against an independent scipy/statsmodels
computation where one exists)."""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import pandas as pd
import pytest

stats = pytest.importorskip("scipy.stats")
sm = pytest.importorskip("statsmodels.api")

from rmfast.analysis.paper_b.categories import POOLED
from rmfast.analysis import (agreement, best_worst, categories, distributions, exposure,
                             extremes, human_comparison, mds, permutation_test, rbo, rsa_test,
                             sentiment)
from rmfast.analysis.paper_a.best_worst import ALL_MODELS, pick_prompts
from rmfast.analysis.stats.regression import ols
from rmfast.analysis.stats.rsa import predictor_matrices
from rmfast.errors import UserError

BEST, WORST = "What, in one word, is the best thing ever?", "What, in one word, is the worst thing ever?"


def _frame(model, prompt, texts, scores):
    return pd.DataFrame({"model": model, "prompt": prompt, "text": list(texts),
                         "score": np.asarray(scores, dtype="float64")})


# ---------------------------------------------------------------- distributions
def test_distribution_moments_planted_and_equal_to_scipy():
    rng = np.random.default_rng(0)
    normal = rng.normal(5.0, 2.0, 50_000)
    expo = rng.exponential(1.0, 50_000)  # skew 2, excess kurtosis 6
    df = pd.concat([_frame("norm", "p", map(str, range(len(normal))), normal),
                    _frame("expo", "p", map(str, range(len(expo))), expo)])
    m = distributions(df).moments.set_index("model")
    assert m.loc["norm", "mean"] == pytest.approx(5.0, abs=0.05)
    assert m.loc["norm", "variance"] == pytest.approx(4.0, rel=0.03)
    assert abs(m.loc["norm", "skew"]) < 0.05 and abs(m.loc["norm", "kurtosis"]) < 0.1
    assert m.loc["expo", "skew"] == pytest.approx(2.0, abs=0.15)
    assert m.loc["expo", "kurtosis"] == pytest.approx(6.0, abs=1.0)
    for name, x in (("norm", normal), ("expo", expo)):
        assert m.loc[name, "n"] == len(x)
        assert m.loc[name, "variance"] == pytest.approx(np.var(x, ddof=1), rel=1e-12)
        assert m.loc[name, "skew"] == pytest.approx(stats.skew(x, bias=False), rel=1e-10)
        assert m.loc[name, "kurtosis"] == pytest.approx(stats.kurtosis(x, bias=False), rel=1e-10)
        assert m.loc[name, "median"] == pytest.approx(np.median(x))


# ---------------------------------------------------------------- RBO
def _rbo_by_definition(a, b, p):
    """RBO_ext straight from Webber et al. (sets at every depth)."""
    ra = list(np.argsort(-np.asarray(a), kind="stable"))
    rb = list(np.argsort(-np.asarray(b), kind="stable"))
    k = len(ra)
    total = 0.0
    for d in range(1, k + 1):
        total += len(set(ra[:d]) & set(rb[:d])) / d * p**d
    x_k = len(set(ra) & set(rb))
    return x_k / k * p**k + (1 - p) / p * total


def test_rbo_known_values():
    assert rbo(np.arange(50.0), np.arange(50.0), p=0.9) == pytest.approx(1.0)
    assert rbo([3, 2, 1, 0], [0, 1, 2, 3], p=0.5) == pytest.approx(5 / 24)
    rng = np.random.default_rng(1)
    for p in (0.5, 0.9, 0.98):
        a, b = rng.normal(size=60), rng.normal(size=60)
        assert rbo(a, b, p=p) == pytest.approx(_rbo_by_definition(a, b, p), rel=1e-12)
    with pytest.raises(UserError):
        rbo([1, 2], [1, 2], p=1.0)


# ---------------------------------------------------------------- MDS
def test_mds_recovers_a_planar_configuration():
    rng = np.random.default_rng(2)
    pts = rng.normal(size=(7, 2))
    delta = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    fit = mds(delta)
    got = np.sqrt(((fit.coords[:, None] - fit.coords[None]) ** 2).sum(-1))
    assert fit.stress1 < 1e-6
    np.testing.assert_allclose(got, delta, atol=1e-6)


def test_mds_stress1_is_kruskals():
    """stress-1 is Kruskal's, sqrt(Σ (d − δ)² / Σ d²) over the fitted distances d (it had been divided by Σ δ²,
    the dissimilarities': 0.256 where Kruskal's gives 0.265 on EloEverything; a referee's check)."""
    rng = np.random.default_rng(4)
    pts = rng.normal(size=(8, 5))  # 5-d points in 2-d: a fit that cannot be perfect
    delta = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    fit = mds(delta)
    d = np.sqrt(((fit.coords[:, None] - fit.coords[None]) ** 2).sum(-1))
    iu = np.triu_indices(8, 1)
    want = np.sqrt(((d[iu] - delta[iu]) ** 2).sum() / (d[iu] ** 2).sum())
    assert fit.stress1 == pytest.approx(want, rel=1e-9) and 0.05 < want
    assert fit.stress1 != pytest.approx(np.sqrt(((d[iu] - delta[iu]) ** 2).sum() / (delta[iu] ** 2).sum()), rel=1e-4)


# ---------------------------------------------------------------- RSA
def _family_tau(fams, within=0.7, across=0.3, noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    n = len(fams)
    t = np.where(np.equal.outer(fams, fams), within, across) + rng.normal(0, noise, (n, n))
    t = (t + t.T) / 2
    np.fill_diagonal(t, 1.0)
    return t


def test_rsa_detects_planted_family_structure():
    fams = np.array(list("GGGLLLLL"))
    idx = [f"m{i}" for i in range(len(fams))]
    obs = pd.DataFrame(_family_tau(fams), idx, idx)
    meta = pd.DataFrame({"base_family": fams, "base": fams, "developer": list("abcdefgh"),
                         "params_b": [27, 27, 2, 8, 8, 8, 3, 8.0],
                         "leaderboard_rank": range(8)}, index=idx)
    preds = predictor_matrices(meta)
    res = rsa_test(obs, preds["same_base_family"], n_perm=50_000)
    # tau is high exactly where the predictor is 1; only relabellings that keep the 3/5
    # partition (3! 5! of 8!) match it: exact p = 1 / C(8, 3) = 1/56
    assert res["r"] > 0.8 and res["exact"] and res["n_perm"] == 40320
    assert res["p_value"] == pytest.approx(1 / 56)
    sampled = rsa_test(obs, preds["same_base_family"], n_perm=2000, seed=1)
    assert not sampled["exact"] and abs(sampled["p_value"] - 1 / 56) < 0.012
    assert np.isnan(rsa_test(obs, preds["same_developer"], n_perm=100)["r"])  # constant


def test_rsa_exact_permutation_p_equals_brute_force():
    rng = np.random.default_rng(3)
    n = 5
    idx = list("abcde")
    obs = rng.normal(size=(n, n))
    obs = pd.DataFrame(obs + obs.T, idx, idx)
    pred = rng.normal(size=(n, n))
    pred = pd.DataFrame(pred + pred.T, idx, idx)
    res = rsa_test(obs, pred, n_perm=1000)
    assert res["exact"] and res["n_perm"] == math.factorial(n)
    iu = np.triu_indices(n, 1)
    o = obs.to_numpy()[iu]
    r_obs = stats.spearmanr(o, pred.to_numpy()[iu]).statistic
    assert res["r"] == pytest.approx(r_obs)
    rs = [stats.spearmanr(o, pred.to_numpy()[np.ix_(pp, pp)][iu]).statistic
          for pp in map(list, permutations(range(n)))]
    assert res["p_value"] == pytest.approx(np.mean(np.array(rs) >= r_obs - 1e-12))


# ---------------------------------------------------------------- agreement
def _latent_models(n=400, seed=4):
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=n)
    texts = [f"w{i}" for i in range(n)]
    noise = {"org/G-gemma-a": 0.3, "org/G-gemma-b": 0.3, "org/L-llama-a": 1.5,
             "org/L-llama-b": 1.5}
    frames = [_frame(m, BEST, texts, latent + s * rng.normal(size=n)) for m, s in noise.items()]
    return pd.concat(frames, ignore_index=True)


def test_agreement_equals_scipy_and_orders_pairs():
    df = _latent_models()
    # a duplicated string in one model must vanish from the shared vocabulary
    df = pd.concat([df, _frame("org/G-gemma-a", BEST, ["w0"], [9.0])], ignore_index=True)
    res = agreement(df, n_perm=200)
    wide = df[df["text"] != "w0"].pivot(index="text", columns="model", values="score")
    for r in res.pairs.itertuples():
        x, y = wide[r.model_a].to_numpy(), wide[r.model_b].to_numpy()
        assert r.n_shared == len(wide) == 399
        assert r.kendall_tau_b == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
        assert r.spearman_rho == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        assert r.rbo == pytest.approx(_rbo_by_definition(x, y, 0.9), abs=1e-9)
    tau = res.matrix("kendall_tau_b")
    assert tau.loc["org/G-gemma-a", "org/G-gemma-b"] > tau.loc["org/G-gemma-a", "org/L-llama-a"]
    assert np.allclose(tau, tau.T) and np.allclose(np.diag(tau), 1)
    voc = res.vocabulary.set_index("model")
    assert voc.loc["org/G-gemma-a", "duplicated"] == 2 and voc.loc["org/G-gemma-a", "shared"] == 399
    assert set(res.mds["model"]) == set(tau.index)
    assert res.rsa.empty and any("RSA not run" in n for n in res.notes)


def test_agreement_over_two_candidate_sets_names_a_fix_that_works():
    """A sweep of two models over a word set and an item set: each set is its own 'model [set]', and a word set and
    an item set share no string, so agreement stopped with "use the text join (--join text)", the join it was using
    (a new user's walk). The line now names the sets and the fixes that work (one set's models, or pooling)."""
    from rmfast.analysis.data.scans import by_candidate_set
    from rmfast.errors import read_by_cli

    rng = np.random.default_rng(0)
    frames = [_frame(m, BEST, texts, rng.normal(size=len(texts))).assign(candidates=c)
              for m in ("org/A", "org/B") for c, texts in (("words", ["w1", "w2", "w3", "w4"]),
                                                           ("items", ["i1", "i2", "i3", "i4"]))]
    df = by_candidate_set(pd.concat(frames, ignore_index=True))
    with read_by_cli(), pytest.raises(UserError, match=r"the candidate sets 'words', 'items' share no text .* "
                                                       r"--models 'org/A \[items\]' 'org/B \[items\]', or rank the "
                                                       r"sets together with --pool-candidates") as e:
        agreement(df, n_perm=0)
    assert "join text" not in str(e.value)
    res = agreement(df[df["model"].str.endswith("[items]")], n_perm=0)  # the named fix works
    assert len(res.pairs) == 1


def test_agreement_with_metadata_and_a_missing_prompt():
    df = _latent_models()
    extra = _latent_models(seed=5).assign(prompt=WORST)
    extra = extra[extra["model"] != "org/L-llama-b"]  # one model lacks the worst prompt
    meta = pd.DataFrame({"name": sorted(df["model"].unique()),
                         "base_model": ["Gemma", "Gemma", "Llama", "Llama"],
                         "size": ["2B", "27B", "8B", "8B"], "reward_bench_rank": [1, 2, 3, 4]})
    res = agreement(pd.concat([df, extra]), metadata=meta, n_perm=100)
    assert set(res.pairs.loc[res.pairs["prompt"] == WORST, "model_b"]) <= {
        "org/G-gemma-b", "org/L-llama-a"}
    assert any("org/L-llama-b has no rows" in n for n in res.notes)
    assert {"same_base_family", "params_similarity", "rank_similarity"} <= set(res.rsa["predictor"])
    assert len(res.matrix("rbo", WORST)) == 3


def test_agreement_says_what_a_referee_asks_of_its_numbers():
    """(The statistics review.) The pairs table printed p = 0.0 for 42 of 45 real pairs with no note (an underflow,
    noted in the human table only); RBO broke tied scores in an arbitrary order with no count of them; the RSA's
    Monte-Carlo p did not record its seed."""
    rng = np.random.default_rng(3)
    n = 3000
    latent = rng.normal(size=n)
    texts = [f"w{i}" for i in range(n)]
    frames = [_frame(f"org/M{k}-{fam}", BEST, texts, (latent + 0.05 * rng.normal(size=n)).round(1 if k == 0 else 15))
              for k, fam in enumerate(["gemma", "gemma", "llama", "llama", "llama", "qwen", "qwen", "qwen"])]
    df = pd.concat(frames, ignore_index=True)
    meta = pd.DataFrame({"name": sorted(df["model"].unique()), "base_model": ["Gemma"] * 2 + ["Llama"] * 3 + ["Qwen"] * 3,
                         "size": ["2B", "27B", "8B", "8B", "70B", "7B", "14B", "72B"],
                         "reward_bench_rank": list(range(1, 9))})
    res = agreement(df, metadata=meta, n_perm=200)
    assert (res.pairs["kendall_p"] == 0).sum() > 0  # the case itself: below the smallest double
    assert any("printed as 0 are below ~1e-308" in x for x in res.notes)
    m0 = res.pairs["model_a"] == "org/M0-gemma"
    assert (res.pairs.loc[m0, "tied_a"] > 2000).all() and (res.pairs.loc[~m0, ["tied_a", "tied_b"]] == 0).all().all()
    assert any("7 of 28 pairs rank tied scores" in x for x in res.notes), res.notes
    assert any("RSA p-values: one-sided (greater), each test alone: 5 tests" in x for x in res.notes)
    tested = res.rsa.dropna(subset=["r"])
    assert len(tested) >= 3 and not tested["exact"].any() and (tested["seed"] == 0).all() and (tested["n_perm"] == 200).all()
    # the figure's stars say what the ledger says: one-sided, uncorrected over the figure's tests (it said neither)
    from rmfast.analysis.render.plots import rsa_bars

    assert (res.rsa["alternative"] == "greater").all()
    title = rsa_bars(res.rsa).axes[0].get_title()
    assert f"one-sided (greater), each of {len(tested)} tests uncorrected" in title, title


# ---------------------------------------------------------------- regression / sentiment
def test_ols_matches_statsmodels():
    rng = np.random.default_rng(6)
    x1, x2 = rng.normal(size=200), rng.normal(size=200)
    y = 1 + 2 * x1 - 0.5 * x2 + rng.normal(size=200)
    fit = ols(y, x1, x2)
    ref = sm.OLS(y, sm.add_constant(np.column_stack([x1, x2]))).fit()
    np.testing.assert_allclose(fit.coef, ref.params, rtol=1e-10)
    np.testing.assert_allclose(fit.se, ref.bse, rtol=1e-10)
    np.testing.assert_allclose(fit.p, ref.pvalues, rtol=1e-8)
    assert fit.r2 == pytest.approx(ref.rsquared)
    # HC3 (the statistics review: a reward's residual variance changes with valence; classical SEs were all there
    # was, off by up to 15% on a real scan): statsmodels' own, on residuals whose spread grows with x1
    y_het = 1 + 2 * x1 + (0.2 + np.abs(x1)) * rng.normal(size=200)
    fit, ref = ols(y_het, x1, x2), sm.OLS(y_het, sm.add_constant(np.column_stack([x1, x2]))).fit(cov_type="HC3")
    np.testing.assert_allclose(fit.se_hc3, ref.bse, rtol=1e-10)
    assert not np.allclose(fit.se, ref.bse, rtol=0.05)  # the case itself: classical SEs differ
    tvals = fit.coef / fit.se_hc3
    from scipy.stats import t as tdist
    np.testing.assert_allclose(fit.p_hc3, 2 * tdist.sf(np.abs(tvals), 197), rtol=1e-10)
    # a row alone at its level (every word but one at one valence) has leverage 1: HC3 is undefined, not a number
    lone = ols(rng.normal(size=10), [2.0] * 9 + [4.0])
    assert np.isfinite(lone.se).all() and np.isnan(lone.se_hc3).all() and np.isnan(lone.p_hc3).all()
    # a one-row dummy moves only its own coefficient: the others keep statsmodels' HC3 (the second recheck)
    y2, dummy = rng.normal(size=60), np.eye(60)[7]
    fit = ols(y2, x1[:60], dummy)
    ref = sm.OLS(y2, sm.add_constant(np.column_stack([x1[:60], dummy]))).fit(cov_type="HC3")
    np.testing.assert_allclose(fit.se_hc3[:2], ref.bse[:2], rtol=1e-8)
    assert np.isnan(fit.se_hc3[2])
    assert ols([1.0, 2.0], [0.0, 1.0]) is None  # too few rows


def _afinn_like(n_per_level=40):
    words, val = [], []
    for v in [-5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5]:
        for i in range(n_per_level):
            words.append(f"v{v}_{i}")
            val.append(v)
    return pd.DataFrame({"word": words, "valence": val})


def test_sentiment_recovers_planted_slopes_and_framing():
    lex = _afinn_like()
    rng = np.random.default_rng(7)
    frames = []
    # best prompt: steep for positive words (2.0), shallow for negative (0.5); worst: reverse
    for prompt, pos, neg in ((BEST, 2.0, 0.5), (WORST, 0.4, 1.5)):
        for m in ("A", "B"):
            v = lex["valence"].to_numpy()
            s = np.where(v > 0, pos * v, neg * v) + rng.normal(0, 0.5, len(v))
            texts = list(lex["word"].str.upper())  # matching ignores case
            frames.append(_frame(m, prompt, texts + ["zzz"], np.append(s, 0.0)))
    res = sentiment(pd.concat(frames), lex, standardize=False)
    s = res.slopes.set_index(["model", "prompt", "sign"])
    for m in ("A", "B"):
        for prompt, pos, neg in ((BEST, 2.0, 0.5), (WORST, 0.4, 1.5)):
            for sign, planted in (("positive", pos), ("negative", neg)):
                row = s.loc[(m, prompt, sign)]
                assert abs(row["slope"] - planted) < 4 * row["se"]
                g = res.tokens[(res.tokens["model"] == m) & (res.tokens["prompt"] == prompt)
                               & ((res.tokens["valence"] > 0) == (sign == "positive"))]
                ref = stats.linregress(g["valence"], g["score"])
                assert row["slope"] == pytest.approx(ref.slope, rel=1e-10)
                assert row["se"] == pytest.approx(ref.stderr, rel=1e-10)
                assert row["n"] == 200
    assert set(res.slopes["framing"]) == {"positive", "negative"}
    summ = res.summary.set_index(["framing", "sign"])
    assert summ.loc[("positive", "positive"), "mean_slope"] > summ.loc[("positive", "negative"), "mean_slope"]
    assert summ.loc[("negative", "negative"), "mean_slope"] > summ.loc[("negative", "positive"), "mean_slope"]
    d = res.dropped
    assert d.loc[d["step"] == "valence sign", "rows"].sum() == 4 * 40  # valence 0 words
    assert d.loc[d["step"] == "afinn join", "rows"].sum() == 4  # "zzz"


def test_sentiment_standardized_slopes_are_scale_free():
    lex = _afinn_like(5)
    v = lex["valence"].to_numpy()
    base = np.where(v > 0, 2.0 * v, 0.5 * v) + np.linspace(-0.1, 0.1, len(v))
    df = pd.concat([_frame("A", BEST, lex["word"], base), _frame("B", BEST, lex["word"], 100 * base + 7)])
    s = sentiment(df, lex).slopes.set_index(["model", "sign"])["slope"]
    assert s[("A", "positive")] == pytest.approx(s[("B", "positive")])
    assert s[("A", "negative")] == pytest.approx(s[("B", "negative")])


# ---------------------------------------------------------------- exposure
def test_exposure_recovers_planted_frequency_slope():
    rng = np.random.default_rng(8)
    n = 500
    words = [f"w{i}" for i in range(n)]
    freq = pd.DataFrame({"word": words, "frequency": np.exp(rng.normal(2, 1.5, n))})
    lex = pd.DataFrame({"word": words, "valence": rng.integers(-5, 6, n)})
    score = 0.7 * np.log(freq["frequency"]) + 0.3 * lex["valence"] + rng.normal(0, 0.5, n)
    df = _frame("A", BEST, words + ["unlisted"], np.append(score, 0.0))
    res = exposure(df, freq, lex, standardize=False)
    row = res.slopes.iloc[0]
    X = sm.add_constant(np.column_stack([np.log(freq["frequency"]), lex["valence"]]))
    ref = sm.OLS(score.to_numpy(), X).fit()
    assert row["slope_log_freq"] == pytest.approx(ref.params[1], rel=1e-10)
    assert row["se_log_freq"] == pytest.approx(ref.bse[1], rel=1e-10)
    assert row["slope_valence"] == pytest.approx(ref.params[2], rel=1e-10)
    assert abs(row["slope_log_freq"] - 0.7) < 4 * row["se_log_freq"]
    assert row["n"] == n
    assert res.dropped["rows"].sum() == 1  # "unlisted"


def test_exposure_missing_valence_zero_keeps_unlisted_words():
    words = [f"w{i}" for i in range(30)]
    freq = pd.DataFrame({"word": words, "frequency": np.arange(1, 31.0)})
    lex = pd.DataFrame({"word": words[:10], "valence": [1, -1] * 5})
    df = _frame("A", BEST, words, np.log(np.arange(1, 31.0)))
    drop = exposure(df, freq, lex, standardize=False, min_words=5)
    zero = exposure(df, freq, lex, standardize=False, missing_valence="zero")
    assert drop.slopes.iloc[0]["n"] == 10 and zero.slopes.iloc[0]["n"] == 30
    assert zero.slopes.iloc[0]["slope_log_freq"] == pytest.approx(1.0)
    assert drop.dropped["rows"].sum() == 20


# ---------------------------------------------------------------- best vs worst
def test_best_worst_finds_planted_tokens():
    rng = np.random.default_rng(9)
    base = [f"t{i}" for i in range(200)]
    special = ["both_good", "both_bad", "only_best", "only_worst"]
    texts = base + special
    frames = []
    for m in ("A", "B"):
        b = np.append(rng.normal(size=200), [5.0, -5.0, 5.0, -5.0])
        w = np.append(rng.normal(size=200), [5.0, -5.0, -5.0, 5.0])
        frames += [_frame(m, BEST, texts, b), _frame(m, WORST, texts, w)]
    res = best_worst(pd.concat(frames), k=1)
    e = res.extremes.set_index(["model", "measure", "end"])["text"]
    for m in ("A", "B", ALL_MODELS):
        assert e[(m, "best+worst", "top")] == "both_good"
        assert e[(m, "best+worst", "bottom")] == "both_bad"
        assert e[(m, "best-worst", "top")] == "only_best"
        assert e[(m, "best-worst", "bottom")] == "only_worst"
    sc = res.scores[res.scores["model"] == "A"]
    assert res.correlations.set_index("model").loc["A", "spearman_rho"] == pytest.approx(
        stats.spearmanr(sc["best"], sc["worst"]).statistic)
    assert res.best_prompt == BEST and res.worst_prompt == WORST


def test_best_worst_prompt_choice_errors():
    with pytest.raises(UserError, match="needs a negatively framed"):
        pick_prompts([BEST, "What is the greatest?"], BEST, None)
    with pytest.raises(UserError, match="need one positive"):
        pick_prompts([BEST, "What is the greatest?", WORST], None, None)
    assert pick_prompts(["Q1", "Q2"], None, None, {"Q1": "positive", "Q2": "negative"}) == ("Q1", "Q2")
    # three positive prompts and no negative one (EloEverything's): the missing negative is said first, where "name
    # the best with --best" had been, whose fix led straight to this (a new user's walk)
    with pytest.raises(UserError, match=r"needs a negatively framed \('worst'\) prompt; none of the 3 prompts is one "
                                        r"\(3 positive, 0 negative"):
        pick_prompts([BEST, "What is the greatest?", "Name the greatest thing."], None, None)


# ---------------------------------------------------------------- human comparison
def test_human_comparison_planted_disagreement():
    rng = np.random.default_rng(10)
    items = [f"item{i}" for i in range(300)]
    human = pd.DataFrame({"text": items, "human_score": np.linspace(2000, 1000, 300)})
    frames = []
    for m in ("A", "B", "C"):
        s = -np.arange(300) + rng.normal(0, 5, 300)  # agrees with humans ...
        s[3] = -1000.0  # ... except item3, which humans love and the models hate
        s[250] = 100.0  # and item250, the reverse
        frames.append(_frame(m, BEST, items, s))
    res = human_comparison(pd.concat(frames), human, k=3)
    for r in res.correlations.itertuples():
        g = frames[["A", "B", "C"].index(r.model)]
        assert r.spearman_rho == pytest.approx(stats.spearmanr(human["human_score"], g["score"]).statistic)
        assert r.kendall_tau_b == pytest.approx(stats.kendalltau(human["human_score"], g["score"]).statistic)
        assert r.spearman_rho > 0.9
    d = res.differences.set_index(["direction", "position"])
    assert d.loc[("humans rank higher", 1), "text"] == "item3"
    assert d.loc[("humans rank higher", 1), "human_rank"] == 4
    assert d.loc[("humans rank higher", 1), "model_rank"] == 300
    assert d.loc[("models rank higher", 1), "text"] == "item250"
    tr = res.trajectories
    assert set(tr["group"]) == {"human top", "human bottom", "model #1"}
    assert set(tr["rater"]) == {"human", "A", "B", "C"}


def test_human_comparison_reports_unmatched_and_bad_items():
    human = pd.DataFrame({"text": ["a", "b", "c", "c", "d"], "human_score": [3, 2, 1, 0, np.nan]})
    df = _frame("A", BEST, ["a", "b", "c", "e"], [3.0, 2.0, 1.0, 0.0])
    res = human_comparison(df, human)
    reasons = res.dropped.groupby("reason")["rows"].sum()
    assert reasons["item without a human score or name"] == 1
    assert reasons["item name occurs more than once among the human scores"] == 2
    assert reasons["scored text has no human score"] == 2  # c (dropped from human) and e
    with pytest.raises(UserError, match="no scored text matches"):
        human_comparison(_frame("A", BEST, ["zz"], [1.0]), human)


# ---------------------------------------------------------------- categories
def _category_data(seed=11):
    rng = np.random.default_rng(seed)
    agency = [f"ag{i}" for i in range(15)]
    communion = [f"co{i}" for i in range(15)]
    dic = pd.DataFrame({"term": agency + communion,
                        "category": ["Agency"] * 15 + ["Communion"] * 15, "wildcard": False})
    models = [f"org/M{i}-{'Gemma' if i < 4 else 'Llama'}" for i in range(8)]
    frames = []
    for m in models:
        pref = 1.0 if "Gemma" in m else -1.0  # Gemma prefers communion, Llama agency
        for prompt, sign in ((BEST, 1.0), (WORST, -1.0)):  # the worst thing: the preferred words score low
            s = sign * np.r_[-pref * np.ones(15), pref * np.ones(15)] + rng.normal(0, 1.0, 30)
            frames.append(_frame(m, prompt, agency + communion, s))
    return pd.concat(frames, ignore_index=True), dic


def test_categories_planted_group_difference():
    df, dic = _category_data()
    res = categories(df, dic, n_perm=10_000)
    med = res.medians
    assert set(med["group"]) == {"Gemma", "Llama"}
    # ranks among the 30 matched words; Gemma ranks communion words better (lower) for the best thing, worse for the
    # worst thing (a preference flips with the framing)
    g = med.groupby(["framing", "group", "category"])["median_rank"].mean()
    assert g[("positive", "Gemma", "Communion")] < g[("positive", "Gemma", "Agency")]
    assert g[("positive", "Llama", "Agency")] < g[("positive", "Llama", "Communion")]
    assert g[("negative", "Gemma", "Communion")] > g[("negative", "Gemma", "Agency")]
    # both framings pooled with the framing's sign: the preference adds up (unsigned, it cancels: p ~ 1)
    perm = res.permutation[res.permutation["framing"] == POOLED].set_index("category")
    # 4 vs 4 models, perfectly separated: the exact two-sided p is 2 / C(8, 4)
    assert perm.loc["Communion", "exact"] and perm.loc["Communion", "n_perm"] == 70
    assert perm.loc["Communion", "p_value"] == pytest.approx(2 / 70)
    assert perm.loc["Agency", "llama_minus_gemma"] < 0 < perm.loc["Communion", "llama_minus_gemma"]
    assert (np.sign(perm["t"]) == np.sign(perm["llama_minus_gemma"])).all()  # one direction
    assert (res.permutation["p_bonferroni"] >= res.permutation["p_value"]).all()
    # balanced design: the fixed effects equal contrasts of the cell means
    mixed = res.mixed.set_index("term")
    cell = med.groupby(["group", "category", "framing"])["median_rank"].mean()
    term = "C(group)[T.Llama]:C(category)[T.Communion]"
    expect = (cell[("Llama", "Communion", "negative")] - cell[("Llama", "Agency", "negative")]
              - cell[("Gemma", "Communion", "negative")] + cell[("Gemma", "Agency", "negative")])
    assert mixed.loc[term, "coef"] == pytest.approx(expect, abs=1e-4)
    assert mixed.loc[term, "coef"] < -10 and mixed.loc[term, "p_value"] < 0.001  # negative framing: reference level
    # each term says what it is: the group term is Llama − Gemma at the reference cell, not a main effect (issue 52)
    assert mixed.loc["C(group)[T.Llama]", "meaning"] == ("(Llama − Gemma) at the reference (category Agency, "
                                                         "framing negative); not a main effect")
    assert mixed.loc[term, "meaning"].startswith("(Llama − Gemma) × (Communion − Agency) at the reference")


def test_permutation_test_against_scipy():
    rng = np.random.default_rng(12)
    v = rng.normal(size=9)
    a = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0], bool)
    ours = permutation_test(v, a, n_perm=10_000)
    welch = stats.ttest_ind(v[a], v[~a], equal_var=False)
    assert ours["t"] == pytest.approx(welch.statistic)
    ref = stats.permutation_test(
        (v[a], v[~a]), lambda x, y: abs(stats.ttest_ind(x, y, equal_var=False).statistic),
        permutation_type="independent", n_resamples=np.inf, alternative="greater")
    assert ours["exact"] and ours["n_perm"] == 126
    assert ours["p_value"] == pytest.approx(ref.pvalue)


def test_categories_rank_within_all_uses_whole_vocabulary():
    dic = pd.DataFrame({"term": ["kind", "bold"], "category": ["C", "A"], "wildcard": False})
    df = _frame("m", BEST, ["kind", "x", "y", "bold", " Kind"], [5.0, 4.0, 3.0, 2.0, 1.0])
    res = categories(df, dic, rank_within="all", word_agg="max", mixed=False)
    w = res.words.set_index("word")
    assert w.loc["kind", "rank"] == 1 and w.loc["bold", "rank"] == 4
    assert w.loc["kind", "n_ranked"] == 5
    assert any("combined per word" in n for n in res.notes)
    # ties among everything scored take their average rank, as among the matched words (was: the best of them)
    df = _frame("m", BEST, ["kind", "x", "bold", "y"], [5.0, 4.0, 4.0, 4.0])
    w = categories(df, dic, rank_within="all", mixed=False).words.set_index("word")
    assert w.loc["bold", "rank"] == 3.0 == stats.rankdata([-5.0, -4.0, -4.0, -4.0])[2]


# ---------------------------------------------------------------- extremes
def test_extremes_top_bottom_and_shared_vocab():
    a = _frame("A", BEST, ["x", "y", "z", "only_a"], [1.0, 2.0, 3.0, 9.0])
    b = _frame("B", BEST, ["x", "y", "z"], [3.0, 2.0, 1.0])
    e = extremes(pd.concat([a, b]), k=1).extremes.set_index(["model", "end"])["text"]
    assert e[("A", "top")] == "only_a" and e[("A", "bottom")] == "x"
    s = extremes(pd.concat([a, b]), k=1, shared_vocab=True)
    es = s.extremes.set_index(["model", "end"])
    assert es.loc[("A", "top"), "text"] == "z" and es.loc[("A", "top"), "rank"] == 2
    assert s.dropped["rows"].sum() == 1


def test_pooled_framing_row_is_the_signed_per_model_test():
    """Both framings pooled: each model's mean rank over positive prompts minus over negative ones, then Welch t over
    models with every relabelling. A Llama preference that holds in both framings (low rank for the best thing,
    high for the worst) is as clear pooled as in each panel: p = 1/210, as an independent exact test finds; the
    unsigned mean of both framings cancelled it."""
    from itertools import combinations

    from rmfast.analysis.data.ledger import Ledger
    from rmfast.analysis.paper_b.categories import _permutations

    rng = np.random.default_rng(0)
    rows = []
    for m in [f"g{i}" for i in range(4)] + [f"l{i}" for i in range(6)]:
        for fr in ("positive", "negative"):
            for k in range(3):
                shift = (-5.0 if fr == "positive" else 5.0) if m[0] == "l" else 0.0
                rows.append({"model": m, "prompt": f"{fr}{k}", "category": "A", "framing": fr,
                             "median_rank": 100 + shift + rng.normal(0, 0.5), "group": "Llama" if m[0] == "l" else "Gemma"})
    med = pd.DataFrame(rows)
    tab = _permutations(med, "median_rank", 9999, 0, Ledger()).set_index("framing")
    pm = med.groupby(["model", "framing", "group"])["median_rank"].mean().unstack("framing").reset_index()
    signed, llama = (pm["positive"] - pm["negative"]).to_numpy(), (pm["group"] == "Llama").to_numpy()
    t0 = stats.ttest_ind(signed[llama], signed[~llama], equal_var=False).statistic
    hits = sum(abs(stats.ttest_ind(signed[list(i)], np.delete(signed, list(i)), equal_var=False).statistic)
               >= abs(t0) - 1e-12 for i in combinations(range(10), 6))
    assert tab.loc[POOLED, "p_value"] == pytest.approx(hits / 210) == pytest.approx(1 / 210)
    assert tab.loc[POOLED, "t"] == pytest.approx(t0) and tab.loc["positive", "p_value"] == pytest.approx(1 / 210)
    assert tab.loc[POOLED, "correction"].startswith("Bonferroni ×1 ")  # its own family (issue 52)
    assert tab.loc["positive", "correction"].startswith("Bonferroni ×2 ")


def test_a_permutation_test_needs_a_relabelling():
    """n_perm=0 (the Python API; the CLI's --n-perm is positive) gave p = 1.0, and an IndexError in RSA."""
    idx = list("abcde")
    m = pd.DataFrame(np.arange(25.0).reshape(5, 5), idx, idx)
    with pytest.raises(UserError, match="n_perm=0"):
        permutation_test(np.arange(6.0), np.arange(6) < 3, n_perm=0)
    with pytest.raises(UserError, match="n_perm=0"):
        rsa_test(m + m.T, m + m.T, n_perm=0)


def test_sentiment_fits_a_word_once_whatever_its_spellings():
    """" w1" beside "w1" (a BPE vocabulary's spellings of one word, the same score): the same slope, SE and p as
    the word once; fitted per token, the SE shrank by ~√2 with no new information."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    val = rng.integers(1, 6, 40)
    score = 0.3 * val + rng.normal(0, 1, 40)
    lex = pd.DataFrame({"word": words, "valence": val})
    one = pd.DataFrame({"model": "m", "prompt": "best?", "text": words, "score": score})
    two = pd.DataFrame({"model": "m", "prompt": "best?", "text": words + [" " + w for w in words],
                        "score": np.r_[score, score]})
    a = sentiment(one, lex, standardize=False).slopes.iloc[0]
    b = sentiment(two, lex, standardize=False).slopes.iloc[0]
    assert b["n"] == b["n_words"] == 40
    for col in ("slope", "se", "p_value"):
        assert b[col] == pytest.approx(a[col])


def test_extremes_shared_vocab_of_one_model_applies_the_rule():
    """A prompt scanned by one model: its "shared vocabulary (papers' rule)" table listed strings the rule drops (a
    walkthrough: ten "\\ufffd" byte tokens as SmolLM2's bottom 10); the rule's de-duplication now applies there too."""
    a = _frame("A", BEST, ["x", "\ufffd", "y", "\ufffd", "z"], [1.0, -9.0, 2.0, -8.0, 3.0])
    e = extremes(a, k=1, shared_vocab=True)
    es = e.extremes.set_index("end")["text"]
    assert es["bottom"] == "x" and es["top"] == "z"
    assert e.dropped["rows"].sum() == 2 and any("its own strings, de-duplicated" in n for n in e.notes)
    assert extremes(a, k=1).extremes.set_index("end")["text"]["bottom"] == "\ufffd"  # everything scored: kept


def test_degenerate_inputs_give_undefined_statistics_not_numbers(tmp_path):
    """From a walk with degenerate models: an RSA whose observed matrix held a NaN (a model with constant scores)
    printed r = NaN beside p = 0.01 (p = 0 when exact); Spearman's p was 0 for |rho| = 1 at any n (3 items: exactly
    1/3) and was then called an underflow; a constant model's footrule was 0.5, more agreement than an unrelated
    model's. Each is now undefined, or exact."""
    import math
    from itertools import permutations

    from rmfast.analysis.stats.rank_stats import footrule, spearman_p
    from rmfast.analysis.stats.rsa import rsa_test

    idx = list("abcde")
    x = np.arange(5.0)
    obs = pd.DataFrame(-abs(x[:, None] - x[None, :]), idx, idx)
    pred = obs.copy()
    obs.loc["a", "b"] = obs.loc["b", "a"] = np.nan
    for n_perm in (99, 9999):  # Monte Carlo and exact (5! = 120 <= 9999)
        got = rsa_test(obs, pred, n_perm=n_perm)
        assert np.isnan(got["r"]) and np.isnan(got["p_value"])
    assert np.isnan(footrule([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]))
    assert spearman_p([1, 2, 3], [10, 20, 30]) == pytest.approx(1 / 3)
    assert spearman_p(range(12), range(12)) == 2 / math.factorial(12)
    # a perfect correlation with ties past the enumerated sizes: the share of the 9! orderings that reach it
    x9 = np.array([1, 1, 2, 3, 4, 5, 5, 6, 7.0])
    r9 = stats.rankdata(x9)
    every = r9[np.array(list(permutations(range(9))))]  # (9!, 9)
    dev = every - every.mean(axis=1, keepdims=True)
    rho = dev @ (r9 - r9.mean()) / np.sqrt((dev * dev).sum(axis=1) * ((r9 - r9.mean()) ** 2).sum())
    assert spearman_p(x9, 2 * x9) == pytest.approx(np.mean(np.abs(rho) >= 1 - 1e-12))
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 3, 6).astype(float), rng.normal(size=6)  # ties in a: average ranks
    ra, rb = stats.rankdata(a), stats.rankdata(b)
    r0 = abs(stats.spearmanr(a, b).statistic)
    want = np.mean([abs(np.corrcoef(ra, rb[list(p)])[0, 1]) >= r0 - 1e-12 for p in permutations(range(6))])
    assert spearman_p(a, b) == pytest.approx(want)


def test_text_with_a_carriage_return_and_nan_in_a_manifest_round_trip(tmp_path):
    """A CSV field holding a lone carriage return (SmolLM2's token 201) was written unquoted and read back as two rows;
    a manifest's NaN (a one-row bf16 audit's Spearman) was written as bare NaN, which JSON.parse refuses."""
    import json

    from rmfast.io import write_csv, write_json

    df = pd.DataFrame({"text": ["a", "\r", "b\rc", "d"], "score": [1.0, np.nan, 2.5, -3.0]})
    write_csv(tmp_path / "t.csv", df)
    back = pd.read_csv(tmp_path / "t.csv")
    assert len(back) == 4 and back["text"].tolist() == df["text"].tolist()
    np.testing.assert_array_equal(back["score"].to_numpy(), df["score"].to_numpy())
    write_json(tmp_path / "m.json", {"bf16_audit": {"spearman": float("nan"), "max": float("inf"), "n": 1}})

    def refuse(c):
        raise ValueError(f"not JSON: {c}")

    assert json.loads((tmp_path / "m.json").read_text(), parse_constant=refuse) == {
        "bf16_audit": {"spearman": None, "max": None, "n": 1}}


def test_a_model_whose_scores_are_all_nan_is_named_when_it_leaves():
    """A model whose every score is NaN left the analyses with only '512 rows left out: validate', and then 'MDS
    needs 3 models, this prompt has 2' after three were given: it is named."""
    from rmfast.analysis.data.ledger import Ledger
    from rmfast.analysis.data.scans import validate_scans

    df = pd.DataFrame({"model": ["a"] * 3 + ["gone"] * 3, "prompt": "p", "text": list("xyz") * 2,
                       "score": [1.0, 2.0, 3.0, np.nan, np.nan, np.inf]})
    led = Ledger()
    out = validate_scans(df, ledger=led)
    assert set(out["model"]) == {"a"}
    assert led.notes == ["model gone is left out for prompt 'p': every one of its 3 scores is missing or not finite"]
