"""Triton fused final RMSNorm + small linear head (the reward model's score head).

For N hidden-state rows x (N, D) this computes, without writing the normalised rows to
memory:
    Llama style: y = w * (x.float() * rstd).to(x.dtype)
    Gemma style: y = ((x.float() * rstd) * (1 + w.float())).to(x.dtype)
    out = (y @ head_weight.T + head_bias).float()          # (N, K) fp32
or, with fp32=True (the engine's default), y and the head in fp32 without those casts.
The rounding points (cast of the normalised row to x.dtype, head output rounded to x.dtype,
bias added in x.dtype) copy :func:`rmfast.kernels.torch_twins.rmsnorm_head`, which copies
the HF modules, so that bf16 scores match the model's own to within accumulation order.

Each program owns BLOCK_N rows and BLOCK_K head outputs.  Pass 1 streams over D to get
each row's sum of squares; pass 2 streams over D again, normalises each chunk on the fly
and accumulates the chunk's contribution to the head in fp32.
"""

from __future__ import annotations

import torch

from .triton_common import HAVE_TRITON, check_device, dot_precision, next_pow2, tl, triton  # noqa: F401

__all__ = ["HAVE_TRITON", "rmsnorm_head_triton"]


if HAVE_TRITON:

    @triton.jit
    def row_rstd(X, rows64, row_ok, stride_xn, stride_xd, D, eps,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """rsqrt(mean(x.float()**2) + eps) for BLOCK_N rows: (BLOCK_N,) fp32."""
        sq = tl.zeros([BLOCK_N], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            x = tl.load(X + rows64[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                        mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
            xf = x.to(tl.float32)  # (BLOCK_N, BLOCK_D)
            sq += tl.sum(xf * xf, 1)
        return tl.rsqrt(sq / D + eps)

    @triton.jit
    def normed_chunk(X, W, rows64, row_ok, rstd, offs_d, stride_xn, stride_xd, D,
                      GEMMA: tl.constexpr, FP32: tl.constexpr = False):
        """Normalised rows for one D chunk, rounded to x.dtype exactly where HF rounds (FP32: kept fp32)."""
        d_ok = offs_d < D
        x = tl.load(X + rows64[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        w = tl.load(W + offs_d, mask=d_ok, other=0.0).to(tl.float32)  # (BLOCK_D,)
        xn = x.to(tl.float32) * rstd[:, None]
        if FP32:
            if GEMMA:
                y = xn * (1.0 + w[None, :])
            else:
                y = w[None, :] * xn
        elif GEMMA:
            # ((x.float() * rstd) * (1 + w.float())).to(x.dtype)
            y = (xn * (1.0 + w[None, :])).to(x.dtype)
        else:
            # w * (x.float() * rstd).to(x.dtype): the product of two x.dtype values is exact
            # in fp32 and then rounded once, as torch does it.
            y = (w[None, :] * xn.to(x.dtype).to(tl.float32)).to(x.dtype)
        return y

    # N (the batch's rows) varies with every job: not specialised (Triton would compile variants for N == 1
    # and N % 16 == 0; tests/test_prompt_wave.py counts compiled variants)
    @triton.jit(do_not_specialize=["N"])
    def _rmsnorm_head_kernel(
        X, W, HW, HB, OUT,
        stride_xn, stride_xd, stride_hk, stride_hd, stride_on, stride_ok,
        N, D, K, eps,
        GEMMA: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        FP32: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        row_ok = rows < N
        rows64 = tl.where(row_ok, rows, 0).to(tl.int64)
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        k_ok = offs_k < K

        rstd = row_rstd(X, rows64, row_ok, stride_xn, stride_xd, D, eps, BLOCK_N, BLOCK_D)

        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            y = normed_chunk(X, W, rows64, row_ok, rstd, offs_d, stride_xn, stride_xd, D,
                              GEMMA, FP32)  # (BLOCK_N, BLOCK_D) in x.dtype (FP32: fp32)
            hw = tl.load(HW + offs_k[None, :] * stride_hk + offs_d[:, None] * stride_hd,
                         mask=k_ok[None, :] & (offs_d[:, None] < D), other=0.0)  # (BLOCK_D, BLOCK_K)
            if FP32:
                acc = tl.dot(y, hw.to(tl.float32), acc, input_precision=DOT_PRECISION)
            else:
                acc = tl.dot(y.to(hw.dtype), hw, acc, input_precision=DOT_PRECISION)

        if FP32:  # fp32 head: no rounding of the products' sum or of the bias add
            out = acc
            if HAS_BIAS:
                out = out + tl.load(HB + offs_k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        else:
            # Round where torch's x.dtype matmul and bias add round (no-ops for fp32).
            out = acc.to(HW.dtype.element_ty)
            if HAS_BIAS:
                bias = tl.load(HB + offs_k, mask=k_ok, other=0.0)  # (BLOCK_K,)
                out = (out.to(tl.float32) + bias.to(tl.float32)[None, :]).to(HW.dtype.element_ty)
        tl.store(OUT + rows64[:, None] * stride_on + offs_k[None, :] * stride_ok,
                 out.to(tl.float32), mask=row_ok[:, None] & k_ok[None, :])


def rmsnorm_head_triton(x, norm_weight, eps: float, head_weight, head_bias=None, *,
                        gemma_style: bool, fp32: bool = False) -> torch.Tensor:
    """Triton twin of :func:`rmfast.kernels.torch_twins.rmsnorm_head` (``fp32``: fp32 norm and head, IEEE
    products: the head has few outputs, so full precision costs nothing).

    x: (N, D) in the model dtype; norm_weight: (D,); head_weight: (K, D) in x.dtype;
    head_bias: (K,) or None.  Returns (N, K) fp32.
    """
    if not HAVE_TRITON:
        raise RuntimeError("rmsnorm_head_triton needs triton, which is not installed")
    check_device(x, _rmsnorm_head_kernel)
    N, D = x.shape
    K, Dh = head_weight.shape
    if Dh != D or norm_weight.shape != (D,):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, norm_weight {tuple(norm_weight.shape)}, "
                         f"head_weight {tuple(head_weight.shape)}")
    if head_bias is not None and head_bias.shape != (K,):
        raise ValueError(f"head_bias must be ({K},), got {tuple(head_bias.shape)}")
    out = torch.empty((N, K), dtype=torch.float32, device=x.device)  # (N, K)
    if N == 0 or K == 0:
        return out
    norm_weight = norm_weight.contiguous()
    block_k = min(64, max(16, next_pow2(K)))  # tl.dot needs >= 16; reward heads have K ~ 1
    block_d = min(128, max(16, next_pow2(D)))
    block_n = 64 if x.is_cuda else 32
    precision = dot_precision(x.dtype, fp32)
    grid = (triton.cdiv(N, block_n), triton.cdiv(K, block_k))
    _rmsnorm_head_kernel[grid](
        x, norm_weight, head_weight, head_bias if head_bias is not None else head_weight, out,
        x.stride(0), x.stride(1), head_weight.stride(0), head_weight.stride(1),
        out.stride(0), out.stride(1),
        N, D, K, float(eps),
        GEMMA=bool(gemma_style),
        HAS_BIAS=head_bias is not None,
        FP32=bool(fp32),
        DOT_PRECISION=precision,
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d,
        num_warps=4,
    )
    return out
