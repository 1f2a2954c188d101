"""The extra time of ``--states last`` and ``--states all`` over a plain scan (issue 24).

One process, one model (the embedded SmolLM2-135M-Instruct with a seeded random score head, so
the score head and its fast path run), the same ids; the three modes interleaved over ``--reps``
rounds (plain, last, all, plain, last, all, ...), each a full ``score_ids`` job through the
batching loop with a checkpoint, the states written to a fresh folder (shards + manifest) as
``rmfast scan --states`` does. Reports per mode the median scan time and its ratio to plain.

    PYTHONPATH=src python benchmarks/states_overhead.py --n 4096 --reps 5 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except Exception:
        return platform.processor() or "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from rmfast import load
    from rmfast.scoring.pipeline import StatesRequest, score_ids

    lm = load("smollm2-135m-instruct", dtype=args.dtype, device=args.device, random_head_seed=0)
    ids = np.arange(args.n, dtype=np.int64)
    prompt = "What, in one word, is the greatest thing ever?"
    tmp = Path(tempfile.mkdtemp())
    bs = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    times: dict[str, list[float]] = {"plain": [], "last": [], "all": []}
    ref = None

    def job(mode: str, r: int) -> float:
        nonlocal ref
        req = None if mode == "plain" else StatesRequest(mode, folder=tmp / f"{mode}{r}.states")
        if args.device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = score_ids(lm.model, lm.tokenizer, prompt, ids, head="score", batch_size=bs, progress=False,
                        checkpoint=tmp / f"{mode}{r}.npz", states=req)
        if args.device != "cpu":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if ref is None:
            ref = res.scores
        assert np.array_equal(res.scores, ref), "scores differ with --states"
        if req is not None:
            shutil.rmtree(req.folder)
        return dt

    job("plain", -1)  # warm-up (first-touch allocations, thread pools)
    for r in range(args.reps):
        for mode in times:
            times[mode].append(job(mode, r))
    med = {m: statistics.median(v) for m, v in times.items()}
    out = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "device": args.device, "dtype": args.dtype,
           "n": args.n, "reps": args.reps, "times_s": times, "median_s": med,
           "ratio_to_plain": {m: med[m] / med["plain"] for m in med},
           "states_bytes_per_row": {"last": 576 * torch.finfo(getattr(torch, args.dtype)).bits // 8,
                                    "all": 32 * 576 * torch.finfo(getattr(torch, args.dtype)).bits // 8}}
    print(json.dumps(out, indent=1))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
