"""The reproducibility guarantee (README: "What is bit-identical, what agrees to rounding").

Bit-identical: same device, dtype, batch shapes and thread count -- in this process and in
another one. To rounding only: other batch sizes or thread counts, within 2E of each other, E the
fp32 run's own error against a float64 evaluation of the same rows (tests/rounding.py).
"""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import rounding as R
import tiny_models as T
from rmfast.scoring.pipeline import scan

PROMPT = "What, in one word, is the greatest thing ever?"
IDS = np.arange(0, T.VOCAB, 97)[:300]  # 300 ids across the vocabulary
MODELS = {"llama-score": ("llama", "classifier"), "gemma2-logprob": ("gemma2", "causal_lm"),
          "qwen3-score": ("qwen3", "classifier")}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, smol_tokenizer):
    arch, kind = MODELS[request.param]
    return request.param, T.tiny(arch, kind, num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)


@pytest.fixture
def threads():
    """Set torch's thread count for one test, then put it back."""
    n = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(n)


def _scores(m, tok, bs, ids=IDS):
    return scan(m, tok, PROMPT, token_ids=ids, batch_size=bs, progress=False, compile="off").scores


def test_same_batches_and_threads_are_bit_identical(model, smol_tokenizer, tmp_path):
    name, m = model
    a = _scores(m, smol_tokenizer, 64)
    np.testing.assert_array_equal(_scores(m, smol_tokenizer, 64), a)  # a rerun in this process
    # another process, told this process's thread count: the same bits
    m.save_pretrained(tmp_path / name)
    smol_tokenizer.save_pretrained(tmp_path / name)
    code = ("import sys, numpy as np, torch; torch.set_num_threads(int(sys.argv[2]))\n"
            "from rmfast.loading.loader import load; from rmfast.scoring.pipeline import scan\n"
            "lm = load(sys.argv[1], dtype='float32', device='cpu')\n"
            "ids = np.arange(0, 49152, 97)[:300]\n"
            f"s = scan(lm.model, lm.tokenizer, {PROMPT!r}, token_ids=ids, batch_size=64, progress=False, compile='off')\n"
            "np.save(sys.argv[3], s.scores)\n")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_NUM_THREADS", None)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / name), str(torch.get_num_threads()),
                        str(tmp_path / "b.npy")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), a)


def test_other_batches_and_threads_agree_to_rounding(model, smol_tokenizer, threads):
    name, m = model
    ref = _scores(copy.deepcopy(m).double(), smol_tokenizer, "auto")
    runs = {}
    for n in (1, 2):
        threads(n)
        for bs in (7, 64, "auto"):
            runs[(n, bs)] = _scores(m, smol_tokenizer, bs)
    base = runs[(2, "auto")]
    for s in runs.values():
        R.assert_agree_to_rounding(base, s, ref)
    print(f"{name}: {sum((s != base).any() for s in runs.values())} of {len(runs)} runs differ in some bit from "
          f"(2 threads, auto); largest difference {max(np.abs(s.astype(float) - base).max() for s in runs.values()):.3g}, "
          f"2E = {2 * R.fp32_error(base, ref):.3g} (E = {R.fp32_error(base, ref) / (R.U32 * np.abs(ref).max()):.0f}u of the "
          f"largest |score| {np.abs(ref).max():.3g})")


@pytest.mark.slow
def test_smollm2_logprob_batches_and_threads_agree_to_rounding(smollm2, threads):
    """The real model (30 layers, log-probabilities over 49,152 tokens: values near -50), where the
    reordering errors are as large as the error itself."""
    m, tok = smollm2.model, smollm2.tokenizer
    ids = np.arange(0, 49152, 491)[:100]
    ref = scan(copy.deepcopy(m).double(), tok, PROMPT, token_ids=ids, progress=False, compile="off").scores
    base = _scores(m, tok, "auto", ids)
    threads(1)
    for bs in (7, 50):
        print("smollm2-logprob", bs, R.assert_agree_to_rounding(base, _scores(m, tok, bs, ids), ref),
              f"E = {R.fp32_error(base, ref) / (R.U32 * np.abs(ref).max()):.0f}u, scores {ref.min():.3g}..{ref.max():.3g}")
