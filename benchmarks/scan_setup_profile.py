#!/usr/bin/env python
"""Where a whole-vocabulary scan's set-up goes: the scan run twice (the first warms Triton and the caches), the
second under cProfile, its host time by function (cumulative), beside the manifest's setup_s / plan_s / scan_s.

    PYTHONPATH=src python3 benchmarks/scan_setup_profile.py [--model llama-3.1-8b] [--device cuda] [--top 40]

Random-init weights (:func:`rmfast.bench.random_init.random_init_model`); on the CPU use ``--tiny``. The set-up is
everything of ``rmfast.scan`` before its first batch: the template, the plan's decisions, the engine (weights'
fingerprint, layer tuples) and the prompt's pass.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="the architecture's tiny config (a CPU check of this script)")
    ap.add_argument("--ids", default=None, help="token ids to scan (default: the whole vocabulary)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--batches", action="store_true",
                    help="also each batch's seconds in both runs (the device synchronised after each: where the first "
                         "batch's extra time goes, and whether a second scan in the process still pays it)")
    args = ap.parse_args(argv)
    times: list[float] = []
    mallocs: list[tuple] = []  # after each batch (CUDA): (device allocations so far, MiB reserved)
    if args.batches:
        import time

        import torch

        from rmfast.scoring import batching

        real = batching.oom_batches

        def timed(n, bs, device, score, *a, **kw):  # each batch's score() call, the device synchronised after it
            def one(lo, hi, b):
                t0 = time.perf_counter()
                out = score(lo, hi, b)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                if device.type == "cuda":  # the caching allocator's trips to the driver (a first batch's new blocks)
                    st = torch.cuda.memory_stats()
                    mallocs.append((st.get("num_device_alloc", st.get("segment.all.allocated", -1)),
                                    torch.cuda.memory_reserved() / 2**20))
                return out
            return real(n, bs, device, one, *a, **kw)

        batching.oom_batches = timed
        kernel_calls = _time_kernel_launches()

    from rmfast.bench.random_init import random_init_model
    from rmfast.scoring.pipeline import scan

    lm = random_init_model(args.model, device=args.device, dtype=args.dtype, tiny=args.tiny)
    prompt = "What, in one word, is the greatest thing ever?"

    def run():
        return scan(lm.model, lm.tokenizer, prompt, engine="fast", progress=False, token_ids=args.ids)

    first = run().manifest
    first_times, times[:] = list(times), []
    first_mallocs, mallocs[:] = list(mallocs), []
    first_kernels = {k: list(v) for k, v in kernel_calls.items()} if args.batches else {}
    if args.batches:
        kernel_calls.clear()
    prof = cProfile.Profile()
    if not args.batches:  # with --batches the second scan runs unprofiled: its batches' times compare with the first's
        prof.enable()
    m = run().manifest
    prof.disable()
    if args.batches:
        for tag, ts, ms, ks in (("first", first_times, first_mallocs, first_kernels),
                                ("second", times, mallocs, kernel_calls)):
            print(f"{tag} run's batches (s): " + " ".join(f"{t:.3f}" for t in ts))
            if ms:
                print(f"{tag} run's device allocations so far / MiB reserved, after each batch: "
                      + " ".join(f"{n}/{r:.0f}" for n, r in ms))
            for name, calls in sorted(ks.items(), key=lambda kv: -kv[1][0]):
                rest = sorted(calls[1:])
                print(f"{tag} run: Triton kernel {name}: first launch {calls[0] * 1e3:.2f} ms host, then median "
                      f"{rest[len(rest) // 2] * 1e3 if rest else float('nan'):.3f} ms over {len(rest)} launches")
    for tag, x in (("first", first), ("second" if args.batches else "second (profiled)", m)):
        print(f"{tag}: wall {x['wall_s']} s, setup {x['setup_s']} s (plan {x.get('plan_s')} s), scan {x['scan_s']} s, "
              f"{x['candidates_per_s']} cand/s, batch {x['batch_size']}")
    if not args.batches:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.top)
        print(s.getvalue())
    return 0


def _time_kernel_launches() -> dict:
    """Each Triton kernel's launches' host seconds, by kernel name, in call order (the first launch in a process
    finds or compiles the kernel and loads its module: is that where a first batch's extra time goes?). Empty where
    Triton is absent or unused (the CPU)."""
    import time

    calls: dict = {}
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return calls
    real = JITFunction.run

    def run(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return real(self, *a, **kw)
        finally:
            calls.setdefault(getattr(self.fn, "__name__", "?"), []).append(time.perf_counter() - t0)
    JITFunction.run = run
    return calls


if __name__ == "__main__":
    sys.exit(main())
