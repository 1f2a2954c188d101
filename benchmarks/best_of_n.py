#!/usr/bin/env python
"""Best-of-N scoring: rmfast's RewardScorer vs the way users do it today, side by side in one run.

    python benchmarks/best_of_n.py [--prompt-tokens 64 512 2048] [--n 4 16 64] [--prompts 1]
                                   [--min-len 20] [--max-len 200] [--hf-batch 16] [--dtype float32]
                                   [--threads N] [--out benchmarks/results]

Model: the embedded SmolLM2-135M-Instruct as a reward model (``rmfast.load("smollm2-135m-instruct",
random_head_seed=0)``: the backbone with a seeded random one-output score head). For each (prompt
length, N): ``--prompts`` prompts of about that many tokens, N responses each of mixed lengths drawn
uniformly from [min-len, max-len] tokens.

- ``hf``: the HF ``AutoModelForSequenceClassification`` (the same loaded model) on right-padded
  batches of ``--hf-batch`` full conversations (``apply_chat_template`` text, ``tokenizer(padding=True)``),
  read by HF's own pooling (the last non-pad token; SmolLM2's pad is ``<|im_end|>``, the rows end in
  ``\\n``, so it reads each row's final token); tokenization included.
- ``rmfast``: ``RewardScorer.score`` (prompt encoded once, responses of similar lengths in ragged batches),
  tokenization included, no plan cache between repeats (``cache_prompts=0``).

Reported per configuration: responses/s of each, the speed-up, the FLOP ratio it should approach
(tokens the baseline runs / tokens rmfast runs, i.e. ~(prompt + response) / response; and with the
baseline's padding), each method's projection GFLOP/s as a fraction of the GEMM bound measured on this
machine on the model's projection shapes (:func:`rmfast.bench.flops.gemm_peak`), and the largest score
difference between the two. Rows go to ``<out>/best_of_n_<timestamp>.csv`` and ``.json``.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import time
from pathlib import Path

try:
    import rmfast  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
import torch

from rmfast import RewardScorer, load
from rmfast.bench.flops import gemm_peak, model_dims
from rmfast.bench.machine import log, machine_info
from rmfast.io import write_json
from rmfast.version import versions

WORDS = ("the of and to in is was for on that with as by at from this be it an are or have not which one all "
         "their more time can out about there some would when other into first year only over new most people "
         "river garden careful bright music window answer question simple reason number history water light "
         "mountain city market letter evening morning paper table story friend language science").split()


def text_of(tok, n_tokens: int, rng: random.Random) -> str:
    """A text of about ``n_tokens`` tokens of common words (trimmed word by word to the count)."""
    words = [rng.choice(WORDS) for _ in range(n_tokens)]
    while len(words) > 1 and len(tok(" ".join(words), add_special_tokens=False)["input_ids"]) > n_tokens:
        words = words[:-max(1, (len(tok(" ".join(words), add_special_tokens=False)["input_ids"]) - n_tokens) // 2)]
    return " ".join(words).capitalize() + "."


@torch.no_grad()
def hf_padded(model, tok, convs, responses, batch: int) -> tuple[np.ndarray, int, int]:
    """Scores the users' way: full conversations, right-padded batches, HF's pooling. Returns (scores,
    real tokens, padded tokens)."""
    texts = [tok.apply_chat_template([{"role": "user", "content": c}, {"role": "assistant", "content": r}],
                                     tokenize=False) for c, rs in zip(convs, responses) for r in rs]
    out, real, padded = [], 0, 0
    old_side, tok.padding_side = tok.padding_side, "right"
    try:
        for s in range(0, len(texts), batch):
            enc = tok(texts[s:s + batch], padding=True, return_tensors="pt", add_special_tokens=False)
            real += int(enc["attention_mask"].sum())
            padded += enc["input_ids"].numel()
            out.append(model(**enc).logits[:, 0].float())
    finally:
        tok.padding_side = old_side
    return torch.cat(out).numpy(), real, padded


def run_config(lm, scorer, P: int, N: int, args, rng: random.Random, dims: dict, peak: float) -> dict:
    tok = lm.tokenizer
    convs = [text_of(tok, P, rng) for _ in range(args.prompts)]
    lens = [[rng.randint(args.min_len, args.max_len) for _ in range(N)] for _ in convs]
    responses = [[text_of(tok, n, rng) for n in ls] for ls in lens]
    times = {"hf": [], "rmfast": []}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        hf, real, padded = hf_padded(lm.model, tok, convs, responses, args.hf_batch)
        times["hf"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rm = np.array([x for s in scorer.score(convs, responses) for x in s])
        times["rmfast"].append(time.perf_counter() - t0)
    st = scorer.last_stats
    n = st.n_responses
    rm_tokens = st.response_tokens + st.prompt_tokens  # every token rmfast runs through the layers
    t_hf, t_rm = min(times["hf"]), min(times["rmfast"])
    flop = lambda tokens: 2.0 * dims["gemm_params"] * tokens  # noqa: E731 - projection FLOPs (attention not counted)
    return {
        "prompt_tokens_target": P, "n_responses": N, "n_prompts": args.prompts,
        "prompt_tokens": round(st.prompt_tokens / len(convs), 1),
        "response_tokens_mean": round(st.response_tokens / st.n_rows, 1),
        "hf_s": round(t_hf, 3), "rmfast_s": round(t_rm, 3),
        "hf_responses_per_s": round(n / t_hf, 2), "rmfast_responses_per_s": round(n / t_rm, 2),
        "speedup": round(t_hf / t_rm, 2),
        "flop_ratio": round(real / rm_tokens, 2), "flop_ratio_with_padding": round(padded / rm_tokens, 2),
        "speedup_over_flop_ratio": round(t_hf / t_rm / (real / rm_tokens), 3),
        "hf_gemm_fraction": round(flop(padded) / t_hf / 1e9 / peak, 3),
        "rmfast_gemm_fraction": round(flop(rm_tokens) / t_rm / 1e9 / peak, 3),
        "rmfast_batches": st.n_batches, "rmfast_padded_rows": st.padded_rows, "rmfast_padded_tokens": st.padded_tokens,
        "rmfast_padding_waste": round(st.padding_waste, 4),
        "hf_padding_fraction": round(1 - real / padded, 3),
        "max_abs_diff": float(np.abs(hf - rm).max()), "score_std": float(np.std(hf)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 512, 2048])
    ap.add_argument("--n", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--prompts", type=int, default=1, help="prompts per configuration (default 1)")
    ap.add_argument("--min-len", type=int, default=20)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--hf-batch", type=int, default=16, help="conversations per padded HF batch (default 16)")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per method; the best counts (default 1)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load("smollm2-135m-instruct", random_head_seed=0, dtype=args.dtype, device=args.device)
    scorer = RewardScorer(lm, cache_prompts=0)
    dev = next(lm.model.parameters()).device
    dims = model_dims(lm.model, "score")
    peak = gemm_peak(dims, 512, next(lm.model.parameters()).dtype, dev)["gflops"]
    info = machine_info(dev)
    log(f"{info['cpu_model']}, {info['torch_threads']} threads; GEMM bound on the model's shapes (M=512): {peak:.1f} GFLOP/s")
    rng, rows = random.Random(args.seed), []
    for P in args.prompt_tokens:
        for N in args.n:
            r = run_config(lm, scorer, P, N, args, rng, dims, peak)
            rows.append({**r, "dtype": args.dtype, "device": str(dev), "cpu_model": info["cpu_model"],
                         "torch_threads": info["torch_threads"], "gemm_bound_gflops": round(peak, 1)})
            log(f"P~{P:5d} N={N:3d}: hf {r['hf_responses_per_s']:8.2f}/s  rmfast {r['rmfast_responses_per_s']:8.2f}/s  "
                f"speed-up {r['speedup']:5.2f}x  FLOP ratio {r['flop_ratio']:5.2f} ({r['flop_ratio_with_padding']:.2f} "
                f"padded)  GEMM fraction hf {r['hf_gemm_fraction']:.2f} rmfast {r['rmfast_gemm_fraction']:.2f}  "
                f"max|diff| {r['max_abs_diff']:.2e}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"best_of_n_{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_json(out / f"best_of_n_{stamp}.json", {"machine": info, "versions": versions(), "args": vars(args), "rows": rows})
    log(f"wrote {out}/best_of_n_{stamp}.csv and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
