"""Triton fused final RMSNorm + LM head + streaming log-softmax gather.

For N hidden-state rows x (N, D) and one target token per row this returns
log_softmax(lm_head(norm(x)))[n, targets[n]] as (N,) fp32 without ever materialising the
(N, V) logits: V is ~50k-260k, so an (N, V) fp32 block would dominate memory.

Each program owns BLOCK_N rows and one contiguous slice of the vocabulary ("split").  It
streams over BLOCK_V-wide vocabulary tiles; for each tile it accumulates the logits over
D chunks in fp32 (re-normalising each x chunk on the fly, which is cheap elementwise work,
rather than writing the normalised rows out), rounds them to x.dtype as the torch twin's
x.dtype matmul does, applies the optional final softcap, and updates a running max and
sum-exp; the target logit is picked when its tile passes by.  Splitting the vocabulary
keeps the GPU busy when N is small: every split writes (max, sum-exp, target logit)
partials of shape (N, n_splits), which a tiny torch epilogue merges by log-sum-exp.

Semantics are those of :func:`rmfast.kernels.torch_twins.rmsnorm_lmhead_logprob`.  Targets
must lie in [0, V); an out-of-range target yields -inf (it is never found) instead of an
indexing error, because checking would need a device-to-host sync.
"""

from __future__ import annotations

import math

import torch

from .triton_common import HAVE_TRITON, check_device, dot_precision, next_pow2, tl, triton  # noqa: F401

if HAVE_TRITON:
    # The norm helpers are shared with the norm + score-head kernel so both round alike.
    from .triton_norm_head import normed_chunk, row_rstd

__all__ = ["HAVE_TRITON", "rmsnorm_lmhead_logprob_triton"]


if HAVE_TRITON:

    @triton.jit
    def _tanh(x):
        # tanh via exp (no libdevice in the interpreter); saturates to +-1 correctly.
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)

    # The row count and the vocabulary split vary with the job: never specialised on (one compiled variant per
    # model; tests/test_scan_launches.py).
    @triton.jit(do_not_specialize=["N", "blocks_per_split", "n_splits"])
    def _lmhead_logprob_kernel(
        X, W, LM, T, M_OUT, SE_OUT, TL_OUT,
        stride_xn, stride_xd, stride_lv, stride_ld, stride_t,
        N, D, V, eps, final_softcap, blocks_per_split, n_splits,
        GEMMA: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        FP32: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        row_ok = rows < N
        rows64 = tl.where(row_ok, rows, 0).to(tl.int64)
        tgt = tl.load(T + rows64 * stride_t, mask=row_ok, other=-1)  # (BLOCK_N,)

        rstd = row_rstd(X, rows64, row_ok, stride_xn, stride_xd, D, eps, BLOCK_N, BLOCK_D)

        m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)  # running max
        se_i = tl.zeros([BLOCK_N], tl.float32)  # running sum of exp(logit - m_i)
        t_i = tl.full([BLOCK_N], float("-inf"), tl.float32)  # target logit if in this split

        v_start = split * blocks_per_split * BLOCK_V
        v_end = tl.minimum(v_start + blocks_per_split * BLOCK_V, V)
        for v0 in range(v_start, v_end, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)  # (BLOCK_V,)
            v_ok = offs_v < V
            offs_v64 = offs_v.to(tl.int64)  # V * D can exceed 2**31 elements
            acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
            for d0 in range(0, D, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                y = normed_chunk(X, W, rows64, row_ok, rstd, offs_d, stride_xn, stride_xd, D,
                                  GEMMA, FP32)  # (BLOCK_N, BLOCK_D) in x.dtype (FP32: fp32)
                lm = tl.load(LM + offs_v64[None, :] * stride_lv + offs_d[:, None] * stride_ld,
                             mask=v_ok[None, :] & (offs_d[:, None] < D), other=0.0)  # (BLOCK_D, BLOCK_V)
                if FP32:
                    acc = tl.dot(y, lm.to(tl.float32), acc, input_precision=DOT_PRECISION)
                else:
                    acc = tl.dot(y.to(lm.dtype), lm, acc, input_precision=DOT_PRECISION)
            if FP32:
                logits = acc  # fp32 head: the logits are not rounded
            else:
                # The torch twin's matmul runs in x.dtype: round, then go back to fp32.
                logits = acc.to(LM.dtype.element_ty).to(tl.float32)  # (BLOCK_N, BLOCK_V)
            if HAS_SOFTCAP:
                logits = final_softcap * _tanh(logits / final_softcap)
            logits = tl.where(v_ok[None, :], logits, float("-inf"))
            is_t = offs_v[None, :] == tgt[:, None]  # (BLOCK_N, BLOCK_V)
            t_i = tl.maximum(t_i, tl.max(tl.where(is_t, logits, float("-inf")), 1))
            # Each tile has at least one real column (v0 < V), so m_new is finite.
            m_new = tl.maximum(m_i, tl.max(logits, 1))
            se_i = se_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), 1)
            m_i = m_new

        part = rows64 * n_splits + split  # partials are (N, n_splits) contiguous
        tl.store(M_OUT + part, m_i, mask=row_ok)
        tl.store(SE_OUT + part, se_i, mask=row_ok)
        tl.store(TL_OUT + part, t_i, mask=row_ok)


def _lmhead_blocks(x: torch.Tensor, chunk: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_V, BLOCK_D, num_warps); `chunk` only caps BLOCK_V (registers bound it)."""
    block_v = min(128, max(16, next_pow2(chunk)))
    block_d = min(64, max(16, next_pow2(x.shape[1])))
    if x.is_cuda:
        return 64, block_v, block_d, 8
    return 16, block_v, block_d, 4  # interpreter: small row tiles, tests use few rows


def _launch(x, norm_weight, eps, lm_weight, targets, *, gemma_style, final_softcap, chunk,
            num_splits: int | None = None, fp32: bool = False) -> torch.Tensor:
    check_device(x, _lmhead_logprob_kernel)
    N, D = x.shape
    V, Dl = lm_weight.shape
    if Dl != D or norm_weight.shape != (D,) or targets.shape != (N,):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, norm_weight {tuple(norm_weight.shape)}, "
                         f"lm_weight {tuple(lm_weight.shape)}, targets {tuple(targets.shape)}")
    if V == 0:
        raise ValueError("empty vocabulary")
    if N == 0:
        return torch.empty((0,), dtype=torch.float32, device=x.device)
    block_n, block_v, block_d, num_warps = _lmhead_blocks(x, chunk)
    row_blocks = triton.cdiv(N, block_n)
    v_blocks = triton.cdiv(V, block_v)
    if num_splits is None:
        # Aim for ~2 programs per SM so a handful of rows still fills the GPU; on the
        # interpreter use 2 splits so the merge path is always exercised.
        want = 2 * torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
        num_splits = max(1, math.ceil(want / row_blocks))
    num_splits = max(1, min(int(num_splits), v_blocks))
    blocks_per_split = triton.cdiv(v_blocks, num_splits)
    num_splits = triton.cdiv(v_blocks, blocks_per_split)  # drop splits that would be empty

    # max, sumexp, target: three allocations, not slices of one, so each pointer's 16-byte alignment (which
    # Triton specialises on) does not depend on N
    parts = [torch.empty((N, num_splits), dtype=torch.float32, device=x.device) for _ in range(3)]
    precision = dot_precision(x.dtype, fp32)  # fp32 heads: IEEE products, never TF32
    _lmhead_logprob_kernel[(row_blocks, num_splits)](
        x, norm_weight.contiguous(), lm_weight, targets, parts[0], parts[1], parts[2],
        x.stride(0), x.stride(1), lm_weight.stride(0), lm_weight.stride(1), targets.stride(0),
        N, D, V, float(eps), float(final_softcap) if final_softcap is not None else 1.0,
        blocks_per_split, num_splits,
        GEMMA=bool(gemma_style),
        HAS_SOFTCAP=final_softcap is not None,
        FP32=bool(fp32),
        DOT_PRECISION=precision,
        BLOCK_N=block_n, BLOCK_V=block_v, BLOCK_D=block_d,
        num_warps=num_warps,
    )
    m, se, t = parts  # each (N, n_splits)
    lse = torch.logsumexp(m + torch.log(se), dim=1)  # (N,) merge the splits' partial sums
    return t.amax(dim=1) - lse  # (N,) fp32


def rmsnorm_lmhead_logprob_triton(x, norm_weight, eps: float, lm_weight, targets, *,
                                  gemma_style: bool, final_softcap: float | None = None,
                                  chunk: int = 8192, fp32: bool = False) -> torch.Tensor:
    """Triton twin of :func:`rmfast.kernels.torch_twins.rmsnorm_lmhead_logprob`.

    fp32: normed rows kept fp32, weight tiles upcast, logits not rounded, IEEE fp32 products
    (:func:`~rmfast.kernels.triton_common.dot_precision`: TF32 rounded the normed rows to 10
    mantissa bits, 3e-3 off on an H100).

    x: (N, D); norm_weight: (D,); lm_weight: (V, D) in x.dtype; targets: (N,) int64.
    Returns (N,) fp32 log-probabilities.  `chunk` only caps the vocabulary tile width:
    the kernel always streams, whatever its value.
    """
    if not HAVE_TRITON:
        raise RuntimeError("rmsnorm_lmhead_logprob_triton needs triton, which is not installed")
    return _launch(x, norm_weight, eps, lm_weight, targets, gemma_style=gemma_style,
                   final_softcap=final_softcap, chunk=chunk, fp32=fp32)
