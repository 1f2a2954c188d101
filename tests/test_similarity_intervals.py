"""Bootstrap intervals of the similarity measures contain their estimate (issue 36 §6): CKA's
replicates sit above the estimate (a resample's copies of a candidate count as distinct items),
so a plain percentile interval can miss it; the bias-corrected interval cannot."""

from __future__ import annotations

import numpy as np
import pytest

from rmfast.analysis.representations.similarity import MEASURES, MIN_TRUSTED_BOOTSTRAP, bootstrap_interval, similarity
from rmfast.cli import build_parser
from rmfast.states import write_states


def test_interval_contains_an_estimate_below_every_replicate():
    """The issue's case: debiased CKA 0.1886, every replicate above it."""
    boot = np.random.default_rng(0).uniform(0.194, 0.525, 10)  # (10,)
    lo, hi = bootstrap_interval(0.1886, boot)
    assert lo <= 0.1886 <= hi
    # the width is the replicates' spread, moved to sit around the estimate
    assert hi - lo == pytest.approx(np.quantile(boot, 0.975) - np.quantile(boot, 0.025))
    assert np.isnan(bootstrap_interval(0.5, np.array([np.nan]))[0])


def test_similarity_intervals_contain_their_estimates_where_replicates_are_biased(tmp_path):
    """n = 40 candidates of unrelated 48-d states: CKA/RV's resamples are inflated."""
    rng = np.random.default_rng(1)
    n, d = 40, 48
    write_states(tmp_path / "a.states", np.arange(n), {"last_prenorm": rng.normal(size=(n, d)).astype("float32")})
    write_states(tmp_path / "b.states", np.arange(n), {"last_prenorm": rng.normal(size=(n, d)).astype("float32")})
    res = similarity(tmp_path / "a.states", tmp_path / "b.states", bootstrap=30, permutations=0)
    row = res.pairs.iloc[0]
    for m in MEASURES:
        assert row[f"{m}_lo"] <= row[m] <= row[f"{m}_hi"], (m, row[f"{m}_lo"], row[m], row[f"{m}_hi"])
        assert row[f"{m}_lo"] < row[f"{m}_hi"]
    assert any("bias-corrected" in n and "30 replicates are too few" in n for n in res.notes)


def test_default_replicates_are_enough_for_95_percent_ends():
    import inspect

    assert MIN_TRUSTED_BOOTSTRAP >= 200
    assert inspect.signature(similarity).parameters["bootstrap"].default == MIN_TRUSTED_BOOTSTRAP
    # the CLI's first look asks for none (issue 51 item 4), never for too few
    assert build_parser().parse_args(["analyze", "similarity"]).bootstrap in (0, MIN_TRUSTED_BOOTSTRAP)
