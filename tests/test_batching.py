"""rmfast.scoring.batching: THE batching loop every job runs (fixed batches, out-of-memory back-off,
checkpoints and resume). Job-level resume tests (a killed scan or sweep) live with their commands
(test_cli.py, test_trust.py, test_silent_results.py)."""

import numpy as np
import pytest
import torch

from rmfast.scoring import batching


def test_oom_batches_halve_and_retry():
    """scan / text candidates / GCG share this loop: out-of-memory halves the batch, retries the same rows."""
    from rmfast.scoring.batching import oom_batches

    seen, told = [], []

    def score(lo, hi, b):
        if hi - lo > 3:
            raise torch.OutOfMemoryError("too big")
        seen.append((lo, hi))
        return list(range(lo, hi))

    out = list(oom_batches(10, 8, torch.device("cpu"), score, told.append))
    assert told == [4, 2]
    assert [(lo, hi) for lo, hi, _, _ in out] == seen == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert [x for *_, o, _ in out for x in o] == list(range(10)) and out[-1][3] == 2

    def never(lo, hi, b):
        raise torch.OutOfMemoryError("always")

    with pytest.raises(torch.OutOfMemoryError):
        list(oom_batches(4, 2, torch.device("cpu"), never))


def test_a_batch_size_halved_after_an_oom_is_recorded_and_resumed(tmp_path):
    """After an out-of-memory back-off the job ran batches of 4, but the manifest said 16 (Group.batch_size) and the
    checkpoint kept 16, so a resumed job paid the halvings again. Now both hold 4, and the manifest counts them."""
    ran = []

    def score(rows, bs):
        if bs > 4:
            raise torch.OutOfMemoryError("fake")
        ran.append(len(rows))
        return rows.astype(np.float32)

    ck = tmp_path / "x.partial.npz"
    g = batching.Group(np.arange(32), 16, score)
    scores, timing = batching.score_groups([g], np.arange(100, 132), key="k", checkpoint=ck, progress=False,
                                           keep_checkpoint=True)
    assert ran == [4] * 8 and g.batch_size == 4 and timing["oom_halvings"] == 2
    assert np.load(ck)["batch_sizes"].tolist() == [4]
    again = batching.Group(np.arange(32), 16, score)  # the same job resumed: the checkpoint's sizes, said
    with pytest.warns(UserWarning, match=r"resuming with the checkpoint's batches of 4 rows, not 16 .* delete"):
        batching.score_groups([again], np.arange(100, 132), key="k", checkpoint=ck, progress=False)
    assert again.batch_size == 4 and ran == [4] * 8  # every row from the checkpoint, no OOM again


def test_checkpoint_by_candidates_not_only_time(tmp_path, monkeypatch):
    """With the default cadence, a job checkpoints after ~1k candidates even when that took only
    seconds (a clock here, advanced 1 s per batch): kills a few seconds apart still make progress."""
    clock = {"t": 0.0}

    class FakeTime:
        @staticmethod
        def perf_counter():
            return clock["t"]

    monkeypatch.setattr(batching, "time", FakeTime)
    ck = tmp_path / "job.partial.npz"
    ids = np.arange(4096)
    seen = []

    def score(rows, b):
        clock["t"] += 1.0
        if ck.exists():
            seen.append(int((~np.isnan(np.load(ck)["scores"])).sum()))
        if len(seen) >= 3:
            raise KeyboardInterrupt
        return rows.astype(np.float32)

    with pytest.raises(KeyboardInterrupt):
        batching.score_groups([batching.Group(np.arange(ids.size), 512, score)], ids, key="k", checkpoint=ck,
                              progress=False)
    assert seen and seen[0] >= 1024  # saved after two 512-row batches, 2 s of work


def test_cuda_token_scans_split_the_vocabulary_evenly(monkeypatch):
    """On CUDA (every short batch padded to the full row count) a one-token scan's auto rows split the model's
    vocabulary into equal batches: the 8B's 128,256 ids in 8 x 16,128 rows (768 padded) instead of 8 x 16,384
    (2,816 padded). The rule reads the model, never the job's candidate count; CPU and other lengths keep theirs."""
    from rmfast.scoring import decisions
    from rmfast.template import build_template
    from tiny_models import chatml_tokenizer, tiny

    for vocab, rows, n_batches in ((128_256, 16_128, 8), (151_936, 15_360, 10), (256_000, 16_128, 16), (262_144, 16_384, 16)):
        got = batching.auto_batch_size(torch.device("cuda"), 2, vocab=vocab)
        assert got == rows and got % batching.BALANCE_GRAIN == 0 and -(-vocab // got) == n_batches
        assert n_batches * got - vocab < n_batches * batching.BALANCE_GRAIN  # the padding: under a grain a batch
    assert batching.auto_batch_size(torch.device("cpu"), 2, vocab=128_256) == batching.auto_batch_size(torch.device("cpu"), 2)

    model = tiny("llama")
    tmpl = build_template(chatml_tokenizer(), "Hi?")
    seen = []
    real = decisions.auto_batch_size
    monkeypatch.setattr(decisions, "auto_batch_size", lambda *a, **kw: seen.append(kw.get("vocab")) or real(*a, **kw))
    decisions.choose_rows_per_batch(model, tmpl, "score", 1, True, "auto")
    decisions.choose_rows_per_batch(model, tmpl, "score", 3, True, "auto")
    decisions.choose_rows_per_batch(model, tmpl, "score", 1, False, "auto")
    assert seen == [model.get_input_embeddings().num_embeddings, None, None]
    assert decisions.choose_rows_per_batch(model, tmpl, "score", 1, True, 100) == 100  # asked for: kept
