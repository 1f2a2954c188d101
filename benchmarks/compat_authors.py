#!/usr/bin/env python
"""What each quirk of the published scoring loop changes (``--compat authors``), counted on a vocabulary range.

    python benchmarks/compat_authors.py [--ids 0:3000] [--batch-size 32] [--config-pad ID] [--score-range 0:3000]

The model is the embedded SmolLM2-135M-Instruct loaded as a classifier with a seeded random score head
(``random_head_seed=0``, "SmolLM2-as-RM"), fp32, CPU. For each id of ``--ids`` it counts, from the
tokenization alone (no forward pass):

* (a) decode round trip: ids whose decoded text re-tokenizes, in context, to other ids;
* (b) double BOS: rows whose tokenized conversation starts with two BOS;
* (c) pad reads: rows the model's pooling reads at a pad position (and "early": before their end), in
  the loop's batches of ``--batch-size`` consecutive ids. SmolLM2's config pad equals its tokenizer's
  pad (``<|im_end|>``), so this is 0 unless ``--config-pad`` sets another id, as in reward models whose
  config names a pad the tokenizer does not pad with.

Then, on ``--score-range``, it scores the default (exact ids, shared-prompt engine) and the authors'
loop and reports how many scores move beyond fp32 rounding, the largest move, and how many of the
top/bottom 20 change. Prints a JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import rmfast  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np

PROMPT = "What, in one word, is the greatest thing ever?"


def counts(lm, ids: np.ndarray, bs: int) -> dict:
    from rmfast.scoring.candidates import tokenize_in_context
    from rmfast.scoring.compat import authors_diagnostics, authors_plan
    from rmfast.template import build_template

    tok = lm.tokenizer
    tmpl = build_template(tok, PROMPT)
    texts = [tok.decode([int(i)]) for i in ids]
    rows = tokenize_in_context(tok, tmpl, texts, compat="decode-retokenize")
    changed = [int(i) for i, r in zip(ids, rows) if r.template is not None or list(r.ids) != [int(i)]]
    convs, where = authors_plan(tok, tmpl, texts, ids, bs)
    d = authors_diagnostics(lm.model, tok, convs, where)
    return {"n": int(ids.size), "a_retokenized": len(changed), "a_examples": changed[:12],
            "b_double_bos": int(d["double_bos"].sum()), "c_pad_reads": int(d["pad_read"].sum()),
            "c_early_reads": int(d["early_read"].sum()), "config_pad_id": d["config_pad_id"],
            "tokenizer_pad_id": d["tokenizer_pad_id"], "padding_side": d["padding_side"], "batch_size": bs}


def moves(lm, ids: np.ndarray, bs: int) -> dict:
    from rmfast.scoring.pipeline import Selection, run_scan

    a, _ = run_scan(lm.model, lm.tokenizer, PROMPT, Selection(token_ids=ids), progress=False, audit=0)
    b, _ = run_scan(lm.model, lm.tokenizer, PROMPT, Selection(token_ids=ids, compat="authors"), batch_size=bs,
                    progress=False, audit=0)
    d = np.abs(a.scores.astype(np.float64) - b.scores)
    tol = 1e-4 * float(np.abs(a.scores).max())  # far above fp32 rounding of a 30-layer forward, far below a real move
    top = lambda s, k=20: set(np.argsort(-s, kind="stable")[:k].tolist())  # noqa: E731
    bot = lambda s, k=20: set(np.argsort(s, kind="stable")[:k].tolist())  # noqa: E731
    return {"score_range": [int(ids[0]), int(ids[-1]) + 1], "n_moved": int((d > tol).sum()), "tol": tol,
            "max_move": float(d.max()), "top20_changed": 20 - len(top(a.scores) & top(b.scores)),
            "bottom20_changed": 20 - len(bot(a.scores) & bot(b.scores))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", default="0:3000")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--config-pad", type=int, default=None, help="set the model config's pad_token_id (default: keep)")
    ap.add_argument("--score-range", default=None, help="also score this range both ways (default: counts only)")
    args = ap.parse_args()
    from rmfast import load

    lm = load("smollm2-135m-instruct", dtype="float32", device="cpu", random_head_seed=0)
    if args.config_pad is not None:
        lm.model._rmfast_checkpoint_pad_id = args.config_pad  # as if the checkpoint's config named it (rmfast.scoring.hf_path._config_pad)
    lo, hi = map(int, args.ids.split(":"))
    out = {"model": "smollm2-135m-instruct, random_head_seed=0", **counts(lm, np.arange(lo, hi), args.batch_size)}
    if args.score_range:
        lo, hi = map(int, args.score_range.split(":"))
        out.update(moves(lm, np.arange(lo, hi), args.batch_size))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
