"""A scan's states written while the next batches compute (issue 33 item 4): device-to-host copies that
do not stop the host, and a writer thread for the shards.

Two parts, each checked against the synchronous path it stands in for (tests/test_states_stream.py):

- :func:`host_states`: a batch's tapped states (name -> (B, d) tensor) on the host. On CUDA each goes
  into a fresh pinned buffer with ``non_blocking=True`` on a copy stream of its own, which first waits for
  the compute stream (the forward that made the states), so the copies run on the copy engines while the
  next batch computes (on the compute stream they would queue before it); each source tensor is marked as
  in use by the copy stream (``record_stream``), so its memory is not handed to the next batch before its
  copy has read it. One CUDA event is recorded after the batch's copies; the
  :class:`HostStates` it returns waits for that event before any of its tensors is read, so no reader can
  see an unfinished copy. Each row's NaN/inf values are counted there too, on the device, and copied along
  (:meth:`HostStates.row_counts`), so the shard writers sum counts instead of reading every byte.
  On CPU: ``.cpu()`` of each, as before (the tensors themselves; the writers count the bytes).
- :class:`BackgroundWriter`: :class:`rmfast.states.StatesWriter`'s steps, the slow ones in a thread. The
  scan's thread marks a batch's rows as stored (``claim``) and queues the rest, at most ``depth`` batches
  (so the host memory in flight stays bounded; a full queue makes the scan wait, counted in ``wait_s``):
  taking the rows in the stored dtype (on CPU at once, in the scan's thread, as the synchronous writer
  does; on CUDA in the writer thread, once the batch's event has fired), buffering them, and cutting a
  shard (at each checkpoint's :meth:`~BackgroundWriter.flush`, or once its bytes reach the cap). Every step
  runs in the order the scan asked for it, so each shard holds the rows the synchronous writer's would, under
  the same number: the files are the same bytes. A cut shard's count of non-finite values and its write run
  on one of :data:`WRITERS` threads, so shards are written side by side (one writer thread wrote 1.5 GB/s of bf16
  states into tmpfs on the H100's host, a 16-thread AMX Xeon, where the 8B's `--states all` needs ~3.5 GB/s for 1.5x a plain scan); a
  shard is cut only once fewer than that many are in flight, so at most that many cut shards are held (each at most
  :data:`rmfast.states.SHARD_BYTES`: a bigger batch is split by rows, so the last batch's shards are written side
  by side too).

The checkpoint semantics are :class:`~rmfast.states.StatesWriter`'s: a shard is written after the
checkpoint that holds its rows as done, and a resumed scan scores again every row the checkpoint holds
without a shard on disk (:meth:`~rmfast.states.StatesWriter.prepare`), so a kill while the thread writes
loses nothing. :func:`rmfast.scoring.batching.score_groups` calls :meth:`~BackgroundWriter.drain` before
it returns or raises, so a finished job's states are all on disk and no thread outlives its job; a Ctrl-C while it
drains skips the steps still queued (their rows are scored again on resume) but still waits for the shard writes in
flight, then is raised. A step that fails in the
thread (a full disk: the synchronous writer's one-line :class:`~rmfast.errors.UserError`) stops the
thread's work, and the scan's thread raises that same error at its next call; the manifest is written
only by :meth:`~BackgroundWriter.finish`, after everything queued is on disk.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator, Mapping

import numpy as np
import torch

#: batches queued for the writer thread at most (each holds one batch's states in host memory)
DEPTH = 2
#: shards written at once (each on a thread of its own; each holds up to a shard's bytes in host memory): a GPU
#: scan's kind of batches (bf16 states) through the writer into tmpfs, 1 / 2 / 4 writers: 1,961 / 2,607-3,444 / 3,479
#: MB/s on a 2-core AMD EPYC with avx512_bf16 (native bf16; benchmarks/results/states_writer_2026-11-27/); the H100's
#: host (a 16-thread Xeon with AMX) has more cores
WRITERS = 4
#: shards written at once while the scan still computes (its batches arrive): more writer threads there slow the scan's
#: own thread (every torch call it makes hands the GIL over) more than they speed the writes; after the last batch
#: (:meth:`BackgroundWriter.drain`) all :data:`WRITERS` write the tail side by side
SCAN_WRITERS = 2


class HostStates(Mapping):
    """name -> (B, d) CPU tensor whose device-to-host copies may still be running; reading any tensor
    first waits for them (``event.synchronize()``, once). ``fresh``: the tensors are buffers of their own,
    which nothing writes again (so :meth:`rmfast.states.StatesWriter.take` may keep them uncopied)."""

    fresh = True

    def __init__(self, tensors: dict, event=None, finite: torch.Tensor | None = None):
        self._t, self._event, self._finite = tensors, event, finite  # finite: (L, B), rows_finite of the tensors

    def row_counts(self) -> dict | None:
        """name -> (B,) int32 CPU tensor: each row's NaN/inf values, counted on the device before the copy (from
        ``finite``, :func:`rmfast.states.shard.rows_finite` in the tensors' order), or None; waits for the copies as a
        read does."""
        self.wait()
        if self._finite is None:
            return None
        return {k: (v.shape[1] - self._finite[i]).to(torch.int32) for i, (k, v) in enumerate(self._t.items())}

    @property
    def pending(self) -> bool:
        """Whether the copies were not yet waited for."""
        return self._event is not None

    def wait(self) -> None:
        if (event := self._event) is not None:  # read once: the writer thread and a sink may wait at the same time
            event.synchronize()
            self._event = None

    def __getitem__(self, name: str) -> torch.Tensor:
        self.wait()
        return self._t[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def __len__(self) -> int:
        return len(self._t)


def host_states(tensors: dict) -> Mapping:
    """name -> (B, d) tensor on any device -> the same on the host: on CUDA copies into pinned buffers on the
    copy stream, which do not block the host or the compute stream (:class:`HostStates`, one event for the
    batch), elsewhere ``.cpu()`` of each (a dict)."""
    if not tensors or next(iter(tensors.values())).device.type != "cuda":
        return {k: v.cpu() for k, v in tensors.items()}
    from ..states.shard import rows_finite

    device = next(iter(tensors.values())).device
    stream = _copy_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # after the forward that made the states
    out = {}
    with torch.cuda.stream(stream):
        for k, v in tensors.items():
            out[k] = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)  # (B, d)
            out[k].copy_(v, non_blocking=True)
            v.record_stream(stream)  # v's memory is not reused until this stream's copy of it is done
        # the rows' finite values counted here, at the device's bandwidth (~1 ms for a batch of the 8B's `all`), in one
        # (L, B) tensor and one copy (2L + 3 host calls), so the shard writers on the host need not read every byte
        # again (their count had been a third of their time)
        fin = rows_finite(list(tensors.values()))  # (L, B) int32
        finite = torch.empty(fin.shape, dtype=fin.dtype, pin_memory=True)
        finite.copy_(fin, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)  # after the batch's copies
    return HostStates(out, event, finite=finite)


_COPY_STREAMS: dict = {}  # CUDA device -> the stream its states' device-to-host copies run on


def _copy_stream(device: torch.device):
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device=device)
    return _COPY_STREAMS[device]


class BackgroundWriter:
    """A :class:`rmfast.states.StatesWriter` whose takes (on CUDA), buffering and shard writes run in a
    thread (see the module docstring). Same interface: prepare, add, flush, finish; and :meth:`drain`.

    Attributes:
        wait_s: seconds the scan's thread waited on the writer (a full queue, :meth:`drain`).
        busy_s: seconds the writer thread spent on its steps (taking, buffering, cutting shards, waiting for a
            free shard writer).
        write_s: seconds the shard writers spent counting and writing, summed over them.
    """

    def __init__(self, writer, depth: int = DEPTH, writers: int = WRITERS):
        self.w, self.depth, self.writers = writer, depth, writers
        self._q: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._err: BaseException | None = None
        self._pool = None
        self._writes: list = []  # the shards' writes in flight, oldest first (futures)
        self._skip = self._ending = False  # skip the queued steps (a Ctrl-C while draining); the end was queued
        self._exited = threading.Event()  # set by the writer thread as it ends
        self.wait_s = self.busy_s = self.write_s = 0.0
        self._tail = False  # drain began: no batch follows, every writer may write (the last batch's shards)
        self.scan_writers = min(self.writers, SCAN_WRITERS)  # writes at once while batches still arrive
        self._lock = threading.Lock()  # write_s: added to from the shard writers
        writer.run_shard = self._submit  # the writer's cut shards go to the pool (from the writer thread)

    @property
    def folder(self):
        return self.w.folder

    def prepare(self, done: np.ndarray) -> np.ndarray:
        self.drain()
        return self.w.prepare(done)

    def add(self, rows: np.ndarray, keys: np.ndarray, states: Mapping) -> None:
        """A batch, as :meth:`rmfast.states.StatesWriter.add`; returns once it is queued."""
        self._check()
        if (got := self.w.claim(rows, keys)) is None:
            return
        rows, keys, sel = got
        if getattr(states, "pending", False):  # its copies still running: the thread waits for them
            self._put(lambda: self.w.keep(rows, keys, sel, states))
        else:  # CPU tensors, possibly views of the engine's: taken (copied) now, as the synchronous writer does
            mats = self.w.take(states, sel)
            counts = self.w.row_counts(states, sel, mats)
            self._put(lambda: self.w.append(rows, keys, mats, counts))

    def flush(self) -> None:
        """Queue a shard of the rows buffered so far (the checkpoint that holds them is saved)."""
        self._check()
        self._put(self.w.flush)

    def drain(self) -> None:
        """Wait until every queued step is done and stop the thread; raise the error a step met."""
        t0 = time.perf_counter()
        self._tail = True
        try:
            self._stop()
        finally:
            self._tail = False
        self.wait_s += time.perf_counter() - t0
        self._check()

    def finish(self, scan: dict | None = None):
        """Everything on disk, then :meth:`rmfast.states.StatesWriter.finish` (the manifest, the folder renamed)."""
        self.drain()
        self.w.run_shard = lambda cut: cut()()  # what finish still buffers (nothing after a drain), at once
        return self.w.finish(scan)

    def stats(self) -> dict:
        return {"background": True, "wait_s": round(self.wait_s, 4), "busy_s": round(self.busy_s, 4),
                "write_s": round(self.write_s, 4), "writers": self.writers, "scan_writers": self.scan_writers}

    def _submit(self, cut) -> None:
        """Cut a shard (:meth:`rmfast.states.StatesWriter.cut`) once fewer than ``writers`` are in flight, and write it
        on the pool (called in the writer thread, in order): at most ``writers`` cut shards are held at once. Raises
        the first failed write's error (the step fails: the scan's thread raises it)."""
        from concurrent.futures import ThreadPoolExecutor

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.writers, thread_name_prefix="rmfast-shard")
        while len(self._writes) >= (self.writers if self._tail else self.scan_writers):
            self._writes[0].result()  # (popped below, in the loop: the tail may widen while this waits)
            self._writes.pop(0)
        self._writes.append(self._pool.submit(self._timed, cut()))

    def _timed(self, write) -> None:
        t0 = time.perf_counter()
        try:
            write()
        finally:
            with self._lock:
                self.write_s += time.perf_counter() - t0

    def _check(self) -> None:
        if self._err is not None:
            self._stop()  # the steps left are skipped: no thread outlives the failed job
            raise self._err

    def _stop(self) -> None:
        """Stop the thread once its queue is done and wait for every shard write (the first failed one's error is kept).
        A Ctrl-C meanwhile skips the steps still queued, still waits for what is running, and is raised after."""
        interrupt = None
        while True:
            try:
                self._halt()
                break
            except KeyboardInterrupt as e:  # the steps left are skipped: the waits below are the writes in flight
                interrupt, self._skip = e, True
        self._skip = False
        if interrupt is not None:
            raise interrupt

    def _halt(self) -> None:
        """:meth:`_stop`'s waits; an interrupted call can be made again (it waits for what is left). Each wait polls
        (0.1 s), so a Ctrl-C is raised here at once: a wait blocked in C sees it only if the signal hit this thread.
        Not ``Thread.join``: an interrupted join marks a running thread as stopped (CPython 3.11)."""
        from concurrent.futures import wait

        if self._thread is not None:
            while not self._ending:
                with contextlib.suppress(queue.Full):
                    self._q.put(None, timeout=0.1)
                    self._ending = True
            while not self._exited.wait(0.1):
                pass
            self._thread = self._q = None
        while self._writes:  # every shard's write is done (or failed: the first error is kept)
            while not wait(self._writes[:1], 0.1).done:
                pass
            if (e := self._writes[0].exception()) is not None and self._err is None:
                self._err = e
            self._writes.pop(0)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _put(self, step) -> None:
        if self._thread is None:
            self._q, self._ending, self._exited = queue.Queue(maxsize=self.depth), False, threading.Event()
            self._thread = threading.Thread(target=self._work, args=(self._q, self._exited), name="rmfast-states",
                                            daemon=True)
            self._thread.start()
        t0 = time.perf_counter()
        self._q.put(step)  # blocks while ``depth`` steps wait: the disk (or the copies) did not keep up
        self.wait_s += time.perf_counter() - t0

    def _work(self, q: queue.Queue, exited: threading.Event) -> None:
        try:
            while (step := q.get()) is not None:
                if self._err is not None or self._skip:
                    continue  # after a failure (or a Ctrl-C) nothing more is written; the scan's thread raises it
                t0 = time.perf_counter()
                try:
                    step()
                except BaseException as e:  # noqa: BLE001 - handed to the scan's thread, raised there
                    self._err = e
                self.busy_s += time.perf_counter() - t0
        finally:
            exited.set()


class Collect:
    """The in-memory states sink of :func:`rmfast.scoring.batching.score_groups` (``RewardScorer.score_with_states``):
    each row's states by name."""

    def __init__(self, n: int):
        self.n, self.out = n, {}

    def prepare(self, done):
        return done

    def add(self, rows, keys, states):
        for name, t in states.items():
            if name not in self.out:
                self.out[name] = torch.empty(self.n, t.shape[-1], dtype=t.dtype)  # (n_rows, Dm)
            self.out[name][torch.from_numpy(np.asarray(rows))] = t

    def flush(self):
        pass
