"""Final norm + LM head + log-softmax gather on CPU, in blocks of rows.

The CPU twin of :func:`rmfast.kernels.reference.rmsnorm_lmhead_logprob`. The reference streams
over *vocabulary* chunks with a running max and sum (the form the Triton kernel takes); on CPU
each chunk update is five full passes over an (N, chunk) fp32 block in memory. Here the loop
runs over blocks of *rows* instead: one row block's whole (n, V) logits is small enough to stay
in cache (n·V ≈ 12.6 M fp32 at most, ~50 MB), so ``logsumexp`` and the target gather read it
right after the GEMM wrote it, and under ``torch.compile`` the softcap, max, exp-sum and gather
fuse into one loop. Nothing of shape (N, V) is ever held.

Measured (SmolLM2, 4,096 rows × 49,152 vocabulary, bf16, 2-core CPU): vocabulary-streaming
reference 1.27 s, row blocks eager 0.83 s, row blocks compiled 0.36 s (the GEMM alone 0.25 s).

Example:
    >>> import torch
    >>> x = torch.randn(5, 8); W = torch.randn(100, 8); t = torch.tensor([1, 2, 3, 4, 5])
    >>> lp = rmsnorm_lmhead_logprob_rows(x, torch.ones(8), 1e-6, W, t, gemma_style=False)
    >>> from rmfast.kernels.reference import rmsnorm_lmhead_logprob
    >>> bool(torch.allclose(lp, rmsnorm_lmhead_logprob(x, torch.ones(8), 1e-6, W, t, gemma_style=False), atol=1e-5))
    True
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .reference import rmsnorm

#: logits elements per row block (n·V): ~50 MB of fp32, the blocks stay cache-sized.
BLOCK_ELEMENTS = 1 << 24


def block_rows(vocab: int) -> int:
    """Rows per block for a vocabulary size: a power of two in [8, 1024] with rows·V <= BLOCK_ELEMENTS."""
    n = 8
    while n * 2 * vocab <= BLOCK_ELEMENTS and n < 1024:
        n *= 2
    return n


def lm_logprob_block(y: torch.Tensor, lm_weight: torch.Tensor, targets: torch.Tensor, final_softcap: float | None) -> torch.Tensor:
    """log softmax(y @ lm_weight.T)[i, targets[i]] for one row block: y (n, D) normalised -> (n,) fp32.

    The logits are rounded to y.dtype by the GEMM (as HF's lm_head output is), then fp32.
    """
    logits = F.linear(y, lm_weight).float()  # (n, V)
    if final_softcap is not None:
        logits = torch.tanh(logits / final_softcap) * final_softcap
    return logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def rmsnorm_lmhead_logprob_rows(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    lm_weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    gemma_style: bool,
    final_softcap: float | None = None,
    block_fn: Callable | None = None,
) -> torch.Tensor:
    """(N, D) final hidden states -> (N,) fp32 log-probabilities of ``targets``, block by block.

    ``block_fn`` replaces :func:`lm_logprob_block` (the engine passes a compiled copy); every block
    has :func:`block_rows` rows, the last one padded, so a compiled block never sees a new shape.
    """
    y = rmsnorm(x, norm_weight, eps, gemma_style=gemma_style)  # (N, D)
    fn = block_fn or lm_logprob_block
    N = y.shape[0]
    n = block_rows(lm_weight.shape[0]) if block_fn is not None else min(N, block_rows(lm_weight.shape[0]))
    out = []
    for i in range(0, N, n):
        yb, tb = y[i : i + n], targets[i : i + n]
        k = yb.shape[0]
        if k < n and block_fn is not None:  # pad the tail block to the compiled shape
            yb = torch.cat([yb, yb[:1].expand(n - k, -1)])
            tb = torch.cat([tb, tb[:1].expand(n - k)])
        out.append(fn(yb, lm_weight, tb, final_softcap)[:k])
    return torch.cat(out) if out else y.new_zeros(0, dtype=torch.float32)
