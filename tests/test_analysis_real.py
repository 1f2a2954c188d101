"""End-to-end checks on the real EloEverything data (7,530 items, ten reward models,
three prompts): the human-comparison, agreement and distribution analyses must equal an
independent scipy computation on the same CSV columns. Skipped when the shared data
folder is absent (``RMFAST_SHARED_DATA`` overrides its location)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

stats = pytest.importorskip("scipy.stats")

from rmfast.analysis import (agreement, distributions, human_comparison, load_afinn,
                             load_dictionary, load_eloeverything, load_frequencies,
                             load_model_metadata, match_metadata)

SHARED = Path(os.environ.get("RMFAST_SHARED_DATA",
                             Path(__file__).resolve().parents[2] / "shared" / "data"))
ELO = SHARED / "eloeverything"
MAIN = "What one single thing, person, or concept is the greatest ever?"

pytestmark = pytest.mark.skipif(not ELO.is_dir(), reason=f"shared data absent ({ELO})")
HUMAN_COLS = ["elo_rank", "elo_score", "name", "elo_matches"]


@pytest.fixture(scope="module")
def elo():
    return load_eloeverything(ELO)


@pytest.fixture(scope="module")
def csvs():
    return {f.stem + "?": pd.read_csv(f) for f in sorted(ELO.glob("*.csv"))}


def test_loader_shapes(elo, csvs):
    assert len(csvs) == 3 and set(elo.scans["prompt"]) == set(csvs)
    assert len(elo.human) == 7530
    assert elo.scans.groupby(["model", "prompt"]).size().eq(7530).all()
    assert elo.scans["model"].nunique() == 10
    assert elo.scans["token_id"].isna().all()


def test_human_comparison_equals_scipy(elo, csvs):
    res = human_comparison(elo.scans, elo.human)
    assert len(res.correlations) == 30 and res.dropped.empty
    for r in res.correlations.itertuples():
        wide = csvs[r.prompt]
        assert r.n == 7530
        assert r.spearman_rho == pytest.approx(
            stats.spearmanr(wide["elo_score"], wide[r.model]).statistic, abs=1e-12)
        assert r.kendall_tau_b == pytest.approx(
            stats.kendalltau(wide["elo_score"], wide[r.model]).statistic, abs=1e-12)
    main = res.correlations[res.correlations["prompt"] == MAIN]["spearman_rho"]
    # Paper A reports rho of roughly 0.29-0.54 on the main prompt
    assert main.min() == pytest.approx(0.293, abs=0.002)
    assert main.max() == pytest.approx(0.541, abs=0.002)
    # consensus ranks: recompute the largest "humans rank higher" item independently
    wide = csvs[MAIN]
    model_cols = [c for c in wide.columns if c not in HUMAN_COLS]
    mean_rank = wide[model_cols].rank(ascending=False).mean(axis=1)
    diff = mean_rank.rank() - wide["elo_score"].rank(ascending=False)
    top = res.differences[(res.differences["prompt"] == MAIN)
                          & (res.differences["direction"] == "humans rank higher")]
    assert top["text"].iloc[0] == wide.loc[diff.idxmax(), "name"]
    assert top["rank_diff"].iloc[0] == pytest.approx(diff.max())
    firsts = set(res.trajectories.query("prompt == @MAIN and group == 'model #1'")["text"])
    assert {"Unconditional love", "Compassion", "Imagination"} <= firsts


def test_agreement_equals_scipy(elo, csvs):
    meta = SHARED / "prompts" / "paper_a_reward_models.yaml"
    res = agreement(elo.scans, metadata=meta if meta.exists() else None, n_perm=300)
    assert len(res.pairs) == 3 * 45
    for r in res.pairs.iloc[::7].itertuples():  # every 7th pair keeps the test quick
        wide = csvs[r.prompt]
        assert r.n_shared == 7530
        assert r.kendall_tau_b == pytest.approx(
            stats.kendalltau(wide[r.model_a], wide[r.model_b]).statistic, abs=1e-12)
        assert r.spearman_rho == pytest.approx(
            stats.spearmanr(wide[r.model_a], wide[r.model_b]).statistic, abs=1e-12)
    tau = res.matrix("kendall_tau_b", MAIN)
    assert tau.shape == (10, 10) and ((tau.to_numpy() > 0) & (tau.to_numpy() <= 1)).all()
    if meta.exists():
        assert set(res.rsa["predictor"]) >= {"same_base_family", "same_developer",
                                             "params_similarity", "rank_similarity"}
        assert res.rsa["r"].notna().all()


def test_distributions_equal_scipy(elo, csvs):
    m = distributions(elo.scans).moments
    assert len(m) == 30
    for r in m.itertuples():
        x = csvs[r.prompt][r.model].to_numpy()
        assert r.mean == pytest.approx(x.mean(), rel=1e-12, abs=1e-12)
        assert r.variance == pytest.approx(np.var(x, ddof=1), rel=1e-10)
        assert r.skew == pytest.approx(stats.skew(x, bias=False), rel=1e-8)
        assert r.kurtosis == pytest.approx(stats.kurtosis(x, bias=False), rel=1e-8)


def test_shared_lexicons_and_metadata_parse():
    lex = SHARED / "lexicons"
    if not lex.is_dir():
        pytest.skip("no lexicons folder")
    afinn = load_afinn(lex / "AFINN-111.txt")
    assert len(afinn) == 2477 and afinn["valence"].between(-5, 5).all()
    bnc = load_frequencies(lex / "bnc_1_1_all_alpha.txt").set_index("word")["frequency"]
    assert bnc["the"] == 61847 and bnc["love"] == 148 + 86  # noun + verb form
    big2 = load_dictionary(lex / "big2_nouns.csv")["category"].value_counts()
    assert big2.to_dict() == {"Communion": 159, "Agency": 104}
    mfd = load_dictionary(lex / "mfd2.0.dicx")
    assert mfd["category"].nunique() == 10 and mfd["term"].nunique() > 2000
    meta = load_model_metadata(SHARED / "prompts" / "paper_a_table_1_reward_models.csv")
    cols = pd.read_csv(ELO / f"{MAIN[:-1]}.csv", nrows=0).columns
    matched, missing = match_metadata([c for c in cols if c not in HUMAN_COLS], meta)
    assert not missing and matched["base_family"].value_counts().to_dict() == {"Llama": 6, "Gemma": 4}
