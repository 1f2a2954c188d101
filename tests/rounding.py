"""What is bit-identical and what agrees only to fp32 rounding (README: "What is bit-identical,
what agrees to rounding"), and the tolerance the tests use for the latter.

Bit-identical: the same rows on the same device, dtype, batch shapes (rows per batch, padded
length) and thread count, with the same library versions -- a rerun, a sweep part against the
same scan run directly, a checkpoint resumed on the same batch boundaries.

To rounding only: whatever changes the order of the fp32 sums -- other batch sizes (the GEMM
blocking follows M), other thread counts (each thread sums its own slice), other processes that
differ in either (torchrun ranks, --shard jobs, a resumed run re-batched), compiled vs eager.

The tolerance is derived, not guessed. For two fp32 evaluations a, b of the same exact value x,
``|a - b| <= |a - x| + |b - x|``. x is taken as the float64 evaluation r of the same weights on
the same rows: its own error is ~2**-53 relative (2**29 times below fp32's), plus the rounding of
r to fp32 when scan stores it, at most ``u * |r|`` with ``u = 2**-24`` (fp32's unit roundoff). The
error of one fp32 evaluation order is therefore bounded by what is measured on it,

    E = max_i |a_i - r_i| + u * max_i |r_i|,

and another order of the same sums makes errors of the same size (measured: the largest error
moves by < 25% between thread counts and batch sizes), so two runs agree within ``2 * E``.
A difference beyond that is not rounding: another row, prompt, template or padding.
"""

from __future__ import annotations

import numpy as np

from rmfast.bench.baselines import U32, fp32_rounding_tol  # noqa: F401 - the one definition (U32 re-exported)


def fp32_error(a, ref64) -> float:
    """E: the largest error of the fp32 scores ``a`` against their float64 evaluation ``ref64``."""
    a, r = np.asarray(a, np.float64), np.asarray(ref64, np.float64)
    assert a.shape == r.shape and np.isfinite(r).all()
    return fp32_rounding_tol(a, r) / 2.0


def assert_agree_to_rounding(a, b, ref64, groups=None) -> dict:
    """``|a - b| <= 2 E`` row by row, E measured on ``a`` against ``ref64`` (per group, e.g. per model:
    each model has its own magnitudes). Returns {group: (max |a - b|, 2 E)} for messages."""
    a, b, r = (np.asarray(x, np.float64) for x in (a, b, ref64))
    groups = np.zeros(len(a), int) if groups is None else np.asarray(groups)
    out = {}
    for g in dict.fromkeys(groups.tolist()):
        k = groups == g
        tol = 2.0 * fp32_error(a[k], r[k])
        d = np.abs(a[k] - b[k])
        worst = int(np.argmax(d))
        assert d.max() <= tol, (f"{g}: {int((d > tol).sum())} of {int(k.sum())} rows differ by more than fp32 rounding "
                                f"2E = {tol:.3g}: {a[k][worst]:.9g} != {b[k][worst]:.9g} (float64 {r[k][worst]:.9g})")
        out[g] = (float(d.max()), tol)
    return out


def assert_same_rows_scores_to_rounding(a, b, ref64) -> dict:
    """Two results-store frames (``load_results(..., token_ids=True)``) of the same sweep: every
    column but score and rank identical, scores within 2 E per model, ranks equal except among
    near-ties (rows whose scores are within 2 E of each other may swap)."""
    import pandas as pd

    rest = [c for c in a.columns if c not in ("score", "rank")]
    pd.testing.assert_frame_equal(a[rest], b[rest])
    bounds = assert_agree_to_rounding(a["score"], b["score"], ref64, groups=a["model"])
    keys = ["model", "prompt", "candidates"]
    for key, g in a.assign(_r=np.asarray(ref64), _rank_b=b["rank"].to_numpy()).groupby(keys, sort=False):
        tol = bounds[key[0]][1]
        s = g["score"].to_numpy(np.float64)
        moved = g["rank"].to_numpy() != g["_rank_b"].to_numpy()
        for i in np.flatnonzero(moved):  # a rank may move by at most the rows tied with it within 2 E
            ties = int((np.abs(s - s[i]) <= 2 * tol).sum()) - 1
            assert abs(int(g["rank"].iloc[i]) - int(g["_rank_b"].iloc[i])) <= ties, (key, g.iloc[i].to_dict())
    return bounds


def float64_scores(df, folders: dict, **scan_kw) -> np.ndarray:
    """The float64 evaluation of every row of a results-store frame (model, prompt, candidates,
    token_id or text), the models loaded from ``folders[model]`` as the sweep loads them, then
    cast to float64. Returned in the frame's row order."""
    from rmfast.scoring.pipeline import score_texts
    from rmfast.loading.loader import load
    from rmfast.scoring.pipeline import scan

    out = np.full(len(df), np.nan)
    pos = np.arange(len(df))
    models = {}
    for (m, prompt, _), g in df.groupby(["model", "prompt", "candidates"], sort=False):
        if m not in models:
            lm = load(str(folders[m]), dtype="float32", device="cpu")
            models[m] = (lm.model.double(), lm.tokenizer)
        model, tok = models[m]
        k = pos[df.index.get_indexer(g.index)]
        if g["token_id"].notna().all():
            ids = g["token_id"].astype(np.int64).to_numpy()
            res = scan(model, tok, prompt, token_ids=ids, progress=False, **scan_kw)
            got = dict(zip(res.token_ids.tolist(), res.scores.tolist()))
            out[k] = [got[i] for i in ids.tolist()]
        else:
            res = score_texts(model, tok, prompt, g["text"].tolist(), progress=False, **scan_kw)
            got = dict(zip(res.texts, res.scores.tolist()))
            out[k] = [got[t] for t in g["text"]]
    assert np.isfinite(out).all()
    return out
