#!/usr/bin/env python
"""Long responses to a short prompt on CPU: ``RewardScorer.score`` of one response of N tokens (and of four of
N/3..N), beside the plain Hugging Face forward of each whole conversation (what a user would otherwise run) and the
scorer's ``bmm`` attention form (``attention="reference"``: what ``auto`` ran for these rows before rows of
``FLASH_MIN_PROMPT``+ tokens took torch's flash kernel), and the machine's GEMM bound for the same tokens.

    PYTHONPATH=src python benchmarks/long_responses.py [--lengths 128,256,512,1024] [--model M] [--out CSV]

Each figure is the best of ``--repeats`` warm calls (the prompt's encoding cached, as in a GRPO run that scores
each group's completions together). ``gemm_bound_s``: the rows' projection FLOPs (and attention's, counted as
GEMM FLOPs) at the model-shaped fp32/bf16 GEMM rate measured in the same run; ``of_bound``: bound / wall. One CSV
row per (length, method) with the machine, versions and config; ``max_abs_diff`` is against the plain HF scores.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import torch

import rmfast
from rmfast.bench.flops import forward_flops, gemm_peak, model_dims
from rmfast.bench.machine import machine_info
from rmfast.bench.output import append_csv
from rmfast.scoring.conversation import as_conversation
from rmfast.version import __version__

PROMPT = [{"role": "user", "content": "What is the capital of France? Explain your answer in detail."}]
FILLER = "The quick brown fox jumps over the lazy dog near the river bank, and then it runs home again. "


def _text(tok, n_tokens: int) -> str:
    """A response of about ``n_tokens`` tokens."""
    words = (FILLER * (n_tokens // 8 + 2)).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the most words whose text is at most n_tokens tokens
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(tok(" ".join(words[:mid]))["input_ids"]) <= n_tokens else (lo, mid - 1)
    return " ".join(words[:lo])


def _best(fn, repeats: int) -> tuple[float, object]:
    out, best = None, float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--lengths", default="128,256,512,1024")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="CSV to append the rows to (default: print only)")
    args = ap.parse_args(argv)
    auto = rmfast.RewardScorer(args.model, random_head_seed=0, dtype=args.dtype, device="cpu")
    bmm = rmfast.RewardScorer((auto.model, auto.tokenizer), attention="reference", template=auto.template)
    model, tok = auto.model, auto.tokenizer
    dims = model_dims(model, "score")
    machine = {k: v for k, v in machine_info(torch.device("cpu")).items()
               if k in ("cpu_model", "cpu_kind", "isa_env", "torch_threads", "loadavg_start")}
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        long = _text(tok, n)
        for group, responses in (("one", [long]), ("four", [_text(tok, m) for m in (n // 3, n // 2, 3 * n // 4)] + [long])):
            seqs = [tok.apply_chat_template(PROMPT + [{"role": "assistant", "content": r}], tokenize=True,
                                            return_dict=False) for r in responses]

            def hf():
                with torch.no_grad():
                    return [float(model(torch.tensor([ids])).logits[0, 0]) for ids in seqs]

            wall_hf, ref = _best(hf, args.repeats)
            P = len(auto.template_for(as_conversation(PROMPT)).prefix_ids)
            tokens = sum(len(ids) for ids in seqs) - P * len(seqs)  # the rows' own tokens (the prompt's: cached)
            flops = sum(forward_flops(dims, len(ids) - P, past=P) for ids in seqs)
            peak = gemm_peak(dims, max(len(ids) - P for ids in seqs), model.dtype, torch.device("cpu"))["gflops"]
            bound = flops / (peak * 1e9)
            for method, fn in (("plain HF forward", hf), ("rmfast auto", lambda: auto.score([PROMPT], [responses])[0]),
                               ("rmfast bmm form", lambda: bmm.score([PROMPT], [responses])[0])):
                if method != "plain HF forward":
                    fn()  # the prompt's encoding and the layers: built once, as in a run
                wall, got = (wall_hf, ref) if method == "plain HF forward" else _best(fn, args.repeats)
                form = auto.last_stats.attention if method == "rmfast auto" else None
                row = {"length": n, "responses": group, "row_tokens": tokens, "prompt_tokens": P, "method": method,
                       "wall_s": round(wall, 4), "gemm_bound_s": round(bound, 4), "of_bound": round(bound / wall, 3),
                       "vs_hf": round(wall_hf / wall, 3), "max_abs_diff": float(max(abs(a - b) for a, b in zip(got, ref))),
                       "attention": form, "dtype": args.dtype, "model": args.model, "gemm_gflops": round(peak, 1),
                       "rmfast": __version__, "torch": torch.__version__, "python": platform.python_version(), **machine}
                rows.append(row)
                print(f"{n:5d} {group:4s} {method:17s} {wall:7.3f} s  x{row['vs_hf']:.2f} vs HF  "
                      f"{100 * row['of_bound']:5.1f}% of the GEMM bound  max|diff| {row['max_abs_diff']:.1e}", flush=True)
    if args.out:
        append_csv(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
