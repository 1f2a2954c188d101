#!/usr/bin/env python
"""Many prompts per batch, on and off: RewardScorer on K conversations x N responses, interleaved.

    PYTHONPATH=src python benchmarks/many_prompts.py [--prompt-tokens 64 512] [--prompts 16] [--n 4]
                                                     [--reps 3] [--dtype float32] [--out benchmarks/results]

"on": ``share_batches=True`` (conversations in waves share ragged batches, :meth:`RewardScorer._waves`);
"off": ``share_batches=False``, each conversation's rows in batches of their own (the CPU default). Same texts, same scorer, no plan cache between
calls (``cache_prompts=0``: every call encodes its prompts), the two modes alternating over ``--reps``
rounds; the best time of each counts. Model: the embedded SmolLM2-135M-Instruct with a seeded random
score head. Reports responses/s, batches and the largest score difference between the modes (fp32
rounding: other batch shapes). Rows to ``<out>/many_prompts_<stamp>.json``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

try:
    import rmfast  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np

from rmfast import RewardScorer, load
from rmfast.bench.best_of_n import text_of
from rmfast.bench.machine import log, machine_info
from rmfast.io import write_json
from rmfast.cpu import versions


def timed(scorers, convs, responses, waves: bool) -> tuple[float, np.ndarray, int]:
    scorer = scorers[waves]  # share_batches is decided when a scorer is made: one scorer each way, one model
    t0 = time.perf_counter()
    out = scorer.score(convs, responses)
    return time.perf_counter() - t0, np.array([x for s in out for x in s]), scorer.last_stats.n_batches


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--min-len", type=int, default=20)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    lm = load("smollm2-135m-instruct", random_head_seed=0, dtype=args.dtype, device="cpu")
    scorer = {w: RewardScorer(lm, cache_prompts=0, share_batches=w) for w in (False, True)}
    info, rng, rows = machine_info(next(lm.model.parameters()).device), random.Random(args.seed), []
    for P in args.prompt_tokens:
        convs = [text_of(lm.tokenizer, P, rng) for _ in range(args.prompts)]
        responses = [[text_of(lm.tokenizer, rng.randint(args.min_len, args.max_len), rng) for _ in range(args.n)]
                     for _ in convs]
        best = {True: float("inf"), False: float("inf")}
        got, batches = {}, {}
        for _ in range(args.reps):
            for waves in (True, False):
                t, s, b = timed(scorer, convs, responses, waves)
                best[waves], got[waves], batches[waves] = min(best[waves], t), s, b
        n = args.prompts * args.n
        row = {"prompt_tokens_target": P, "n_prompts": args.prompts, "n_responses": args.n,
               "on_s": round(best[True], 3), "off_s": round(best[False], 3),
               "on_responses_per_s": round(n / best[True], 2), "off_responses_per_s": round(n / best[False], 2),
               "speedup_on_over_off": round(best[False] / best[True], 3),
               "on_batches": batches[True], "off_batches": batches[False],
               "max_abs_diff": float(np.abs(got[True] - got[False]).max()), "dtype": args.dtype,
               "cpu_model": info["cpu_model"], "cpu_kind": info.get("cpu_kind"), "torch_threads": info["torch_threads"]}
        rows.append(row)
        log(f"P~{P} x{args.prompts} prompts, N={args.n}: waves on {row['on_responses_per_s']}/s ({row['on_batches']} "
            f"batches), off {row['off_responses_per_s']}/s ({row['off_batches']} batches): "
            f"{row['speedup_on_over_off']}x, max|diff| {row['max_abs_diff']:.1e}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"many_prompts_{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json(path, {"machine": info, "versions": versions(), "args": vars(args), "rows": rows})
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
