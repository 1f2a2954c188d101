#!/usr/bin/env python
"""The states writer fed as a GPU scan feeds it, on a CPU: what the scan's own thread loses to the writers.

An 8B scan's ``--states all`` (``--batches`` batches of 34 layers x (1024, 4096) bf16, 2.28 GB) handed to
:class:`rmfast.scoring.states_stream.BackgroundWriter` as :func:`rmfast.scoring.states_stream.host_states` hands
them over on CUDA (fresh host buffers, their copies done): before each batch the scan's thread runs a "launch loop"
(``--launches`` tiny torch ops: each hands the interpreter lock over, as a GPU scan's kernel launches do) and
sleeps ``--sleep`` s (the device's time). ``--counts device``: the batches bring each row's finite-value count, as a
GPU's do since 2026-12-01 (counted on the device before the copy: the scan's thread makes the count's 2L + 3 calls
too, emulated as tiny torch ops); ``host``: the shard writers count the bytes.
Prints medians over ``--repeats`` rounds (after a warm-up): the whole run, the launch loops' sum, the tail the scan
waited for after its last batch, and the writers' summed time.

    PYTHONPATH=src python benchmarks/states_gpu_feed.py --dir /dev/shm --counts device
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--launches", type=int, default=3000)
    ap.add_argument("--sleep", type=float, default=0.04)
    ap.add_argument("--counts", choices=("host", "device"), default="device")
    ap.add_argument("--dir", default=None, help="where the states folder goes (default: the temp dir)")
    ap.add_argument("--repeats", type=int, default=4)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from rmfast.scoring.states_stream import BackgroundWriter, HostStates
    from rmfast.states import StatesWriter

    class Fired:  # the batch's copies are done
        def synchronize(self):
            pass

    layers = [str(i) for i in range(34)]
    g = torch.Generator().manual_seed(0)
    src = [{l: torch.randn(1024, 4096, generator=g).to(torch.bfloat16) for l in layers} for _ in range(a.batches)]
    full = torch.full((len(layers), 1024), 4096, dtype=torch.int32)  # (L, B) finite values a row: no NaN/inf
    runs = []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for r in range(a.repeats + 1):
            w = StatesWriter(Path(d) / f"s{r}.states", layers, "bfloat16", "row", job="feed")
            ww = BackgroundWriter(w)
            ww.prepare(np.zeros(1024 * a.batches, dtype=bool))
            t0, launch, y = time.perf_counter(), 0.0, torch.zeros(16)
            for i, b in enumerate(src):
                t = time.perf_counter()
                for _ in range(a.launches):
                    y = torch.add(y, 1.0)
                launch += time.perf_counter() - t
                time.sleep(a.sleep)
                rows = np.arange(1024 * i, 1024 * (i + 1))
                finite = None
                if a.counts == "device":  # the count's own launches on the scan's thread (host_states: 2L + 3 calls)
                    t = time.perf_counter()
                    for _ in range(2 * len(layers) + 3):
                        y = torch.add(y, 1.0)
                    launch += time.perf_counter() - t
                    finite = full
                ww.add(rows, rows, HostStates(dict(b), Fired(), finite=finite))
            t = time.perf_counter()
            ww.finish({})
            tail, total, st = time.perf_counter() - t, time.perf_counter() - t0, ww.stats()
            shutil.rmtree(w.folder)  # (a tmpfs holds one run's 2.28 GB at a time)
            if r:  # the first round warms the page cache and the allocator
                runs.append((total, launch, tail, st["write_s"]))
    med = [statistics.median(x[k] for x in runs) for k in range(4)]
    gb = a.batches * 34 * 1024 * 4096 * 2 / 1e9
    print(f"counts {a.counts}: {gb:.2f} GB of states, median of {a.repeats}: total {med[0]:.3f} s, launch loops "
          f"{med[1]:.3f} s, tail after the last batch {med[2]:.3f} s, writers' summed time {med[3]:.3f} s "
          f"(totals {[round(x[0], 2) for x in runs]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
