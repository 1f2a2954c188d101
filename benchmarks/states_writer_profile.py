"""Where the states writer's time goes per byte (``--states all`` wrote at a fifth of the disk's speed).

Feeds :class:`rmfast.states.StatesWriter` (in the caller's thread, and through
:class:`rmfast.scoring.states_stream.BackgroundWriter`) synthetic bfloat16 states shaped like an 8B scan's
``--states all``: ``--batches`` batches of ``--layers`` x (``--rows``, ``--hidden``), then one shard
(``flush``). Times the whole writer and its ``take`` and ``flush``; the background writer again with the batches
as a GPU scan hands them over (fresh host buffers, taken uncopied) and its shards (256 MiB) written by 1, 2 and 4
threads side by side (``BackgroundWriter(writers=)``); then, on the same buffered batches, the
steps a flush may take: ``torch.cat`` of the batches, the NaN/inf count by ``torch.isfinite`` and by the bits
(:func:`rmfast.states.shard.count_nonfinite`), ``safetensors.torch.save_file`` of the joined tensors and
:func:`rmfast.states.shard.write_shard` of the pieces; beside a raw ``open().write()`` of the same bytes into
the same folder (no fsync: the writer does none; page cache, then the disk once dirty pages are throttled)
and the same with an fsync, and the states bench's fsync'ed disk probe writing 1, 2 and 4 files side by side
(:func:`rmfast.bench.states_overhead.disk_write_mb_s`). MB/s: 1e6 bytes of states per second. Each figure is the median of
``--repeats`` rounds, the rounds interleaved.

    PYTHONPATH=src python benchmarks/states_writer_profile.py [--batches 4 --rows 1024 --layers 34 --hidden 4096]

Runs against an older tree too (``PYTHONPATH=<other>/src``): the steps it lacks are left out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def raw_write(path: Path, bufs: list, fsync: bool) -> float:
    def go():
        with open(path, "wb") as f:
            for b in bufs:
                f.write(b)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    dt = _timed(go)
    path.unlink()
    return dt


class _Fired:
    """A CUDA event whose copies are done: HostStates of it are a GPU scan's batches (fresh pinned buffers, taken
    in the writer thread and kept uncopied)."""

    def synchronize(self) -> None:
        pass


def writer_round(tmp: Path, batches: list, layers: list[str], background: bool, writers: int | None = None) -> dict:
    """One writer over the batches and one flush: seconds in all (and, in the caller's thread, per step).
    ``writers``: the batches as a GPU scan hands them over (:class:`_Fired`), shards written by that many threads."""
    from rmfast.scoring.states_stream import BackgroundWriter, HostStates
    from rmfast.states import StatesWriter

    w = StatesWriter(tmp / "s.states", layers, "bfloat16", "row", job="profile")
    n = sum(len(b[layers[0]]) for b in batches)
    w.prepare(np.zeros(n, dtype=bool))
    out, lo, t0 = {"take": 0.0}, 0, time.perf_counter()
    ww = (BackgroundWriter(w) if writers is None else BackgroundWriter(w, writers=writers)) if background else None
    if writers is not None:
        batches = [HostStates(b, _Fired()) for b in batches]
    for b in batches:
        rows = np.arange(lo, lo + len(b[layers[0]]))
        lo += len(rows)
        if ww is not None:
            ww.add(rows, rows, b)
            continue
        got = w.claim(rows, rows)
        t1 = time.perf_counter()
        mats = w.take(b, got[2])
        out["take"] += time.perf_counter() - t1
        w.append(got[0], got[1], mats)
    if ww is not None:
        ww.flush()
        ww.drain()
    else:
        out["flush"] = _timed(w.flush)
    out["total"] = time.perf_counter() - t0
    shutil.rmtree(w.partial)
    return out


def scan_round(tmp: Path, batches: list, layers: list[str], gap: float, shard_bytes: int | None) -> tuple[float, float]:
    """The batches handed over as a GPU scan does, one every ``gap`` seconds (the device computing, the host idle),
    through the background writer with its pool, shards cut at ``shard_bytes`` (None: the tree's own
    ``SHARD_BYTES``): (seconds from the first batch to ``finish`` returned, seconds of that after the last batch)."""
    from rmfast.scoring.states_stream import BackgroundWriter, HostStates
    from rmfast.states import StatesWriter

    w = StatesWriter(tmp / "scan.states", layers, "bfloat16", "row", job="profile")
    if shard_bytes is not None:
        w.shard_bytes = shard_bytes
    ww = BackgroundWriter(w)
    n = sum(len(b[layers[0]]) for b in batches)
    ww.prepare(np.zeros(n, dtype=bool))
    lo, t0 = 0, time.perf_counter()
    for b in batches:
        time.sleep(gap)
        rows = np.arange(lo, lo + len(b[layers[0]]))
        lo += len(rows)
        ww.add(rows, rows, HostStates(b, _Fired()))
    t1 = time.perf_counter()
    ww.finish({})
    t2 = time.perf_counter()
    shutil.rmtree(tmp / "scan.states")
    return t2 - t0, t2 - t1


def step_round(tmp: Path, taken: list[dict], layers: list[str]) -> dict:
    """A flush's possible steps, each alone, on the taken batches (name -> (b, d) bf16)."""
    from safetensors.torch import save_file

    pieces = {f"layer.{l}": [b[l] for b in taken] for l in layers}
    out = {}
    cat = {}
    out["torch.cat"] = _timed(lambda: cat.update({k: torch.cat(v) for k, v in pieces.items()}))
    out["count by isfinite"] = _timed(lambda: [int((~torch.isfinite(t)).sum()) for t in cat.values()])
    out["save_file(joined)"] = _timed(lambda: save_file(cat, str(tmp / "a.safetensors")))
    (tmp / "a.safetensors").unlink()
    try:
        from rmfast.states.shard import count_nonfinite, write_shard
    except ImportError:
        return out
    out["count by bits"] = _timed(lambda: [count_nonfinite(v) for v in pieces.values()])
    out["write_shard(pieces)"] = _timed(lambda: write_shard(tmp / "b.safetensors", pieces))
    (tmp / "b.safetensors").unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=34)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="folder to write in (default: the system's temporary folder)")
    ap.add_argument("--gap", type=float, default=None,
                    help="only the scan-shaped rounds: a batch every GAP seconds (the H200's 8B scan: ~0.05), shards cut "
                         "at 256 and 64 MiB; time over the batches' own, and after the last batch")
    a = ap.parse_args()
    layers = [str(i) for i in range(a.layers)]
    g = torch.Generator().manual_seed(0)
    batches = [{l: torch.randn(a.rows, a.hidden, generator=g).to(torch.bfloat16) for l in layers}
               for _ in range(a.batches)]
    nbytes = a.batches * a.rows * a.layers * a.hidden * 2
    print(f"{a.batches} batches x {a.layers} layers x ({a.rows}, {a.hidden}) bf16 = {nbytes / 1e6:,.0f} MB; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    res: dict[str, list[float]] = {}
    if a.gap is not None:
        scan_rounds(a, batches)
        return
    with tempfile.TemporaryDirectory(prefix="rmfast-writer-prof-", dir=a.dir) as d:
        tmp = Path(d)
        bufs = [t.view(torch.uint8).numpy() for b in batches for t in b.values()]
        taken = [{l: t.clone() for l, t in b.items()} for b in batches]
        for _ in range(a.repeats):
            res.setdefault("raw write", []).append(raw_write(tmp / "raw.bin", bufs, False))
            res.setdefault("raw write+fsync", []).append(raw_write(tmp / "raw.bin", bufs, True))
            try:  # the states bench's fsync'ed probe of the folder, in 1, 2 and 4 files side by side
                from rmfast.bench.states_overhead import disk_write_mb_s

                for k in (1, 2, 4):
                    res.setdefault(f"disk probe ({k} stream{'s' * (k > 1)})", []).append(
                        nbytes / 1e6 / disk_write_mb_s(tmp, nbytes, streams=k))
            except (TypeError, ImportError):  # trees before the probe's streams: left out
                pass
            r = writer_round(tmp, batches, layers, background=False)
            res.setdefault("writer (sync)", []).append(r["total"])
            res.setdefault("  take", []).append(r["take"])
            res.setdefault("  flush", []).append(r["flush"])
            res.setdefault("writer (background)", []).append(writer_round(tmp, batches, layers, True)["total"])
            try:  # a GPU scan's batches, shards written by 1, 2 and 4 threads (trees before the pool: left out)
                for k in (1, 2, 4):
                    t = writer_round(tmp, batches, layers, True, writers=k)["total"]
                    res.setdefault(f"writer (GPU-like, {k} shard writer{'s' * (k > 1)})", []).append(t)
            except (TypeError, ImportError):
                pass
            for k, v in step_round(tmp, taken, layers).items():
                res.setdefault("step: " + k, []).append(v)
    raw = statistics.median(res["raw write"])
    for k, ts in res.items():
        m = statistics.median(ts)
        print(f"{k:>34}: {m:7.3f} s  {nbytes / m / 1e6:8,.0f} MB/s  ({raw / m:5.2f} of raw write)")


def scan_rounds(a, batches: list) -> None:
    """``--gap``: :func:`scan_round` at each shard cap, interleaved, ``--repeats`` times; medians."""
    layers = list(batches[0])
    caps = {"256 MiB": 256 << 20, "64 MiB": 64 << 20}
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in caps}
    with tempfile.TemporaryDirectory(prefix="rmfast-writer-scan-", dir=a.dir) as d:
        for _ in range(a.repeats):
            for k, cap in caps.items():
                res[k].append(scan_round(Path(d), batches, layers, a.gap, cap))
    busy = a.gap * len(batches)
    print(f"scan-shaped: a batch every {a.gap} s ({busy:.2f} s of batches), 4 shard writers, medians of {a.repeats}")
    for k, v in res.items():
        total, tail = statistics.median(t for t, _ in v), statistics.median(t for _, t in v)
        print(f"  shards of {k:>7}: {total:6.3f} s = {total / busy:4.2f}x the batches' time; "
              f"{tail:6.3f} s after the last batch")


if __name__ == "__main__":
    main()
