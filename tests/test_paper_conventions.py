"""Paper B's statistics as a reader sees them (issue 36): one sign direction named in the
column, ``--method paper`` fits the paper's mixed model, one permutation-count default, every
statistic named in its table, and counts that count what their sentence says.

The published-data tests skip when ``../shared/data`` is absent."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy.stats")
pytest.importorskip("statsmodels")

from rmfast.cli import build_parser, main

from conftest import SHARED_DATA

IC = SHARED_DATA / "iclr2026"
MFD = IC / "dict_MFD_20"
MFD_DIC = SHARED_DATA / "lexicons" / "mfd2.0.dicx"
mfd = pytest.mark.skipif(not (MFD.is_dir() and MFD_DIC.exists()),
                         reason=f"published MFD 2.0 scores absent ({MFD})")


_RESULTS: dict = {}


def _table(tmp_path, capsys, table: str, method: str = "paper") -> pd.DataFrame:
    """One table of ``rmfast analyze categories MFD --method METHOD`` (the CLI's own parse and
    run; each method is run once per session: the mixed model takes a while)."""
    from rmfast.cli.analyze import _inputs, _run

    if method not in _RESULTS:
        args = build_parser().parse_args(["analyze", "categories", str(MFD), "--dictionary",
                                          str(MFD_DIC), "--method", method])
        _RESULTS[method] = _run("categories", args, _inputs(args).scans, None).tables()
    return _RESULTS[method][table].copy()


@mfd
def test_categories_cli_gives_one_sign_direction_named_in_the_column(tmp_path, capsys):
    """The permutation table said Gemma − Llama (+12.71), the summaries Llama − Gemma (−12.71)."""
    perm = _table(tmp_path, capsys, "permutation").set_index(["framing", "category"])
    summ = _table(tmp_path, capsys, "summaries")
    summ = summ[summ["statistic"] == "mean_of_model_prompt_medians"].set_index(
        ["framing", "category"])
    assert "llama_minus_gemma" in perm.columns and "llama_minus_gemma" in summ.columns
    assert "diff" not in perm.columns and "diff" not in summ.columns
    panel = ("negative", "Authority")
    assert perm.loc[panel, "llama_minus_gemma"] == pytest.approx(-12.71, abs=0.005)
    assert np.allclose(perm["llama_minus_gemma"], summ.loc[perm.index, "llama_minus_gemma"])
    assert (np.sign(perm["t"]) == np.sign(perm["llama_minus_gemma"])).all()
    assert np.allclose(perm["llama_minus_gemma"], perm["mean_b"] - perm["mean_a"])


@mfd
def test_method_paper_fits_the_papers_mixed_model(tmp_path, capsys):
    """Positive framing as reference, nlme's t(8) for the base term: −71.63, p 9.2e-5 (statsmodels'
    default coding gave −12.71 with a z-test)."""
    mixed = _table(tmp_path, capsys, "mixed").set_index("term")
    base = mixed.loc["base_modelLlama"]
    assert base["coef"] == pytest.approx(-71.63, abs=0.005)
    assert base["df"] == 8 and base["p_value"] == pytest.approx(9.2e-5, rel=0.01)
    assert "positive framing" in base["reference"] and "nlme" in base["test"]
    ours = _table(tmp_path, capsys, "mixed", method="rmfast")
    assert ours["test"].str.contains("Wald z").all()
    assert ours["reference"].str.contains("framing negative").all()  # says how it differs


def test_one_permutation_count_default_the_authors_9999():
    from rmfast.analysis import agreement, categories, permutation_test
    from rmfast.analysis.representations.representation_rsa import representation_agreement
    from rmfast.analysis.stats.rsa import rsa_test

    args = build_parser().parse_args(["analyze", "categories"])
    assert args.n_perm == 9999
    for fn in (categories, agreement, permutation_test, rsa_test, representation_agreement):
        assert inspect.signature(fn).parameters["n_perm"].default == 9999, fn.__name__


@mfd
def test_every_statistic_is_named_in_its_table(tmp_path, capsys):
    perm = _table(tmp_path, capsys, "permutation")
    assert (perm["n_perm"] == 9999).all()  # the default, named in the output
    assert perm["correction"].eq("Bonferroni ×10").all()
    assert perm["test"].str.startswith("Welch t of Llama − Gemma").all()
    assert perm["test"].str.contains("9,999 permutations").all()
    med = _table(tmp_path, capsys, "medians")
    assert med["statistic"].eq("median over the category's words of their ranks (1 = best)").all()
    summ = _table(tmp_path, capsys, "summaries")
    assert summ["meaning"].notna().all()
    assert summ.loc[summ["statistic"] == "r_avg_ranks", "meaning"].str.contains(
        "Big Two").all()


@mfd
def test_fig1b_summary_does_not_call_its_avg_ranks_the_authors_block(paper_b_published):
    found, tmp_path = paper_b_published  # the whole reproduction, Fig. 1b's part included
    found = {f["id"]: f for f in found}
    # the published folder's two prefixes, all ten RMs: Fig. 1b is drawn by default
    assert "read 10 (4 MFD20_rewards_*, 6 big2_rewards_*)" in found["B-fig1b"]["summary"]
    assert "B_fig1b.png" in found["B-fig1b"]["files"] and (tmp_path / "B_fig1b.png").exists()
    line = found["B-fig1b-summaries"]["summary"]
    assert "block exactly" not in line and "has no such block" in line
    assert "Llama − Gemma" in line


@pytest.mark.skipif(not (SHARED_DATA / "eloeverything").is_dir(), reason="shared data absent")
def test_pvalue_finding_counts_human_model_pairs_apart_from_model_pairs(tmp_path):
    from rmfast.analysis.paper_a.reproduce import reproduce_paper_a

    found = {f["id"]: f for f in reproduce_paper_a(SHARED_DATA, tmp_path)}
    line = found["A-pvalues"]["summary"]
    # 10 models × 3 prompts human–model pairs; the other 45 × 3 pairs are model–model
    assert "of 30 human–model pairs" in line and "of 135 model–model pairs" in line
    assert "165" not in line
