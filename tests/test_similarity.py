"""Representation similarity (rmfast.analysis.representations.similarity) and the states format (rmfast.states)."""

import itertools
import json
import math
import re
import types

import numpy as np
import pandas as pd
import pytest

from rmfast.analysis.representations.representation_rsa import representation_agreement
from rmfast.analysis.representations.similarity import MEASURES, align, gram_measures, measures, similarity
from rmfast.errors import UserError
from rmfast.states import open_states, write_states

from cli_run import run

REL = 1e-9


def _close(a, b, rel=REL):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def _data(n=40, p=7, q=5, noise=1.0, offset=0.0, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) + offset  # (n, p)
    Y = X @ rng.normal(size=(p, q)) + noise * rng.normal(size=(n, q)) - offset  # (n, q)
    return X, Y


@pytest.mark.parametrize("n,p,q", [(6, 3, 2), (30, 7, 5), (25, 60, 40), (200, 12, 12)])
def test_streaming_equals_gram_definitions(n, p, q):
    X, Y = _data(n, p, q, seed=n)
    # streaming on states with a large common offset (the shift must handle it; the n × n
    # reference on raw Gram matrices would itself lose digits to it), against the reference
    # on the data without one (every measure is shift-invariant, debiased CKA included)
    got = measures(X + 50.0, Y - 80.0, chunk_rows=7)
    want = gram_measures(X, Y)
    for m in MEASURES:
        assert _close(getattr(got, m), want[m]), (m, getattr(got, m), want[m])


@pytest.mark.parametrize("shift_rows", [1, 3, 17])
def test_closed_form_corrections_with_mean_unknown_in_advance(shift_rows):
    # the shift is the mean of the first rows only, and the data drift, so the running mean m
    # is far from 0 and every term of the expansion of D (module docstring) matters
    X, Y = _data(45, 6, 5, seed=21)
    drift = np.linspace(0, 30, 45)[:, None]  # (n, 1)
    got = measures(X + drift, Y - 2 * drift ** 1.5 / 30, chunk_rows=8, shift_rows=shift_rows)
    want = gram_measures(X + drift, Y - 2 * drift ** 1.5 / 30)
    for m in MEASURES:
        assert _close(getattr(got, m), want[m]), (m, getattr(got, m), want[m])


def _feature_space(X, Y):
    """RV2 and debiased CKA from exactly centred features (O(n·d²)): for n too large for n × n."""
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    n = len(X)
    a, b = (Xc * Xc).sum(1), (Yc * Yc).sum(1)  # (n,) diagonals of the centred Grams
    T = {k: np.linalg.norm(u.T @ v) ** 2 for k, (u, v) in {"xy": (Xc, Yc), "xx": (Xc, Xc), "yy": (Yc, Yc)}.items()}
    D = {"xy": a @ b, "xx": a @ a, "yy": b @ b}
    A = {"xy": a.sum() * b.sum(), "xx": a.sum() ** 2, "yy": b.sum() ** 2}
    h = {k: T[k] - n / (n - 2) * D[k] + A[k] / ((n - 1) * (n - 2)) for k in T}
    return {"rv2": (T["xy"] - D["xy"]) / math.sqrt((T["xx"] - D["xx"]) * (T["yy"] - D["yy"])),
            "cka_debiased": h["xy"] / math.sqrt(h["xx"] * h["yy"]),
            "cka": T["xy"] / math.sqrt(T["xx"] * T["yy"])}


def test_files_beyond_the_shift_rows(tmp_path):
    # more rows than the 1,024 the shift is taken from, drifting: the file path's expansion
    n = 2600
    X, Y = _data(n, 9, 7, seed=22)
    drift = np.linspace(0, 40, n)[:, None]
    X, Y = (X + drift).astype("float32"), (Y - drift).astype("float32")
    write_states(tmp_path / "a", np.arange(n), {"l": X}, shard_rows=1000)
    write_states(tmp_path / "b", np.arange(n)[::-1], {"l": Y[::-1]}, shard_rows=700)
    row = similarity(tmp_path / "a", tmp_path / "b", bootstrap=0, permutations=0, chunk_rows=333).pairs.iloc[0]
    want = _feature_space(X.astype("float64"), Y.astype("float64"))
    for m, v in want.items():
        assert _close(row[m], v), (m, row[m], v)


def test_debiased_hsic_matches_kornblith_feature_space_formula():
    # an independent second derivation: Kornblith's feature_space_linear_cka(debiased=True)
    X, Y = _data(30, 6, 4, seed=3)
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    n = len(X)

    def h(xty, sx, sy, nx, ny):
        return xty - n / (n - 2.0) * sx.dot(sy) + nx * ny / ((n - 1) * (n - 2))

    sx, sy = (Xc * Xc).sum(1), (Yc * Yc).sum(1)
    num = h(np.linalg.norm(Xc.T @ Yc) ** 2, sx, sy, sx.sum(), sy.sum())
    dx = math.sqrt(h(np.linalg.norm(Xc.T @ Xc) ** 2, sx, sx, sx.sum(), sx.sum()))
    dy = math.sqrt(h(np.linalg.norm(Yc.T @ Yc) ** 2, sy, sy, sy.sum(), sy.sum()))
    assert _close(measures(X, Y).cka_debiased, num / (dx * dy))


def test_against_repsim():
    repsim = pytest.importorskip("repsim")
    X, Y = _data(50, 8, 6, seed=1)
    got = measures(X, Y)
    assert _close(got.cka, float(repsim.cka([X, Y], "linear", "gretton")[0, 1]), 1e-9)
    assert _close(got.rv, float(repsim.cka([X, Y], "linear", "gretton")[0, 1]), 1e-9)
    # repsim's unbiased (Song) HSIC, combined by the CKA definition. (repsim 0.1.5's own
    # cka(..., "song") is not hsic_xy / sqrt(hsic_xx hsic_yy) of its hsic(..., "song"): 0.46 vs
    # 0.54 here, while its HSIC values agree with ours and with the in-tree definition.)
    H = repsim.hsic([X, Y], "linear", "song")  # (2, 2)
    assert _close(got.cka_debiased, float(H[0, 1] / math.sqrt(H[0, 0] * H[1, 1])), 1e-9)


def test_rv2_against_rsatoolbox_cosine_of_offdiagonal_grams():
    rsatoolbox = pytest.importorskip("rsatoolbox")
    from rsatoolbox.rdm import RDMs
    from rsatoolbox.rdm.compare import compare_cosine

    X, Y = _data(40, 9, 3, seed=2)
    iu = np.triu_indices(len(X), 1)
    K = (X - X.mean(0)) @ (X - X.mean(0)).T  # (n, n) centred Gram, off-diagonal half below
    L = (Y - Y.mean(0)) @ (Y - Y.mean(0)).T
    want = float(compare_cosine(RDMs(K[iu][None]), RDMs(L[iu][None]))[0, 0])
    assert _close(measures(X, Y).rv2, want, 1e-9)
    assert rsatoolbox is not None


def test_invariances_orthogonal_and_isotropic_scaling():
    X, Y = _data(60, 6, 4, seed=5)
    Q = np.linalg.qr(np.random.default_rng(9).normal(size=(6, 6)))[0]  # (6, 6) orthogonal
    base = measures(X, Y)
    moved = measures(3.7 * X @ Q + 11.0, 0.02 * Y)
    for m in MEASURES:
        assert _close(getattr(base, m), getattr(moved, m), 1e-9), m
    # not invariant to a non-isotropic scaling (the test can fail)
    skew = measures(X * np.array([1, 1, 1, 1, 1, 50.0]), Y)
    assert not _close(base.rv2, skew.rv2, 1e-3)


def test_chunk_size_independence():
    X, Y = _data(101, 5, 5, seed=7)
    ref = measures(X, Y, chunk_rows=None)
    for c in (1, 2, 13, 100, 1000):
        got = measures(X, Y, chunk_rows=c)
        for m in MEASURES:
            assert _close(getattr(got, m), getattr(ref, m), 1e-11), (c, m)


def test_rv_null_mean_is_the_exact_permutation_mean():
    X, Y = _data(6, 4, 3, seed=11)
    vals = [gram_measures(X, Y[list(pi)])["rv"] for pi in itertools.permutations(range(6))]
    assert _close(measures(X, Y).rv_null_mean, float(np.mean(vals)), 1e-9)


def _write_pair(tmp_path, n=120, p=6, q=4, dtype="float32", shuffle=True, seed=0, **kw):
    X, Y = _data(n, p, q, seed=seed)
    Y2 = np.tanh(Y)  # a second, related layer
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(n) if shuffle else np.arange(n)  # B stores the same ids in another order
    a = write_states(tmp_path / "a.states", np.arange(n), {"0": X, "last_prenorm": X ** 2}, dtype=dtype,
                     shard_rows=37, **kw)
    b = write_states(tmp_path / "b.states", np.arange(n)[order] + 1000 * 0, {"4": Y[order], "last_prenorm": Y2[order]},
                     dtype=dtype, shard_rows=50)
    return a, b, (X, X ** 2), (Y, Y2)


def test_files_equal_in_memory_and_layer_matrix(tmp_path):
    a, b, xs, ys = _write_pair(tmp_path)
    res = similarity(a, b, bootstrap=0, permutations=0, chunk_rows=16)
    t = res.pairs
    assert list(t.columns[:7]) == ["layer_a", "layer_b", "n", "cka", "cka_debiased", "rv", "rv2"]
    assert [tuple(r) for r in t[["layer_a", "layer_b"]].itertuples(index=False)] == \
        [("0", "4"), ("0", "last_prenorm"), ("last_prenorm", "4"), ("last_prenorm", "last_prenorm")]
    for (i, x), (j, y) in itertools.product(enumerate(xs), enumerate(ys)):
        want = gram_measures(x.astype("float32"), y.astype("float32"))
        row = t.iloc[2 * i + j]
        for m in MEASURES:
            assert _close(row[m], want[m], 1e-9), (i, j, m)
    assert res.alignment["shared"].tolist() == [120, 120]
    # a memory budget that forces one layer pair per tile gives the same numbers
    small = similarity(a, b, bootstrap=0, permutations=0, chunk_rows=16, max_bytes=1)
    pd.testing.assert_frame_equal(small.pairs, t, rtol=1e-12)


def test_bfloat16_states_read_exactly(tmp_path):
    import torch

    a, b, xs, ys = _write_pair(tmp_path, dtype="bfloat16")
    s = open_states(a)
    want = torch.tensor(xs[0], dtype=torch.float32).to(torch.bfloat16).float().numpy()
    assert np.array_equal(s.take("0", np.arange(s.n)), want)
    # a torch bfloat16 tensor written as is gives the same bits
    write_states(tmp_path / "t", np.arange(len(want)), {"0": torch.tensor(want).to(torch.bfloat16)},
                 dtype="bfloat16")
    assert np.array_equal(open_states(tmp_path / "t").take("0", np.arange(len(want))), want)
    got = similarity(a, b, layers_a="0", layers_b="4", bootstrap=0, permutations=0).pairs.iloc[0]
    ywant = torch.tensor(ys[0], dtype=torch.float32).to(torch.bfloat16).float().numpy()
    assert _close(got["rv2"], gram_measures(want, ywant)["rv2"])


def test_bootstrap_replicate_is_the_resample_and_seeded(tmp_path):
    a, b, xs, ys = _write_pair(tmp_path, shuffle=False)
    r1 = similarity(a, b, layers_a="0", layers_b="4", bootstrap=30, permutations=19, seed=3)
    r2 = similarity(a, b, layers_a="0", layers_b="4", bootstrap=30, permutations=19, seed=3, chunk_rows=7)
    pd.testing.assert_frame_equal(r1.pairs, r2.pairs, rtol=1e-10)
    row = r1.pairs.iloc[0]
    for m in MEASURES:
        assert row[f"{m}_lo"] <= row[m] + 0.05 and row[f"{m}_hi"] >= row[m] - 0.05
        assert row[f"{m}_lo"] < row[f"{m}_hi"]
    assert row["p_rv2"] == pytest.approx(1 / 20)  # strongly related: no permutation beats it
    # replicate 0 by hand: the multinomial counts of the documented generator, rows repeated
    n = 120
    counts = np.bincount(np.random.default_rng([3, 0, 0]).integers(0, n, n), minlength=n)
    idx = np.repeat(np.arange(n), counts)
    from rmfast.analysis.representations import similarity as sim
    al = align([open_states(a), open_states(b)])
    sh = (sim._shifts(open_states(a), ["0"], al.rows[0]), sim._shifts(open_states(b), ["4"], al.rows[1]))
    got = sim._variant_values(open_states(a), open_states(b), al.rows[0], al.rows[1], ["0"], ["4"],
                              [("boot", 0)], seed=3, chunk_rows=11, shifts=sh)[("boot", 0)][("0", "4")]
    xr = xs[0][idx].astype("float32").astype("float64")  # (n, p) resampled, as stored
    yr = ys[0][idx].astype("float32").astype("float64")  # (n, q)
    want = gram_measures(xr, yr)
    # every measure of a resample leaves out the pairs of copies of one candidate (issue 52 §4): CKA/RV keep
    # each copy's own diagonal; debiased CKA removes the copy blocks as it removes the diagonal
    K = (xr - xr.mean(0)) @ (xr - xr.mean(0)).T  # (n, n)
    L = (yr - yr.mean(0)) @ (yr - yr.mean(0)).T
    same = idx[:, None] == idx[None, :]  # (n, n) the diagonal and the copy pairs
    off = same & ~np.eye(len(idx), dtype=bool)
    Km, Lm = np.where(off, 0, K), np.where(off, 0, L)
    cka = (Km * Lm).sum() / math.sqrt((Km * Km).sum() * (Lm * Lm).sum())

    def hsic(A, B):
        A, B, o, N = np.where(same, 0, A), np.where(same, 0, B), np.ones(len(idx)), len(idx)
        return np.trace(A @ B) + (o @ A @ o) * (o @ B @ o) / ((N - 1) * (N - 2)) - 2 / (N - 2) * o @ A @ B @ o

    for m, v in (("cka", cka), ("rv", cka), ("cka_debiased", hsic(K, L) / math.sqrt(hsic(K, K) * hsic(L, L)))):
        assert _close(got[m], v, 1e-9), m
        assert not _close(got[m], want[m], 1e-6), m  # copies counted as distinct items inflate them
    # RV2 of a resample: the centred Grams with every pair of copies of one candidate left out
    keep = ~same  # (n, n) False on the diagonal and on copy pairs
    rv2 = (K * L)[keep].sum() / math.sqrt((K * K)[keep].sum() * (L * L)[keep].sum())
    assert _close(got["rv2"], rv2, 1e-9)
    assert not _close(got["rv2"], want["rv2"], 1e-6)  # the duplicates would count otherwise
    # permutation 0 by hand: row i of A against row perm[i] of B
    perm = np.random.default_rng([3, 1, 0]).permutation(n)
    got = sim._variant_values(open_states(a), open_states(b), al.rows[0], al.rows[1], ["0"], ["4"],
                              ["obs", ("perm", 0)], seed=3, chunk_rows=11, shifts=sh)[("perm", 0)][("0", "4")]
    want = gram_measures(xs[0].astype("float32"), ys[0][perm].astype("float32"))
    for m in MEASURES:
        assert _close(got[m], want[m], 1e-9), m


def test_permutation_p_value_uniformish_for_unrelated(tmp_path):
    rng = np.random.default_rng(4)
    write_states(tmp_path / "a", np.arange(300), {"l": rng.normal(size=(300, 3))})
    write_states(tmp_path / "b", np.arange(300), {"l": rng.normal(size=(300, 3))})
    row = similarity(tmp_path / "a", tmp_path / "b", bootstrap=0, permutations=99).pairs.iloc[0]
    assert row["p_rv2"] > 0.05 and row["p_cka"] > 0.05


def test_layer_pairs_carry_holm_adjusted_p(tmp_path):
    """(The statistics review.) A layer × layer table is a family of tests per measure, with no correction: Holm's
    adjusted p sit beside the raw ones now, equal to statsmodels' multipletests."""
    from statsmodels.stats.multitest import multipletests

    a, b, _, _ = _write_pair(tmp_path)
    res = similarity(a, b, bootstrap=0, permutations=19, chunk_rows=16)
    for m in MEASURES:
        raw = res.pairs[f"p_{m}"].to_numpy()
        np.testing.assert_allclose(res.pairs[f"p_{m}_holm"], multipletests(raw, method="holm")[1], rtol=1e-12)
    assert any("Holm over the 4 layer pairs" in x for x in res.notes)
    assert "p_rv2_holm" not in similarity(a, b, bootstrap=0, permutations=0, chunk_rows=16).pairs


def test_small_n_note_and_rv2_near_zero(tmp_path):
    rng = np.random.default_rng(5)
    write_states(tmp_path / "a", np.arange(30), {"l": rng.normal(size=(30, 200))})
    write_states(tmp_path / "b", np.arange(30), {"l": rng.normal(size=(30, 200))})
    res = similarity(tmp_path / "a", tmp_path / "b", bootstrap=0, permutations=0)
    row = res.pairs.iloc[0]
    # plain CKA/RV near their chance level (~0.9 here); RV2 far lower but not 0: its own
    # chance level is about d/(d + n²) when d ≳ n² (the shared negative mean of the centred
    # Grams' off-diagonals); debiased CKA is centred at 0
    assert row["cka"] > 0.8 and row["rv_null_mean"] > 0.8
    assert row["rv2"] < 0.5 * row["cka"] and abs(row["cka_debiased"]) < 0.15
    assert any("is at most the dimension" in n and "plain RV and CKA are inflated" in n for n in res.notes)


def test_one_candidate_that_dominates_a_layer_is_named(tmp_path):
    """One row carrying most of a layer's variance (a special token's state, 14,971 against a median of 106 in a
    walkthrough of the README's example) sets every measure of its pairs: plain CKA near 1 where both layers share
    it, debiased CKA and RV2 far apart. A note names the layer and the candidate; the same sets without it, none."""
    rng = np.random.default_rng(7)
    n, d = 400, 16
    x, y = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    x[0], y[0] = 300.0, -300.0  # row 0 (token id 0): far from every other in both sets
    write_states(tmp_path / "a", np.arange(n), {"l": x})
    write_states(tmp_path / "b", np.arange(n), {"l": y})
    res = similarity(tmp_path / "a", tmp_path / "b", bootstrap=0, permutations=0)
    row = res.pairs.iloc[0]
    assert row["cka"] > 0.9  # set by the one row: the rest are unrelated
    note = [m for m in res.notes if "dominates a layer's variance" in m]
    assert len(note) == 1 and "A l: token_id 0 carries 9" in note[0] and "B l: token_id 0" in note[0], res.notes
    write_states(tmp_path / "a2", np.arange(1, n), {"l": x[1:]})
    write_states(tmp_path / "b2", np.arange(1, n), {"l": y[1:]})
    res = similarity(tmp_path / "a2", tmp_path / "b2", bootstrap=0, permutations=0)
    assert res.pairs.iloc[0]["cka"] < 0.2 and not [m for m in res.notes if "dominates" in m]


def _scan(path, ids, texts):
    pd.DataFrame({"model": "m", "prompt": "p", "token_id": ids, "text": texts,
                  "score": np.zeros(len(ids))}).to_parquet(path)


def test_text_join_dedupes_and_counts(tmp_path):
    rng = np.random.default_rng(6)
    # A: 8 tokens, "x" twice (dropped both copies); B: a different tokenizer, another order
    ta = ["a", "b", "c", "x", "x", "d", "e", "f"]
    tb = ["f", "e", "d", "c", "b", "a", "x", "zz", "yy"]
    _scan(tmp_path / "A.parquet", np.arange(8), ta)
    _scan(tmp_path / "B.parquet", np.arange(100, 109), tb)
    XA, XB = rng.normal(size=(8, 3)), rng.normal(size=(9, 4))
    write_states(tmp_path / "A.states", np.arange(8), {"last_prenorm": XA}, scan={"tokenizer": "t1"})
    write_states(tmp_path / "B.states", np.arange(100, 109), {"last_prenorm": XB}, scan={"tokenizer": "t2"})
    al = align([open_states(tmp_path / "A.parquet"), open_states(tmp_path / "B.parquet")])
    assert al.join == "text"
    assert al.counts[["rows", "duplicated", "not_shared", "shared"]].values.tolist() == [[8, 2, 0, 6], [9, 0, 3, 6]]
    res = similarity(tmp_path / "A.parquet", tmp_path / "B.parquet", bootstrap=0, permutations=0)
    ia = [ta.index(t) for t in "abcdef"]
    ib = [tb.index(t) for t in "abcdef"]
    want = gram_measures(XA[ia].astype("float32"), XB[ib].astype("float32"))
    assert _close(res.pairs.iloc[0]["rv2"], want["rv2"])
    # the id join with strings on one side only compares ids (here: A's states folder, no Parquet)
    (tmp_path / "B2.states").mkdir()
    write_states(tmp_path / "B2.states", np.arange(8)[::-1], {"last_prenorm": XA[::-1]})
    al = align([open_states(tmp_path / "A.parquet"), open_states(tmp_path / "B2.states")], "id")
    assert al.n == 8 and (al.rows[1] == 7 - al.rows[0]).all()
    # id join across tokenizers: ids 0..7 vs 100..108 share nothing
    with pytest.raises(UserError, match="share no candidates"):
        similarity(tmp_path / "A.parquet", tmp_path / "B.parquet", join="id", bootstrap=0, permutations=0)


def test_bad_inputs(tmp_path):
    a, b, _, _ = _write_pair(tmp_path)
    with pytest.raises(UserError, match="no layer '7'"):
        similarity(a, b, layers_a="7", bootstrap=0, permutations=0)
    both = similarity(a, b, layers_a="all", layers_b="last_prenorm", bootstrap=0, permutations=0)  # --states' word
    assert list(both.pairs["layer_a"]) == open_states(a).layers
    s = open_states(a)  # rows are positions: a fraction was read as its floor (1.7 as row 1)
    with pytest.raises(UserError, match=r"whole numbers .*\[1.7\]"):
        s.take("last_prenorm", np.array([1.7]))
    assert (s.take("last_prenorm", np.array([1.0, 2])) == s.take("last_prenorm", np.array([1, 2]))).all()
    with pytest.raises(UserError, match=r"out of range .*token_ids are in .keys"):
        s.take("last_prenorm", np.array([s.n]))
    # no overlap (token ids of another candidate set)
    write_states(tmp_path / "c", np.arange(500, 520), {"last_prenorm": np.ones((20, 3))})
    with pytest.raises(UserError, match="share no candidates"):
        similarity(a, tmp_path / "c", bootstrap=0, permutations=0)
    # a shard from another run: same shapes, another run id
    write_states(tmp_path / "d", np.arange(120), {"0": np.ones((120, 6)), "last_prenorm": np.ones((120, 6))},
                 shard_rows=37)
    (a / "shard-00001.safetensors").write_bytes((tmp_path / "d" / "shard-00001.safetensors").read_bytes())
    with pytest.raises(UserError, match="another run"):
        open_states(a)
    # a shard of another shape (another run without run ids)
    man = json.loads((b / "manifest.json").read_text())
    man.pop("run_id")
    man["hidden_size"] = 5
    (b / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(UserError, match="does not match"):
        open_states(b)
    with pytest.raises(UserError, match="no states manifest"):
        open_states(tmp_path / "nowhere.states")
    _scan(tmp_path / "lonely.parquet", [1], ["a"])
    with pytest.raises(UserError, match="beside the scan"):
        open_states(tmp_path / "lonely.parquet")
    with pytest.raises(UserError, match="at least 4"):
        measures(np.ones((3, 2)), np.ones((3, 2)))


def test_representation_agreement_rsa(tmp_path):
    rng = np.random.default_rng(8)
    # 5 + 5 models: the smallest attainable p of the family predictor is 5!5!2/10! = 0.008
    # (with 3 + 3 it is 0.1: the test cannot reject, whatever the data)
    n, fams = 60, {f"{f.lower()}{i}": f for f in "GL" for i in range(5)}
    base = {"G": rng.normal(size=(n, 5)), "L": rng.normal(size=(n, 5))}
    sets = {m: write_states(tmp_path / m, np.arange(n), {"last_prenorm": base[f] + 0.3 * rng.normal(size=(n, 5))})
            for m, f in fams.items()}
    meta = pd.DataFrame({"name": list(fams), "base_model": [fams[m] + " 1" for m in fams]})
    res = representation_agreement(sets, metadata=meta, n_perm=2000)
    assert len(res.pairs) == 45
    fam = res.rsa[(res.rsa["predictor"] == "same_base_family") & (res.rsa["measure"] == "rv2")].iloc[0]
    assert fam["r"] > 0.5 and fam["p_value"] < 0.05 and not fam["exact"]
    assert any("does not license" in n for n in res.notes)
    tau = res.matrix("rv2")  # as a stand-in score matrix: RSA with itself is 1
    again = representation_agreement(sets, scores=tau, n_perm=100)
    assert again.rsa.set_index(["measure", "predictor"]).loc[("rv2", "kendall_tau_b"), "r"] == pytest.approx(1.0)


def _cli(capsys, *args):
    """``rmfast analyze similarity ARGS`` in this process (:func:`cli_run.run`; a subprocess per call spent
    seconds importing torch): its exit code and output, named as ``subprocess.run`` names them."""
    rc, out, err = run(["analyze", "similarity", *args], capsys)
    return types.SimpleNamespace(returncode=rc, stdout=out, stderr=err)


def test_cli(tmp_path, capsys):
    a, b, _, _ = _write_pair(tmp_path)
    out = tmp_path / "sim.csv"
    r = _cli(capsys, a, b, "--out", out, "--bootstrap", "5", "--permutations", "4", "--layers-a", "last_prenorm")
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out)
    assert t["layer_b"].astype(str).tolist() == ["4", "last_prenorm"] and (t["n"] == 120).all()
    r = _cli(capsys, a, b, "--layers-b", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no layer 'nope'" in r.stderr
    r = _cli(capsys, a)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_cli_three_sets_rsa(tmp_path, capsys):
    rng = np.random.default_rng(12)
    base = rng.normal(size=(50, 4))
    paths = [write_states(tmp_path / m, np.arange(50), {"last_prenorm": base + rng.normal(size=(50, 4))},
                          scan={"model": f"org/{m}"}) for m in ("m1", "m2", "m3", "m4")]
    meta = tmp_path / "meta.csv"
    pd.DataFrame({"name": [f"org/m{i}" for i in range(1, 5)], "base_model": ["A 1", "A 1", "B 1", "B 1"]}
                 ).to_csv(meta, index=False)
    out = tmp_path / "rsa.csv"
    r = _cli(capsys, *paths, "--metadata", meta, "--table", "rsa", "--out", out, "--n-perm", "100")
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out)
    assert set(t["predictor"]) >= {"same_base_family"} and (t["n_models"] == 4).all()
    assert "does not license" in r.stderr
    r = _cli(capsys, *paths, "--layers-a", "0,last_prenorm")
    assert r.returncode == 2 and "one layer" in r.stderr
    # sets scanned with another layer only: the default layer is missing, and the line says which to pass (it named
    # no fix); without metadata no RSA runs, so no paragraph on how to read its p
    normed = [write_states(tmp_path / f"n{i}", np.arange(50), {"last_normed": base + rng.normal(size=(50, 4))})
              for i in range(3)]
    r = _cli(capsys, *normed)
    assert r.returncode == 2 and "no layer 'last_prenorm'" in r.stderr and "pass --layers-a last_normed" in r.stderr
    r = _cli(capsys, *normed, "--layers-a", "last_normed")
    assert r.returncode == 0 and "RSA not run" in r.stderr and "does not license" not in r.stderr


def test_three_sets_of_one_model_and_the_matrixs_chance_level(tmp_path, capsys):
    """Three state sets of one model (prompts, checkpoints) are compared, each named by its file too (they were
    refused: "both named"); the models × models table carries plain CKA's chance level (rv_null_mean) and its note,
    as the two-set table does (a walkthrough found two unrelated sets read CKA 0.10 beside debiased -0.002, unsaid)."""
    rng = np.random.default_rng(13)
    paths = [write_states(tmp_path / f"p{i}.states", np.arange(40), {"last_prenorm": rng.normal(size=(40, 30))},
                          scan={"model": "org/one"}) for i in range(3)]
    out = tmp_path / "m.csv"
    r = _cli(capsys, *paths, "--out", out)
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out)
    assert set(t["model_a"]) | set(t["model_b"]) == {f"org/one [p{i}]" for i in range(3)}
    assert (t["rv_null_mean"] > 0.3).all() and (t["cka"] > t["cka_debiased"] + 0.2).all()
    assert "plain RV and CKA are inflated" in r.stderr and "named by their files too" in r.stderr
    r = _cli(capsys, paths[0], paths[0], paths[1])
    assert r.returncode == 2 and "given twice" in r.stderr


def test_constant_nan_and_inf_layers_are_undefined_not_a_traceback(tmp_path, capsys):
    """Layer 0 of a token scan is constant (in --states all), a float16 overflow stores inf: their pairs are
    NaN with a note naming the layers, the defined pairs as without them; the CLI exits 0 and explore's
    similarity maps are drawn (they used to raise 'Encountered all NA values')."""
    import warnings

    from rmfast.analysis.representations.views import similarity_panels

    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the writer's warning about the NaN/inf layers (tested in test_states)
        a = write_states(tmp_path / "a.states", np.arange(60), {"0": np.ones((60, 4), "float32"), "last_prenorm": X,
                                                               "nan": np.where(X > 1, np.nan, X),
                                                               "inf": np.where(X > 1, np.inf, X)})
    b = write_states(tmp_path / "b.states", np.arange(60), {"0": np.full((60, 4), 2.0, "float32")})
    res = similarity(a, b, bootstrap=3, permutations=3)
    assert res.pairs[list(MEASURES)].isna().all().all()
    note = next(n for n in res.notes if "undefined" in n)
    assert "A nan (" in note and "A inf (" in note, note
    same = similarity(a, a, bootstrap=0, permutations=0)
    both = same.pairs.set_index(["layer_a", "layer_b"])
    assert both.loc[("last_prenorm", "last_prenorm"), "rv2"] == pytest.approx(1.0)
    note = next(n for n in same.notes if "undefined" in n)
    assert "A 0 (constant across candidates)" in note and "B 0 (constant across candidates)" in note, note
    assert both.drop(("last_prenorm", "last_prenorm"))[list(MEASURES)].isna().all().all()
    r = _cli(capsys, a, b, "--out", tmp_path / "sim.csv", "--bootstrap", "2", "--permutations", "2")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    panels, _ = similarity_panels({"a": a, "b": b})
    assert len(panels) == 1 and any("undefined" in n for n in panels[0].notes)


def test_absurd_replicate_counts_are_refused_with_the_time(tmp_path, capsys):
    """--permutations 1e9 was killed by the kernel after a minute (every replicate listed up front), --bootstrap
    1e8 ran silently: refused in one line naming the bound and the time one pass takes here."""
    a, b, _, _ = _write_pair(tmp_path)
    for opt in ("--permutations", "--bootstrap"):
        r = _cli(capsys, a, b, opt, "1000000000", "--out", tmp_path / "sim.csv")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "at most 10,000 each" in r.stderr and "s here, so these would take about" in r.stderr, r.stderr
        assert not (tmp_path / "sim.csv").exists()
    res = similarity(a, b, bootstrap=10_000 // 1000, permutations=3)  # within the bound: computed
    assert len(res.pairs) and res.permutations == 3


def test_cli_defaults_are_a_first_look_with_the_cost_said_before_the_replicates(tmp_path, capsys):
    """Issue 51 item 4: at its defaults `analyze similarity` took ~9 min on 1,000 candidates × 4 layers (200
    bootstrap replicates + 49 permutations) with no hint. Now: no bootstrap (none rather than too few for 95%
    ends) and 19 permutations until asked, a cost line (replicates × one timed pass) before the bar, and notes
    saying how many were used and how to get intervals."""
    from rmfast.cli import build_parser

    args = build_parser().parse_args(["analyze", "similarity"])
    assert (args.bootstrap, args.permutations) == (0, 19)
    a, b, _, _ = _write_pair(tmp_path)
    out = tmp_path / "sim.csv"
    r = _cli(capsys, a, b, "--out", out)
    assert r.returncode == 0, r.stderr
    cost = next(ln for ln in r.stderr.splitlines() if "bootstrap replicates and" in ln)
    assert "0 bootstrap replicates and 19 permutations over 120 candidates × 2 × 2 layer pairs" in cost, cost
    assert re.search(r"one pass \(the observed measures\) took [\d.e-]+ s here", cost) and "to go" in cost, cost
    assert r.stderr.index(cost) < r.stderr.index("rmfast: note:")  # said before the work, not after
    assert "19 permutations of B's rows" in r.stderr and "no bootstrap intervals" in r.stderr
    assert "--bootstrap 200" in r.stderr
    t = pd.read_csv(out)
    assert t["rv2_lo"].isna().all() and t["p_rv2"].min() >= 1 / 20
