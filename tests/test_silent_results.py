"""Silent wrong results (issue 25): a resume across changed weights, and scores that come out NaN or inf.

Each test here failed before its fix: a rerun after the folder's weights changed resumed the old
model's checkpoint (a mix of two models); a NaN score ended the scan in a traceback after all its
work; explore and analyze dropped NaN rows without a word.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rmfast.scoring import batching
from rmfast.io import write_result
from cli_run import interrupt_scoring_at, run

import tiny_models as T

VOCAB = 1024  # the tests' byte-level tokenizer, and a small scan


def save_rm(d: Path, seed: int, overflow_ids=()):
    """A tiny fp32 Llama reward model of VOCAB ids (random init from ``seed``) and its tokenizer in ``d``;
    the embeddings of ``overflow_ids`` are scaled past float32's range (to inf, as an overflow leaves
    them), so the first norm multiplies inf by 0."""
    m = T.tiny("llama", "classifier", num_labels=1, seed=seed)
    m.resize_token_embeddings(VOCAB)
    with torch.no_grad():
        for i in overflow_ids:
            m.model.embed_tokens.weight[i] *= 1e38
            m.model.embed_tokens.weight[i] *= 1e38
    m.save_pretrained(d)
    T.chatml_tokenizer(VOCAB).save_pretrained(d)
    return d


SCAN = ["--dtype", "float32", "--token-ids", "0:600", "--batch-size", "100", "--compile", "off", "--audit", "0",
        "--no-progress", "--top", "0"]


def scores_of(path) -> np.ndarray:
    return pd.read_parquet(path).sort_values("token_id")["score"].to_numpy()


# ------------------------------------------------------------------ 1. a resume keyed on the weights


def test_changed_weights_never_resume_the_old_checkpoint(tmp_path, monkeypatch, capsys):
    """Scan, interrupt, save another random-init model of the same shapes into the folder, rerun: the
    result is a fresh scan of the new weights (one note says why the checkpoint was not used)."""
    rm = save_rm(tmp_path / "rm", seed=0)
    weights = rm / "model.safetensors"
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    out = tmp_path / "s.parquet"
    restore = interrupt_scoring_at(monkeypatch, 3)
    rc, _, err = run(["scan", rm, *SCAN, "--out", out], capsys)
    assert rc == 130 and Path(f"{out}.partial.npz").exists(), err
    restore()
    size = weights.stat().st_size
    save_rm(rm, seed=1)
    assert weights.stat().st_size == size  # the same shapes: names and sizes alike, only the bytes differ
    with pytest.warns(UserWarning, match=r"not resuming from .*partial.npz: the model's files .* changed"):
        rc, _, err = run(["scan", rm, *SCAN, "--out", out], capsys)
    assert rc == 0, err
    assert json.loads(Path(f"{out}.json").read_text())["resumed_candidates"] == 0
    rc, _, err = run(["scan", rm, *SCAN, "--out", tmp_path / "fresh.parquet"], capsys)
    assert rc == 0, err
    np.testing.assert_array_equal(scores_of(out), scores_of(tmp_path / "fresh.parquet"))


def test_the_file_hash_memo_sees_a_same_size_rewrite(tmp_path):
    """The memo of a file's sha256 is not fooled by a rewrite of the same size whose mtime is set back
    (as ``cp -p`` or ``touch -d`` would): its ctime changed."""
    from rmfast.loading.loader import cached_sha256, content_sha256

    f = tmp_path / "m" / "model.safetensors"
    f.parent.mkdir()
    f.write_bytes(b"a" * 4096)
    st = f.stat()
    first, folder = cached_sha256(f, tmp_path / "cache"), content_sha256(f.parent, cache=tmp_path / "cache")
    time.sleep(0.05)  # past the filesystem's timestamp granularity: the memo's documented limit
    f.write_bytes(b"b" * 4096)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert cached_sha256(f, tmp_path / "cache") != first
    assert content_sha256(f.parent, cache=tmp_path / "cache") != folder
    assert content_sha256(f.parent, "0" * 40) is None  # a hub snapshot at a commit: its revision names it


# ------------------------------------------------------------------ 4. NaN and infinite scores


def test_nan_scores_are_kept_counted_and_named(tmp_path, capsys):
    """A model that overflows on a few ids: the scan finishes (it used to end in a traceback), one
    warning counts them and names the first ids, the Parquet keeps them as NaN without a rank, the
    manifest counts them, and the printed tables leave them out."""
    rm = save_rm(tmp_path / "rm", seed=0, overflow_ids=(7, 300))
    out = tmp_path / "s.parquet"
    with pytest.warns(UserWarning, match=r"2 of 600 scores came out NaN or infinite \(token ids 7, 300\)"):
        rc, so, err = run(["scan", rm, *SCAN[:-1], "5", "--out", out], capsys)
    assert rc == 0, err
    df = pd.read_parquet(out).set_index("token_id")
    assert df.loc[[7, 300], "score"].isna().all() and df.loc[[7, 300], "rank"].isna().all()
    ranks = df["rank"].dropna()
    assert df["score"].notna().sum() == len(ranks) == 598 and ranks.min() == 1 and ranks.max() <= 598
    assert json.loads(Path(f"{out}.json").read_text())["n_nonfinite"] == 2
    assert not [ln for ln in so.splitlines() if ln.rstrip().endswith("nan")], so  # no NaN in the top/bottom tables


def test_infinite_scores_become_nan_batch_by_batch_and_a_resume_keeps_them(tmp_path):
    """+-inf is stored as NaN as each batch lands; a resumed job does not rescore a row it holds, NaN or not."""
    ck, ids, calls = tmp_path / "job.partial.npz", np.arange(40), []

    def score(rows, b):
        calls.append(rows.tolist())
        if len(calls) == 3:
            raise KeyboardInterrupt
        out = rows.astype(np.float32)
        out[rows % 10 == 3] = np.inf
        out[rows % 10 == 4] = np.nan
        return out

    def job():
        return batching.score_groups([batching.Group(np.arange(ids.size), 10, score)], ids, key="k", checkpoint=ck,
                                     progress=False)

    with pytest.raises(KeyboardInterrupt):
        job()
    scores, timing = job()
    assert timing["resumed_candidates"] == 20 and [c[0] for c in calls] == [0, 10, 20, 20, 30]
    assert np.flatnonzero(np.isnan(scores)).tolist() == [3, 4, 13, 14, 23, 24, 33, 34]


@pytest.fixture()
def scan_with_nan(tmp_path):
    """A scan file (and manifest) whose scores include one NaN and one +inf."""
    df = pd.DataFrame({"token_id": [1, 2, 3, 4], "token": ["a", "b", "c", "d"], "text": [" a", " b", " c", " d"],
                       "score": np.array([1.0, np.nan, 0.5, np.inf], np.float32),
                       "rank": pd.array([1, None, 2, None], dtype="Int64")})
    path = tmp_path / "nan.parquet"
    write_result(path, df, {"model": {"name": "m"}, "prompt": "p"}, False)
    return path


def test_explore_says_how_many_rows_it_leaves_out(scan_with_nan, tmp_path, capsys):
    from rmfast.explore import unpack

    page = tmp_path / "x.html"
    rc, _, err = run(["explore", scan_with_nan, "--out", page, "--no-pair-stats"], capsys)
    assert rc == 0, err
    assert "rmfast: note: 2 rows left out (validate: score is missing or not finite; in 1 scan)" in err
    assert any("2 rows left out" in n for n in unpack(page.read_text()).notes)  # on the page too


def test_analyze_says_how_many_rows_it_leaves_out(scan_with_nan, capsys):
    pytest.importorskip("scipy")
    rc, _, err = run(["analyze", "distributions", scan_with_nan], capsys)
    assert rc == 0, err
    assert "rmfast: 2 rows left out:" in err and "validate: 2 (score is missing or not finite)" in err


def test_a_model_whose_scores_are_all_equal_is_said_once():
    """A zeroed score head scores every candidate alike: the scan printed identical top and bottom tables (the ids in
    order) without a word, and analyses ranked them. One warning now says the model ranks nothing."""
    import rmfast

    m = T.tiny("llama", num_labels=1)
    with torch.no_grad():
        m.score.weight.zero_()
    tok = T.chatml_tokenizer()
    with pytest.warns(UserWarning, match=r"all 40 finite scores are 0 \(token ids\): the model ranks nothing"):
        rmfast.scan(m, tok, "Hi", token_ids="100:140", progress=False)
    texts = [f"text {i}" for i in range(12)]
    with pytest.warns(UserWarning, match=r"all 12 finite scores are 0 \(texts\)"):
        rmfast.score_texts(m, tok, "Hi", texts, progress=False)
    import warnings

    with warnings.catch_warnings():  # a few texts can tie for real: not said under ten
        warnings.simplefilter("error")
        rmfast.score_texts(m, tok, "Hi", texts[:3], progress=False)


def test_the_audit_leaves_out_rows_its_fp32_rescoring_lost_too():
    """The bf16 audit ranked an fp32 NaN as the largest score (Spearman over it) and printed max |diff| nan; where every
    fp32 rescore was NaN it must not read as perfect agreement."""
    from rmfast.scoring.audit import agreement, audit_line

    a = agreement(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, np.nan, 4.0]), 2)
    assert a["n_nonfinite_fp32"] == 1 and a["spearman"] == 1.0 and a["max_abs_diff"] == 0.0
    none = agreement(np.array([1.0, 2.0]), np.array([np.nan, np.inf]), 2)
    assert none["max_abs_diff"] is None and none["spearman"] is None
    line = audit_line({"dtype": "bfloat16", "n": 2, "seed": 0, **none, "fp32_on": "cpu", "wall_s": 0.1, "job_s": 1.0})
    assert "every one came out NaN or infinite there too: nothing to compare" in line and "max |diff| 0" not in line
