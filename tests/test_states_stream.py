"""States written while the next batches compute (issue 33 item 4): the background writer's files are the
synchronous writer's, byte for byte (resume and non-finite counts included); its errors are the synchronous
path's one line; its queue is bounded; copies still running are waited for before any read."""

from __future__ import annotations

import errno
import json
import threading
import time
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

        def full(path, write, calls=calls, **kw):
            if str(path).endswith(".safetensors"):
                calls["n"] += 1
                if calls["n"] >= 3:  # the disk stays full
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, write, **kw)

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
    import rmfast.states.writer as S

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


def test_a_batch_bigger_than_a_shard_is_split_by_rows(tmp_path):
    """A batch of more bytes than a shard is cut by rows into full shards, the rest kept for the next batch (the 8B's
    --states all made one 285 MB shard of the last batch, written by one thread after the scan: the 0.22 s it waited on
    the H200): batches of 5 rows into shards of 3 make 3, 3, 3, 1 rows, the first three cut before finish; the
    background writer's files are the same bytes; the states read back are the rows added, in order."""
    x = torch.arange(60.0).view(10, 6)  # 10 rows, two layers of 3

    def write(folder, background: bool) -> list[bytes]:
        w = StatesWriter(folder, ["0", "last"], "float32", "row", job="j")
        ww = BackgroundWriter(w, writers=3) if background else w
        ww.prepare(np.zeros(10, dtype=bool))
        w.shard_bytes = 3 * (3 + 3) * 4 + 5  # three rows of (3 + 3) float32 values, not four
        cut = []
        for b in range(2):
            rows = np.arange(5 * b, 5 * b + 5)
            ww.add(rows, rows, {"0": x[rows, :3], "last": x[rows, 3:]})
            if not background:
                cut.append(len(w._shards()))
        assert background or cut == [1, 3]  # a full shard from the first batch; the rest with the second's
        ww.finish({"model": "m"})
        s = open_states(folder)
        assert [sh.rows for sh in s.shards] == [3, 3, 3, 1]
        assert s.take("0", np.arange(10)).tolist() == x[:, :3].tolist()
        assert s.take("last", np.arange(10)).tolist() == x[:, 3:].tolist()
        return [sh.file.read_bytes().split(b"run_id")[1][40:] for sh in s.shards]  # the tensors' bytes

    assert write(tmp_path / "sync.states", False) == write(tmp_path / "bg.states", True)


def _count_writes(monkeypatch, S, hold) -> list[int]:
    """Patch ``S.write_shard`` (``S``: rmfast.states.writer) to count the writes in flight, each calling ``hold(its first
    row)`` before it writes; returns [the most at once], updated as they run."""
    active, most, lock = [0], [0], threading.Lock()
    real = S.write_shard

    def write(path, t, meta):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            hold(int(t["rows"][0][0]))
            return real(path, t, meta)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(S, "write_shard", write)
    return most


def test_shards_are_written_side_by_side_and_bounded(tmp_path, monkeypatch):
    """A cut shard's count and write run on the pool's WRITERS threads: two shards' writes overlap (each waits,
    inside its write, until the other has started), never more than two are in flight, the shards keep the
    numbers of their cuts and hold the rows in the scan's order, and the pool's time is reported."""
    import rmfast.states.writer as S

    both = threading.Barrier(2, timeout=10)

    def hold(first_row):  # the first two shards meet: each waits for the other to be writing
        if first_row < 8:
            both.wait()

    most = _count_writes(monkeypatch, S, hold)
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


def test_no_more_shards_are_cut_than_writers_are_free(tmp_path, monkeypatch):
    """A shard is cut (its batches taken out of the buffer, into a write) only once fewer than ``writers`` writes are
    in flight, so a slow disk holds at most ``writers`` cut shards in host memory, not one more."""
    import rmfast.states.writer as S

    gate, lock, n = threading.Event(), threading.Lock(), {"cut": 0, "written": 0, "most": 0}
    real_cut, real_write = StatesWriter.cut, S.write_shard

    def cut(self):
        write = real_cut(self)
        with lock:
            n["cut"] += 1
            n["most"] = max(n["most"], n["cut"] - n["written"])
        return write

    def write(path, t, meta):
        gate.wait(30)  # a slow disk, until the scan has queued everything it can
        with lock:
            n["written"] += 1
        return real_write(path, t, meta)

    monkeypatch.setattr(StatesWriter, "cut", cut)
    monkeypatch.setattr(S, "write_shard", write)
    w = StatesWriter(tmp_path / "held.states", ["0"], "float32", "row", job="j")
    bw = BackgroundWriter(w, writers=2)
    bw.prepare(np.zeros(40, dtype=bool))
    w.shard_bytes = 4 * 3 * 4  # a shard per batch
    x = torch.arange(120.0).view(40, 3)
    scan = threading.Thread(target=lambda: [bw.add(np.arange(4 * b, 4 * b + 4), np.arange(4 * b, 4 * b + 4),
                                                   {"0": x[4 * b:4 * b + 4]}) for b in range(10)])
    scan.start()
    scan.join(1.0)  # the scan blocks on the full queue: the pool is full and one more shard is buffered, not cut
    assert n["most"] == 2 and scan.is_alive()
    gate.set()
    scan.join(30)
    bw.finish({"model": "m"})
    assert n["most"] == 2 and open_states(tmp_path / "held.states").take("0", np.arange(40)).tolist() == x.tolist()


def test_fewer_shards_are_written_at_once_while_the_scan_runs_than_after_it(tmp_path, monkeypatch):
    """While batches still arrive, at most SCAN_WRITERS shard writes run at once (each takes the GIL many times, and
    the scan's thread hands it over at every torch call: four writes side by side all through a scan took `all`
    from 1.95x to 2.53x a plain scan on the H200); once the scan has drained, all WRITERS write the tail side by
    side. Shards 0 and 1 hold until the scan is done; shards 2-5 each wait until four are writing."""
    import rmfast.scoring.states_stream as SS
    import rmfast.states.writer as S

    monkeypatch.setattr(SS, "SCAN_WRITERS", 2)
    gate, four = threading.Event(), threading.Barrier(4, timeout=20)

    def hold(first):
        if first < 8:
            gate.wait(20)
        elif first < 24:
            four.wait()  # four writes at once, or a BrokenBarrierError

    most = _count_writes(monkeypatch, S, hold)
    w = StatesWriter(tmp_path / "tail.states", ["0"], "float32", "row", job="j")
    bw = BackgroundWriter(w, depth=16, writers=4)
    bw.prepare(np.zeros(32, dtype=bool))
    w.shard_bytes = 4 * 3 * 4  # a shard per batch of 4 rows
    x = torch.arange(96.0).view(32, 3)
    for b in range(8):
        rows = np.arange(4 * b, 4 * b + 4)
        bw.add(rows, rows, {"0": x[rows]})
    deadline = time.monotonic() + 5
    while most[0] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # time for a third write to start, were it allowed
    during_scan = most[0]
    done = threading.Thread(target=bw.finish, args=({"model": "m"},))
    done.start()
    gate.set()
    done.join(30)
    assert during_scan == 2 and most[0] == 4 and not done.is_alive()
    assert open_states(tmp_path / "tail.states").take("0", np.arange(32)).tolist() == x.tolist()
    assert bw.stats()["scan_writers"] == 2


def _slow_shards(monkeypatch, seconds: float):
    import rmfast.states.writer as S

    real = S.write_shard
    monkeypatch.setattr(S, "write_shard", lambda path, t, meta: (time.sleep(seconds),
                                                                 real(path, t, meta))[1])


def _writer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("rmfast-states", "rmfast-shard"))]


def test_a_failed_checkpoint_save_still_drains_the_writer(tmp_path, monkeypatch):
    """The checkpoint's own save fails (a full disk) while shards are being written: the job raises that error, and
    only after every shard write queued before it has ended, so no writer thread outlives the job (a Python caller
    who frees space and reruns in the same process would otherwise find the old run's shards in the new folder)."""
    from rmfast.scoring import batching
    from rmfast.scoring.batching import Group, score_groups
    from rmfast.scoring.plan import Scored

    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    _slow_shards(monkeypatch, 0.3)
    real_save, calls = batching.save_checkpoint, [0]

    def save(*a, **k):  # the checkpoint's disk fills at its third save
        calls[0] += 1
        if calls[0] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(*a, **k)

    monkeypatch.setattr(batching, "save_checkpoint", save)
    w = StatesWriter(tmp_path / "s.states", ["0"], "float32", "token_id", job="j")
    w.shard_bytes = 4 * 4 * 4  # a shard per batch of 4 rows x 4 values x 4 bytes
    score = lambda rows, b: Scored(np.zeros(len(rows), np.float32), {"0": torch.ones(len(rows), 4)}, None)  # noqa: E731
    with pytest.raises(OSError, match="No space left"):
        score_groups([Group(np.arange(16), 4, score)], np.arange(16), key="k", checkpoint=tmp_path / "ck.npz",
                     progress=False, states_out=BackgroundWriter(w))
    assert not _writer_threads()
    # every shard queued before the error is on disk when it is raised: one per batch scored (the third's rows are not
    # in a checkpoint, so a resume drops it and scores them again)
    assert len(list(w.partial.glob("shard-*.safetensors"))) == 3


def test_ctrl_c_while_draining_skips_the_queue_and_waits_for_the_writes(tmp_path, monkeypatch):
    """A Ctrl-C while the writer drains (the end of a big scan; a second Ctrl-C): the steps still queued are skipped
    (their rows have no shard, so a resume scores them again), the write in flight ends, no thread is left, and the
    interrupt is raised; a second drain returns at once."""
    import _thread
    import signal
    import time

    _slow_shards(monkeypatch, 0.4)
    w = StatesWriter(tmp_path / "c.states", ["0"], "float32", "row", job="j")
    w.shard_bytes = 4 * 3 * 4  # a shard per batch of 4 rows x 3 values x 4 bytes
    bw = BackgroundWriter(w, depth=8, writers=1)
    bw.prepare(np.zeros(32, dtype=bool))
    for b in range(8):
        bw.add(np.arange(4 * b, 4 * b + 4), np.arange(4 * b, 4 * b + 4), {"0": torch.zeros(4, 3)})
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # what interrupt_main raises KeyboardInterrupt by
    try:
        threading.Timer(0.2, _thread.interrupt_main).start()  # the user's Ctrl-C, while the first shard is written
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            bw.drain()
    finally:
        signal.signal(signal.SIGINT, old)
    assert time.perf_counter() - t0 < 2.0  # not the 8 shards' 3.2 s
    assert not _writer_threads()
    n = len(list(w.partial.glob("shard-*.safetensors")))
    assert 1 <= n < 8 and not list(w.partial.glob(".shard-*.tmp"))  # the writes in flight ended, whole
    bw.drain()
    assert len(list(w.partial.glob("shard-*.safetensors"))) == n


def test_a_killed_writes_temporary_files_are_removed_on_resume(tmp_path):
    """A kill -9 while shards are written leaves their atomic writes' temporary files in the partial folder: the
    resumed job removes them, so the finished folder holds only its shards and manifest."""
    w = StatesWriter(tmp_path / "k.states", ["0"], "float32", "row", job="j")
    w.prepare(np.zeros(8, dtype=bool))
    junk = [w.partial / ".shard-00001.safetensors.0a1b2c3d.tmp", w.partial / ".shard-00002.safetensors.ffee0011.tmp"]
    for f in junk:
        f.write_bytes(b"x" * 1000)  # what the killed writers had written of their shards
    w = StatesWriter(tmp_path / "k.states", ["0"], "float32", "row", job="j")  # the rerun
    w.prepare(np.zeros(8, dtype=bool))
    assert not any(f.exists() for f in junk)
    w.add(np.arange(8), np.arange(8), {"0": torch.ones(8, 2)})
    w.finish({"model": "m"})
    assert sorted(p.name for p in (tmp_path / "k.states").iterdir()) == ["manifest.json", "shard-00000.safetensors"]


def test_two_threads_reading_host_states_at_once_both_wait_for_the_copies():
    """The writer thread and a sink read the same batch's states on CUDA: each waits for the copies' event, and one
    never acts on an event the other has just cleared (the other's whole wait falls between this one's check of the
    event and its use: a read of ``_event`` after the check would find None)."""
    waited = []

    class Event:
        def synchronize(self):
            waited.append(threading.current_thread().name)

    class Switching(HostStates):  # the other thread's read runs inside this thread's first read of the event
        switched = False

        @property
        def _event(self):
            event = self.__dict__["ev"]
            if not self.switched and event is not None:
                self.switched = True
                other = threading.Thread(target=lambda: self["0"], name="writer")
                other.start()
                other.join()
            return event

        @_event.setter
        def _event(self, value):
            self.__dict__["ev"] = value

    h = Switching({"0": torch.zeros(2, 3)}, Event())
    h.wait()  # raised AttributeError ('NoneType' has no synchronize) when the event was read twice
    assert waited == ["writer", threading.current_thread().name] and not h.pending


@pytest.mark.parametrize("left", ["", "[1, 2]", '{"job": "j"'])
def test_an_unreadable_job_file_starts_the_states_afresh(tmp_path, left):
    """A full disk (or a kill) can leave job.json empty or cut short: the rerun that the full disk's message asks for
    met a JSONDecodeError traceback at every try. Now such a folder is another job's: started afresh, one note."""
    w = StatesWriter(tmp_path / "j.states", ["0"], "float32", "row", job="j")
    w.prepare(np.zeros(4, dtype=bool))
    (w.partial / "job.json").write_text(left)
    w = StatesWriter(tmp_path / "j.states", ["0"], "float32", "row", job="j")
    with pytest.warns(UserWarning, match="the checkpoint's 4 scored rows are scored again"):
        assert not w.prepare(np.ones(4, dtype=bool)).any()
    assert json.loads((w.partial / "job.json").read_text())["job"] == "j"
    w.add(np.arange(4), np.arange(4), {"0": torch.ones(4, 2)})
    w.finish({"model": "m"})
    assert sorted(p.name for p in (tmp_path / "j.states").iterdir()) == ["manifest.json", "shard-00000.safetensors"]


def test_a_kill_between_finishing_steps_keeps_the_states(tmp_path, monkeypatch):
    """finish() dropped job.json before renaming the folder into place: a kill between the two left a complete
    partial folder that the rerun took for another job's, and every row was scored again. The torchrun merge moved
    the ranks' shards one by one before its manifest: a kill there lost the ranks' finished folders."""
    import os as _os

    from rmfast.states import StatesMerge
    from rmfast.states import writer as W

    real = _os.replace

    def killed(src, dst):  # the kill, at the folder's rename into place (a file's atomic write goes on)
        if _os.path.isdir(src):
            raise KeyboardInterrupt
        real(src, dst)

    w = StatesWriter(tmp_path / "f.states", ["0"], "float32", "row", job="j")
    w.prepare(np.zeros(4, dtype=bool))
    w.add(np.arange(4), np.arange(4), {"0": torch.ones(4, 2)})
    with monkeypatch.context() as m:
        m.setattr(W.os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            w.finish({"model": "m"})
    w = StatesWriter(tmp_path / "f.states", ["0"], "float32", "row", job="j")  # the rerun
    assert w.prepare(np.ones(4, dtype=bool)).all()  # its states are kept: nothing scored again
    w.finish({"model": "m"})
    assert open_states(tmp_path / "f.states").take("0", np.arange(4)).tolist() == [[1.0, 1.0]] * 4
    ranks = []
    for r in range(2):
        wr = StatesWriter(tmp_path / f"r{r}.states", ["0"], "float32", "token_id", job="j")
        wr.prepare(np.zeros(2, dtype=bool))
        wr.add(np.arange(2), np.arange(2 * r, 2 * r + 2), {"0": torch.full((2, 2), float(r))})
        ranks.append(wr.finish({"model": "m"}))
    with monkeypatch.context() as m:
        m.setattr(W.os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            StatesMerge(ranks, tmp_path / "all.states").finish()
    assert all(open_states(p).n == 2 for p in ranks)  # the ranks' folders whole: the rerun joins them again
    merged = open_states(StatesMerge(ranks, tmp_path / "all.states").finish())
    assert merged.take("0", np.arange(4)).tolist() == [[0.0, 0.0]] * 2 + [[1.0, 1.0]] * 2
    assert not any(p.exists() for p in ranks) and _os.path.isdir(tmp_path / "all.states")


@pytest.mark.parametrize("background", [False, True])
def test_counts_the_states_brought_are_summed_per_shard_and_kept_only_where_the_dtype_keeps_them(tmp_path, background):
    """A GPU scan's states bring each row's NaN/inf count (counted on the device before the copy: HostStates'
    row_counts), so the shard writers sum those instead of reading every byte (a third of their time on the
    H200's host). A shard of a split batch sums its own rows' counts; where the stored dtype is narrower than the
    computed one (float32 states stored as float16: a finite value may round to inf) the bytes are counted. The
    counts below are deliberately not the data's (which holds no NaN), so the manifest shows which was used."""
    x = torch.arange(60.0).view(10, 6)  # finite
    x[9, 0] = 70000.0  # finite in float32 and bfloat16; inf once stored as float16 (its largest value is 65,504)
    fake = torch.tensor([1, 0, 2, 0, 0, 3, 0, 0, 0, 4], dtype=torch.int32)  # "NaN/inf" per row, as a device said

    def write(name, dtype, src=torch.float32):
        w = StatesWriter(tmp_path / name, ["0"], dtype, "row", job="j")
        ww = BackgroundWriter(w, writers=2) if background else w
        ww.prepare(np.zeros(10, dtype=bool))
        w.shard_bytes = 3 * 6 * torch.finfo(getattr(torch, dtype)).bits // 8  # shards of 3 rows: batches split
        for rows in (np.arange(0, 5), np.arange(3, 10)):  # rows 3 and 4 again: the second batch's counts are selected
            finite = (6 - fake[rows])[None]  # (L=1, b): finite values a row, as CUDA brings them
            ww.add(rows, rows, HostStates({"0": x[rows].to(src)}, finite=finite))
        ww.finish({"model": "m"})
        s = open_states(tmp_path / name)
        return s.manifest["n_nonfinite"]["0"], [json.loads(sh.metadata["n_nonfinite"])["0"]
                                                 for sh in s.shards]

    assert write("kept.states", "float32") == (10, [3, 3, 0, 4])  # rows 0-2, 3-5, 6-8, 9
    assert write("wider.states", "float32", torch.bfloat16) == (10, [3, 3, 0, 4])  # bf16 into float32: each as it was
    assert write("narrow.states", "float16") == (1, [0, 0, 0, 1])  # counted from the stored bytes: row 9's inf
    assert write("narrow2.states", "bfloat16") == (0, [0, 0, 0, 0])  # float32's largest values pass bfloat16's
    assert write("narrow3.states", "float16", torch.bfloat16) == (1, [0, 0, 0, 1])  # as narrow: bf16 is 16 bits too
