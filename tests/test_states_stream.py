"""States written while the next batches compute (issue 33 item 4): the background writer's files are the
synchronous writer's, byte for byte (resume and non-finite counts included); its errors are the synchronous
path's one line; its queue is bounded; copies still running are waited for before any read."""

from __future__ import annotations

import errno
import json
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import tiny_models as T
from cli_run import interrupt_scoring_at
from rmfast.errors import UserError
from rmfast.scoring.states_stream import BackgroundWriter, HostStates, host_states
from rmfast.states import StatesWriter, open_states

PROMPT = "What, in one word, is the greatest thing ever?"
IDS = np.arange(600, dtype=np.int64)


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory, smol_tokenizer):
    """A tiny Llama whose embeddings overflow float16 (so float16 states hold inf: counted per shard)."""
    from rmfast import load

    d = tmp_path_factory.mktemp("big")
    m = T.tiny("llama", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(1e6)  # embeddings past float16's 65,504
    m.save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    return load(str(d), dtype="float32", device="cpu")


def _scan(lm, folder: Path, background: bool, checkpoint: Path):
    from rmfast.scoring.pipeline import StatesRequest, score_ids

    req = StatesRequest("0,1,last_prenorm,last_normed", "float16", folder=folder, background=background)
    return score_ids(lm.model, lm.tokenizer, PROMPT, IDS, batch_size=64, progress=False, checkpoint=checkpoint,
                     states=req)


def _files(folder: Path) -> dict[str, object]:
    """Every file's bytes; a shard's as (its header, parsed, and the bytes after it): safetensors writes its
    metadata in a hash map's order, which differs from one call to the next, in either writer."""
    out = {}
    for p in sorted(folder.iterdir()):
        b = p.read_bytes()
        if p.suffix == ".safetensors":
            n = 8 + int.from_bytes(b[:8], "little")
            b = (json.loads(b[8:n]), b[n:])
        out[p.name] = b
    return out


@pytest.fixture
def every_batch_saves(monkeypatch):
    """A checkpoint (and so a shard) after every batch, and one run id: two runs write the same bytes."""
    from rmfast.scoring import batching

    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=33))


def test_background_files_are_the_synchronous_files_after_a_resume(overflowing, tmp_path, monkeypatch,
                                                                  every_batch_saves):
    """Interrupted after three batches, then resumed: the background writer's folder (shards, their
    non-finite counts, the manifest) is the synchronous writer's byte for byte, and the scores are the same."""
    got = {}
    for background in (False, True):
        folder, ck = tmp_path / f"{background}.states", tmp_path / f"{background}.npz"
        restore = interrupt_scoring_at(monkeypatch, 4)
        with pytest.raises(KeyboardInterrupt):
            _scan(overflowing, folder, background, ck)
        partial = folder.with_name(folder.name + ".partial")
        assert len(list(partial.glob("shard-*"))) == 3  # every batch before the interrupt is on disk
        restore()
        res = _scan(overflowing, folder, background, ck)
        assert res.manifest["resumed_candidates"] == 192
        got[background] = _files(folder), res.scores
        assert ("writer" in res.manifest["states"]) == background
    (sync_files, sync_scores), (bg_files, bg_scores) = got[False], got[True]
    assert list(bg_files) == list(sync_files) and len(sync_files) == 1 + 10  # manifest, a shard a batch
    for name in sync_files:
        assert bg_files[name] == sync_files[name], name
    np.testing.assert_array_equal(bg_scores, sync_scores)
    man = open_states(tmp_path / "True.states").manifest
    assert man["n"] == 600 and man["n_nonfinite"]["0"] > 0


def test_a_failed_write_in_the_thread_is_the_synchronous_one_line(overflowing, tmp_path, monkeypatch,
                                                                  every_batch_saves):
    """A full disk on the third shard: the background writer raises the synchronous writer's UserError in
    the scan's thread, leaves the same shards (no manifest, no finished folder), and the rerun ends with the
    same bytes."""
    import rmfast.io

    real = rmfast.io.atomic_write
    errors, partials, finals = {}, {}, {}
    for background in (False, True):
        calls = {"n": 0}

        def full(path, write, calls=calls):
            if str(path).endswith(".safetensors"):
                calls["n"] += 1
                if calls["n"] >= 3:  # the disk stays full
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, write)

        monkeypatch.setattr(rmfast.io, "atomic_write", full)
        folder, ck = tmp_path / f"{background}" / "s.states", tmp_path / f"{background}" / "s.npz"
        with pytest.raises(UserError) as e:
            _scan(overflowing, folder, background, ck)
        errors[background] = str(e.value).replace(str(tmp_path / f"{background}"), "DIR")
        partial = folder.with_name("s.states.partial")
        assert not folder.exists() and not (partial / "manifest.json").exists() and ck.exists()
        partials[background] = _files(partial)
        assert not [t for t in threading.enumerate() if t.name == "rmfast-states"]  # the thread stopped
        monkeypatch.setattr(rmfast.io, "atomic_write", real)
        _scan(overflowing, folder, background, ck)
        finals[background] = _files(folder)
    assert errors[True] == errors[False] and "No space left on device" in errors[True] and "\n" not in errors[True]
    assert partials[True] == partials[False] and sum(n.startswith("shard-") for n in partials[True]) == 2
    assert finals[True] == finals[False]


def test_copies_still_running_are_waited_for_in_the_writer_thread(tmp_path):
    """HostStates (the CUDA form, its event faked) waits before any read; the background writer takes such
    a batch in its thread, after the wait, and writes what the synchronous writer writes."""
    class Event:
        def __init__(self):
            self.waited_in = []

        def synchronize(self):
            self.waited_in.append(threading.current_thread().name)

    x = torch.arange(12.0).view(4, 3)
    ev = Event()
    st = HostStates({"last": x}, ev)
    assert st.pending and list(st) == ["last"] and len(st) == 1 and not ev.waited_in
    bw = BackgroundWriter(StatesWriter(tmp_path / "bg.states", ["last"], "float32", "token_id", job="j"))
    bw.prepare(np.zeros(4, dtype=bool))
    bw.add(np.arange(4), np.arange(4) + 10, st)
    bw.drain()
    assert ev.waited_in == ["rmfast-states"] and not st.pending
    bw.finish({"model": "m"})
    assert open_states(tmp_path / "bg.states").take("last", np.arange(4)).tolist() == x.tolist()
    assert host_states({"a": x})["a"] is x  # on CPU: the tensors themselves, as before


def test_the_queue_is_bounded_and_the_wait_is_counted(tmp_path):
    """At most DEPTH steps wait for the thread: one more blocks the scan (counted in wait_s) until the
    thread moves on; drain waits for everything and stops the thread."""
    w = StatesWriter(tmp_path / "q.states", ["last"], "float32", "token_id", job="j")
    w.prepare(np.zeros(1, dtype=bool))
    started, release, flushed = threading.Event(), threading.Event(), []

    def slow_flush():
        started.set()
        release.wait(30)
        flushed.append(1)

    w.flush = slow_flush
    bw = BackgroundWriter(w, depth=2)
    bw.flush()
    assert started.wait(30)
    bw.flush()
    bw.flush()
    assert bw._q.full()
    fourth = threading.Thread(target=bw.flush)
    fourth.start()
    fourth.join(0.3)
    assert fourth.is_alive()  # blocked: the queue holds two steps already
    release.set()
    fourth.join(30)
    assert not fourth.is_alive()
    bw.drain()
    assert len(flushed) == 4 and bw._thread is None and bw.wait_s > 0 and bw.busy_s > 0


def test_fresh_host_buffers_are_kept_uncopied_up_to_a_bound(tmp_path, monkeypatch):
    """A whole batch of HostStates (fresh pinned copies on CUDA) in the stored dtype is buffered as it is, up to
    KEEP_FRESH_MAX bytes a shard; beyond it, a part of a batch, another dtype or a plain dict (views of the
    engine's) is copied; the shard's bytes are the same either way."""
    import rmfast.states as S

    def batches():
        g = torch.Generator().manual_seed(3)
        return [{l: torch.randn(4, 3, generator=g).to(torch.bfloat16) for l in ("0", "last")} for _ in range(3)]

    def write(folder, wrap):
        w = StatesWriter(folder, ["0", "last"], "bfloat16", "row", job="j")
        w.prepare(np.zeros(12, dtype=bool))
        got = []
        for i, b in enumerate(batches()):
            rows = np.arange(4 * i, 4 * i + 4)
            c = w.claim(rows, rows)
            mats = w.take(wrap(b), c[2])
            got.append([mats[l].data_ptr() == b[l].data_ptr() for l in ("0", "last")])
            w.append(c[0], c[1], mats)
        w.flush()
        return got, (w.partial / "shard-00000.safetensors").read_bytes()

    monkeypatch.setattr(S, "KEEP_FRESH_MAX", 3 * 4 * 3 * 2)  # three (4, 3) bf16 tensors
    kept, fresh = write(tmp_path / "a.states", lambda b: HostStates(b))
    assert kept == [[True, True], [True, False], [False, False]]
    copied, plain = write(tmp_path / "b.states", dict)
    assert copied == [[False, False]] * 3
    assert fresh.split(b"run_id")[1][40:] == plain.split(b"run_id")[1][40:]  # the tensors' bytes (run ids differ)
    w = StatesWriter(tmp_path / "c.states", ["0"], "float32", "row", job="j")
    w.prepare(np.zeros(4, dtype=bool))
    x = torch.arange(12.0).view(4, 3)
    assert w.take(HostStates({"0": x.to(torch.bfloat16)}), np.arange(4))["0"].dtype == torch.float32
    part = w.take(HostStates({"0": x}), np.array([1, 3]))["0"]
    assert part.tolist() == x[[1, 3]].tolist() and part.data_ptr() != x.data_ptr()


def test_a_shard_is_written_once_its_bytes_reach_the_cap(tmp_path):
    """Shards are cut by bytes as well as rows, so the writer thread writes while the scan still computes (one
    shard per 65,536 rows kept a whole 'all' scan in memory and wrote it after the last batch): with a cap of
    two batches' bytes, 5 batches make shards of 2, 2 and 1 batches, the first two written before finish; the
    states read back are the rows added, in order."""
    w = StatesWriter(tmp_path / "cap.states", ["0", "last"], "float32", "row", job="j")
    w.prepare(np.zeros(20, dtype=bool))
    w.shard_bytes = 2 * 4 * (3 + 3) * 4  # two batches: 4 rows x (3 + 3) values x 4 bytes
    x = torch.arange(60.0).view(20, 3)
    for b in range(5):
        rows = np.arange(4 * b, 4 * b + 4)
        w.add(rows, rows, {"0": x[rows], "last": -x[rows]})
        assert len(w._shards()) == (b + 1) // 2  # a shard as soon as two batches are buffered
    w.finish({"model": "m"})
    s = open_states(tmp_path / "cap.states")
    assert [sh.rows for sh in s.shards] == [8, 8, 4]
    assert s.take("last", np.arange(20)).tolist() == (-x).tolist()
    assert s.take("0", np.arange(20)).tolist() == x.tolist()


def test_shards_are_written_side_by_side_and_bounded(tmp_path, monkeypatch):
    """A cut shard's count and write run on the pool's WRITERS threads: two shards' writes overlap (each waits,
    inside its write, until the other has started), never more than two are in flight, the shards keep the
    numbers of their cuts and hold the rows in the scan's order, and the pool's time is reported."""
    import rmfast.states as S

    active, most, lock, both = [0], [0], threading.Lock(), threading.Barrier(2, timeout=10)
    real = S.write_shard

    def slow(path, t, meta):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            if int(t["rows"][0][0]) < 8:  # the first two shards meet: each waits for the other to be writing
                both.wait()
            return real(path, t, meta)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(S, "write_shard", slow)
    w = StatesWriter(tmp_path / "pool.states", ["0"], "float32", "row", job="j")
    bw = BackgroundWriter(w, writers=2)
    bw.prepare(np.zeros(24, dtype=bool))
    w.shard_bytes = 4 * 3 * 4  # a shard per batch of 4 rows x 3 values x 4 bytes
    x = torch.arange(72.0).view(24, 3)
    for b in range(6):
        rows = np.arange(4 * b, 4 * b + 4)
        bw.add(rows, rows, {"0": x[rows]})
    bw.finish({"model": "m"})
    assert most[0] == 2  # side by side, and no more than the pool's two
    s = open_states(tmp_path / "pool.states")
    assert [sh.file.name for sh in s.shards] == [f"shard-{i:05d}.safetensors" for i in range(6)]
    assert s.take("0", np.arange(24)).tolist() == x.tolist()
    st = bw.stats()
    assert st["writers"] == 2 and st["write_s"] > 0
