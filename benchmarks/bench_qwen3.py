#!/usr/bin/env python
"""Qwen3 at a real width with random weights: ``rmfast bench --random-init qwen3-0.6b`` before the
model registry commits a Qwen3 config to :mod:`rmfast.bench.random_init`.

    python benchmarks/bench_qwen3.py --layers 2 --n-candidates 1024 [any other rmfast bench option]

Qwen3-0.6B's published architecture (``Qwen/Qwen3-0.6B`` config.json, the backbone of
Skywork-Reward-V2-Qwen3-0.6B): hidden 1,024, 28 layers, 16 query / 8 kv heads of 128 (so the
attention width, 2,048, is twice the hidden size), q/k RMSNorms, MLP 3,072, vocabulary 151,936,
RoPE theta 1e6, tied embeddings, no sliding window. The generated tokenizer carries Qwen's ChatML
end of turn, so a row is ``... {response}<|im_end|>\\n`` (two suffix tokens), as with the real template.
This file only registers the config for this process; once the registry has a Qwen3 entry, use
``rmfast bench --random-init`` with it and delete this script.
"""

import sys
from pathlib import Path

try:
    from rmfast.bench import random_init
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from rmfast.bench import random_init
from rmfast.cli.bench import main

QWEN3_0_6B = dict(model_type="qwen3", hidden_act="silu", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, use_sliding_window=False,
                  tie_word_embeddings=True, vocab_size=151936)
QWEN_FAMILY = {"bos": "<|endoftext|>", "eos": "<|im_end|>", "pad": "<|endoftext|>", "extra": ("<|im_start|>",),
               "template": "User: {prompt}\nAssistant: {response}<|im_end|>\n"}

if __name__ == "__main__":
    random_init.CONFIGS.setdefault("qwen3-0.6b", QWEN3_0_6B)
    random_init.FAMILIES.setdefault("qwen3", QWEN_FAMILY)
    sys.exit(main(["--random-init", "qwen3-0.6b", *sys.argv[1:]]))
