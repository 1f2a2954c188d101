"""Silent wrong results (issue 25): a resume across changed weights.

Each test here failed before its fix: a rerun after the folder's weights changed resumed the old
model's checkpoint (a mix of two models).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmfast import pipeline
from cli_run import interrupt_scoring_at, run

import tiny_models as T

VOCAB = 1024  # the tests' byte-level tokenizer, and a small scan


def save_rm(d: Path, seed: int):
    """A tiny fp32 Llama reward model of VOCAB ids (random init from ``seed``) and its tokenizer in ``d``."""
    m = T.tiny("llama", "classifier", num_labels=1, seed=seed)
    m.resize_token_embeddings(VOCAB)
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
    monkeypatch.setattr(pipeline, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(pipeline, "CHECKPOINT_MIN_S", 0.0)
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
    from rmfast.loader import cached_sha256, content_sha256

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
