#!/usr/bin/env python
"""``--states all`` against a plain scan under several writer settings, one model and one process: how many shard
writes run side by side while the scan still computes (``states_stream.SCAN_WRITERS``; after its last batch all
``WRITERS`` write the tail) and the NaN/inf count's chunk (``states.shard._CHUNK``).

Why: on the H200 (2026-12-01) ``all`` into /dev/shm took 2.53x a plain scan where it had taken 1.95x before shards
were capped at 64 MiB (2026-11-29). The cap kept four shard writes running through the scan; each takes Python's GIL
many times a shard (the count, the writes), and every torch call of the scan's thread hands the GIL over and waits to
get it back (a helper's probe: /work/walk_states.md). Fewer writes at once during the scan, or fewer GIL hand-overs
per shard, should give the scan's thread its launches back. Rounds interleaved: plain, then each setting.

    PYTHONPATH=src python3 benchmarks/states_writers_sweep.py [--model llama-3.1-8b] [--device cuda] [--n 8192]
    PYTHONPATH=src python3 benchmarks/states_writers_sweep.py --tiny --device cpu --dtype float32 --n 64 --batch 16

Prints one line per setting (median seconds, x plain, writer wait/busy, shard write time) and writes them to
``--out`` (JSON) if given. Run with ``TMPDIR=/dev/shm`` for the target's condition (a "disk" that keeps up).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b", help="a --random-init name")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", default="4:18,2:18,1:18,2:20",
                    help="comma list of SCAN_WRITERS:log2(chunk elements), e.g. 4:18 (the code before the sweep)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from rmfast.bench.machine import log, machine_info
    from rmfast.bench.random_init import load_workload_model
    from rmfast.bench.states_overhead import StatesOverheadConfig, _Jobs
    from rmfast.scoring import states_stream
    from rmfast.states import shard

    cfg = StatesOverheadConfig(random_init=args.model, tiny=args.tiny, device=args.device, dtype=args.dtype, n=args.n,
                               batch_size=args.batch, repeats=args.repeats, modes=("all",))
    settings = [tuple(int(x) for x in s.split(":")) for s in args.settings.split(",")]
    lm, name, template = load_workload_model(cfg)
    before = (states_stream.SCAN_WRITERS, shard._CHUNK)
    times: dict[str, list[float]] = {}
    writer: dict[str, list[tuple]] = {}

    def use(s):
        states_stream.SCAN_WRITERS, shard._CHUNK = s[0], 1 << s[1]

    with tempfile.TemporaryDirectory(prefix="rmfast-states-sweep-") as tmp:
        jobs = _Jobs(lm, template, cfg, Path(tmp))
        t0 = time.perf_counter()
        jobs.run("plain", -1)
        for s in settings:  # warm-up, each setting once
            use(s)
            jobs.run("all", -1)
        log(f"{name}: {cfg.n} ids, batch {args.batch}, warm-up {time.perf_counter() - t0:.1f} s; {args.repeats} rounds")
        for r in range(args.repeats):
            line = []
            for key, s in [("plain", None)] + [(f"all w{s[0]} c2^{s[1]}", s) for s in settings]:
                if s is not None:
                    use(s)
                jobs.writer.pop("all", None)
                dt, _ = jobs.run("plain" if s is None else "all", r)
                times.setdefault(key, []).append(dt)
                if s is not None:
                    writer.setdefault(key, []).extend(jobs.writer.get("all", []))
                line.append(f"{key} {dt:.3f}")
            log(f"round {r + 1}: " + "  ".join(line))
    states_stream.SCAN_WRITERS, shard._CHUNK = before
    plain = statistics.median(times["plain"])
    rows = []
    for key, ts in times.items():
        w = writer.get(key, [])
        row = {"setting": key, "median_s": round(statistics.median(ts), 4), "x_plain": round(statistics.median(ts) / plain, 3),
               "times_s": [round(t, 4) for t in ts],
               "writer_wait_s": round(statistics.median(x[0] for x in w), 4) if w else None,
               "writer_busy_s": round(statistics.median(x[1] for x in w), 4) if w else None,
               "shard_write_s": round(statistics.median(x[2] for x in w), 4) if w and w[0][2] is not None else None}
        rows.append(row)
        log(f"{key:>16}: median {row['median_s']:.3f} s ({row['x_plain']:.3f}x plain), waited on the writer "
            f"{row['writer_wait_s']} s, writer busy {row['writer_busy_s']} s, shard writes {row['shard_write_s']} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": name, "n": cfg.n, "batch": args.batch, "device": args.device,
                                              "dtype": args.dtype, "machine": machine_info(jobs.dev), "rows": rows},
                                             indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
