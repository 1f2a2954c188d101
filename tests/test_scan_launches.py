"""The vocabulary scan's Triton kernels compile once per model, not once per prompt, count or suffix length
(issue 33, item 2): the shared-prefix attention, the fused norm + score head and the fused norm + LM head +
log-prob. A scan of another prompt (another prefix length), another number of candidates and two-token
suffixes launches only variants already compiled by the first scan.

Counted as in :mod:`test_prompt_wave` (Triton's own argument binder gives each launch the cache key that picks
a compiled variant on CUDA); the kernels run in the interpreter here, so this is a CPU test of a GPU property.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton is first imported (tests/conftest.py too)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

import tiny_models as T  # noqa: E402
from rmfast.fast.engine import Engine  # noqa: E402
from rmfast.template import build_template  # noqa: E402
from test_prompt_wave import _launch_log, requires_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU (make gpu-check) the kernels compile for real
#: the vocabulary of these tests' model and tokenizer: the log-prob kernel runs interpreted over every tile of it
#: (49,152 ids: ~15 s a score call), and the property tested (no new compiled variant) does not depend on its size
V = 4096
PROMPTS = ("Hi", "What, in one word, is the greatest thing ever? Think about it first, then answer in one word.")


def _ids(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, V, (n, k), generator=g).to(DEV)  # (n, k) candidate suffixes


@requires_triton
@pytest.mark.parametrize("arch, head", [("llama", "score"), ("gemma2", "logprob")])
def test_scan_kernels_compile_once_per_model(arch, head, monkeypatch):
    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    log = _launch_log(monkeypatch)
    tok = T.chatml_tokenizer(V)
    model = T.tiny(arch, "classifier" if head == "score" else "causal_lm", vocab=V).to(DEV)
    first = Engine(model, build_template(tok, PROMPTS[0]), head=head)
    assert first.triton, "the scan should run the Triton kernels here"
    first.score(_ids(32, 1, 0))
    names = {name for name, _ in log}
    want = {"_shared_prefix_attn_kernel", "_rmsnorm_head_kernel" if head == "score" else "_lmhead_logprob_kernel"}
    assert want <= names, names
    seen = {key for _, key in log}
    log.clear()
    second = Engine(model, build_template(tok, PROMPTS[1]), head=head, layers=first.layers)
    assert second.P != first.P and second.P % 16 != first.P % 16
    for n, k in ((5, 1), (17, 2), (1, 3)):  # other counts, multi-token suffixes, a single row
        second.score(_ids(n, k, n))
    assert {name for name, _ in log} >= want
    new = {key for _, key in log} - seen
    assert not new, f"{len(new)} new compiled variant(s): {sorted(new)[:2]}"


@requires_triton
def test_compiled_layer_around_the_triton_attention(monkeypatch):
    """Item 3's plumbing: the decoder layer compiled around the Triton shared-prefix kernel (one opaque custom op,
    what a CUDA scan compiles with `--compile on`) scores as the eager Triton layer does, to fp32 summation order.
    Here inductor's CPU backend compiles the layer and the kernel runs interpreted; on a GPU `make gpu-check` times
    it against the eager layer."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    tok, head = T.chatml_tokenizer(V), "logprob"
    model = T.tiny("gemma2", "causal_lm", vocab=V).to(DEV)  # softcaps and sliding windows in the op's arguments
    tmpl = build_template(tok, PROMPTS[1])
    eager = Engine(model, tmpl, head=head)
    fused = Engine(model, tmpl, head=head, compile=True, layers=eager.layers)
    assert fused.compile and fused.attention == "triton" and eager.attention == "triton"
    ids = _ids(12, 2, 7)
    want = eager.score(ids)
    counters.clear()
    got = fused.score(ids)
    assert not counters["graph_break"], dict(counters["graph_break"])  # the kernel is one op, not a break
    assert fused.compile, "the compile fell back to eager"
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(fused.score(ids[:5]), want[:5], atol=2e-5, rtol=1e-5)  # a short batch: padded rows
