#!/usr/bin/env python
"""The fixed host cost of every ``RewardScorer.score`` call, apart from its scoring: the check that the weights are
unchanged, and the switch to eval mode (:func:`rmfast.scoring.model_mode.scoring_mode`, autocast off too). On a GPU host run f's profile found them ~15% of a small best-of-N call
(``benchmarks/results/gpu_h100_2026-11-27_f/profile.txt``: 512 x 16, 106.6 ms wall).

    PYTHONPATH=src python benchmarks/scorer_call_overhead.py [--layers 32] [--device cpu] [--out CSV]

Side by side in one process, on a random Llama of ``--layers`` layers (32: the 8B's 291 parameters and ~420 modules,
tiny widths, so only the per-parameter and per-module work is timed):
  - ``fingerprint, fresh``: :func:`rmfast.scoring.weights.weights_fingerprint`, each parameter's samples sliced anew
    (what every call cost before the scorer kept them);
  - ``fingerprint, kept views``: :class:`rmfast.scoring.weights.WeightsWatch`, the scorer's check now;
  - ``eval mode, model in training``: the modes set and restored (what every call did);
  - ``eval mode, model in eval``: nothing to set (the scorer's usual case now).
Best of 5 x 50 calls each; one CSV row per measurement with the machine, versions and config.
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit

import torch
import transformers as tf

from rmfast.bench.machine import machine_info
from rmfast.bench.output import append_csv
from rmfast.scoring.model_mode import scoring_mode
from rmfast.scoring.weights import WeightsWatch, weights_fingerprint
from rmfast.version import __version__


def _per_call_ms(fn, number: int = 50, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="CSV to append the rows to (default: print only)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cfg = tf.LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=args.layers,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=2)
    model = tf.LlamaForSequenceClassification(cfg).to(device).requires_grad_(False)
    n_params, n_modules = len(list(model.parameters())), len(list(model.modules()))
    watch = WeightsWatch()

    def switch():
        with scoring_mode(model):
            pass

    rows = []
    for what, fn, train in (("fingerprint, fresh", lambda: weights_fingerprint(model), False),
                            ("fingerprint, kept views", lambda: watch(model), False),
                            ("eval mode, model in training", switch, True),
                            ("eval mode, model in eval", switch, False)):
        model.train(train)
        ms = _per_call_ms(fn)
        rows.append({"measurement": what, "ms_per_call": round(ms, 4), "layers": args.layers, "parameters": n_params,
                     "modules": n_modules, "device": str(device), "rmfast": __version__, "torch": torch.__version__,
                     "python": platform.python_version(), **{k: v for k, v in machine_info(device).items()
                                                             if k in ("cpu_model", "cpu_kind", "gpu", "torch_threads")}})
        print(f"{what:32s} {ms:8.3f} ms per call  ({n_params} parameters, {n_modules} modules, {device})")
    if args.out:
        append_csv(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
