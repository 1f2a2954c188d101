#!/usr/bin/env python
"""Time ``responses_ids`` (a best-of-N call's tokenizing) for one prompt of about P tokens and N responses
of 20-200 tokens, on the embedded SmolLM2 tokenizer (ChatML) and, where this checkout has it, the
whole-conversation path it falls back to (``_responses_ids_whole``), in the same process.

    python benchmarks/tail_tokenize.py [--prompt-tokens 2048] [--n 64] [--repeats 20]

Prints the median and best of ``repeats`` calls per path, the first call (which builds and verifies the
cut) separately, and whether both paths agree on every response.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import random
import statistics
import sys
import time
from pathlib import Path

if importlib.util.find_spec("rmfast") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rmfast import template as T
from rmfast.bench.best_of_n import text_of


def smollm2_tokenizer():
    """The embedded SmolLM2 tokenizer alone (its converted folder; no model weights loaded)."""
    from transformers import AutoTokenizer

    from rmfast.loading.loader import _converted
    from rmfast.loading.sources import cache_root, embedded

    cache = cache_root()
    folder, _ = _converted(embedded("smollm2-135m-instruct").gguf_path(cache), cache, check_header=False)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    tok = smollm2_tokenizer()
    prompt = text_of(tok, args.prompt_tokens, rng)
    responses = [text_of(tok, rng.randint(20, 200), rng) for _ in range(args.n)]
    tmpl = T.build_template(tok, prompt)
    print(f"{platform.processor() or platform.machine()}; prompt {len(tmpl.prefix_ids)} prefix ids, {args.n} responses")
    paths = {"responses_ids": T.responses_ids}
    if hasattr(T, "_responses_ids_whole"):
        paths["_responses_ids_whole"] = T._responses_ids_whole
    results = {}
    for name, fn in paths.items():
        t0 = time.perf_counter()
        results[name] = fn(tok, tmpl, responses)  # the first call (the fast path builds its cut here)
        first = time.perf_counter() - t0
        ts = timed(lambda: fn(tok, tmpl, responses), args.repeats)
        print(f"{name:22s} first {first * 1e3:7.1f} ms   median {statistics.median(ts) * 1e3:7.1f} ms   "
              f"best {min(ts) * 1e3:7.1f} ms")
    if len(results) == 2:
        a, b = results.values()
        print("identical ids:", a == b)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
