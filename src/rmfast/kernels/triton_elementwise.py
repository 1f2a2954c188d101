"""Triton kernels for the decoder layer's elementwise work: RMSNorm, the residual add with the RMSNorm after it,
RoPE, SiLU(gate)·up, each ONE launch.

On a GPU the eager layer spends a third of its device time, and most of its launches, on these (the H100's
best-of-N profile, benchmarks/results/gpu_h100_2026-11-26_b: ``mul``, ``copy``, ``pow``, ``mean``, ``cat``,
``silu`` between the GEMMs, ~45 launches a layer). Each kernel here does one of them in a single pass over
memory and rounds where the torch ops round, so it agrees with its torch twin to fp32 reduction order (the
norms) or exactly (RoPE, SiLU·up in fp32 maths with the same cast points):

- :func:`rmsnorm_triton`: :func:`rmfast.kernels.torch_twins.rmsnorm` (HF's cast points, Llama or Gemma style).
- :func:`add_rmsnorm_triton`: ``h = r + a`` (rounded as torch's add) and ``rmsnorm(h)`` in one pass: the layer's
  attention residual and the MLP's input norm (two reads and two writes instead of three and two, one launch).
- :func:`rope_triton`: :func:`rmfast.kernels.torch_twins.rope`, ``x·cos + rotate_half(x)·sin`` (partial rotary too), each
  product and the sum rounded to x's dtype as torch's three ops are; :func:`rope_qk_triton`: a layer's queries and
  keys at the same positions in one launch.
- :func:`silu_mul_triton`: ``F.silu(g) * u``, silu rounded to g's dtype before the product, as two torch ops.

The engine uses them on CUDA where its layer runs eagerly (a compiled layer gets inductor's own fusion);
:func:`rmfast.fast.ops.rmsnorm`, :func:`~rmfast.fast.ops.rope` and :func:`~rmfast.fast.ops.silu_mul` dispatch.
"""

from __future__ import annotations

import torch

from .triton_common import HAVE_TRITON, check_device, next_pow2, tl, triton  # noqa: F401

__all__ = ["HAVE_TRITON", "add_rmsnorm_triton", "rmsnorm_triton", "rope_qk_triton", "rope_triton", "silu_mul_triton"]


if HAVE_TRITON:

    @triton.jit
    def _rms_row(x, w, N, eps, GEMMA: tl.constexpr):
        """One row x (BLOCK,) in the model dtype (masked lanes 0) and its fp32 weight -> the normed row, HF's roundings."""
        xf = x.to(tl.float32)
        xn = xf * tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)
        if GEMMA:  # ((x.float() * rstd) * (1 + w.float())).to(dtype)
            y = (xn * (1.0 + w)).to(x.dtype)
        else:  # w * (x.float() * rstd).to(dtype): two dtype values, their product rounded once as torch does
            y = (w * xn.to(x.dtype).to(tl.float32)).to(x.dtype)
        return y

    # The row count varies with every batch: not specialised (no variants for 1 or multiples of 16).
    @triton.jit(do_not_specialize=["n_rows", "n_inner", "n_w"])
    def _rmsnorm_kernel(X, W, Y, n_rows, N, n_inner, stride_xo, stride_xi, n_w, stride_w, stride_y, eps,
                        GEMMA: tl.constexpr, BLOCK: tl.constexpr):
        """One row per program: row r of x at (r // n_inner) * stride_xo + (r % n_inner) * stride_xi (a (T, n, N)
        view: the heads of a fused q|k slab; n_inner = 1 for plain (rows, N)); its weight row r % n_w (per-head
        weights, (n, N): the q norm's for q heads, the k norm's for k heads; n_w = 1 for one (N,) weight); y is
        contiguous (rows, N)."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        ok = offs < N
        x = tl.load(X + (row // n_inner) * stride_xo + (row % n_inner) * stride_xi + offs, mask=ok, other=0.0)
        w = tl.load(W + (row % n_w) * stride_w + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_y + offs, _rms_row(x, w, N, eps, GEMMA), mask=ok)

    @triton.jit(do_not_specialize=["n_rows", "n_inner"])
    def _add_rmsnorm_kernel(R, A, W, H, Y, n_rows, N, n_inner, stride_ro, stride_ri, stride_a, eps,
                            GEMMA: tl.constexpr, BLOCK: tl.constexpr):
        """One row per program: h = r + a rounded to the dtype (torch's add), stored; then h's RMSNorm, as
        :func:`_rmsnorm_kernel`. r's row at (row // n_inner) * stride_ro + (row % n_inner) * stride_ri (the last
        positions of a longer residual stream); a's at row * stride_a; h and y contiguous (rows, N)."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        ok = offs < N
        r = tl.load(R + (row // n_inner) * stride_ro + (row % n_inner) * stride_ri + offs, mask=ok, other=0.0)
        a = tl.load(A + row * stride_a + offs, mask=ok, other=0.0)
        h = (r.to(tl.float32) + a.to(tl.float32)).to(r.dtype)  # (BLOCK,): the residual stream, rounded
        tl.store(H + row * N + offs, h, mask=ok)
        w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row * N + offs, _rms_row(h, w, N, eps, GEMMA), mask=ok)

    @triton.jit
    def _rope_token(X, C, S_, Y, t, S, n_heads, HALF, D, sx_t, sx_h, sc_b, sc_s, sy_t, sy_h,
                    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        """RoPE of token t = (b, s): its n heads x D values at X + t·sx_t + head·sx_h -> Y (same layout, sy_*); the
        table row of (b, s) (sc_b = 0: one table)."""
        b, s = t // S, t % S
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        Dr = 2 * HALF
        h_ok = offs_h < n_heads
        rot_ok = offs_d < Dr
        d_ok = offs_d < D
        m = h_ok[:, None] & d_ok[None, :]
        base = X + t * sx_t + offs_h[:, None] * sx_h
        x = tl.load(base + offs_d[None, :], mask=m, other=0.0)  # (BLOCK_H, BLOCK_D)
        # rotate_half over the first Dr dims: [-x2, x1] (negation exact)
        partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
        xp = tl.load(base + partner[None, :], mask=m & rot_ok[None, :], other=0.0).to(tl.float32)
        rot = tl.where((offs_d < HALF)[None, :], -xp, xp)
        c = tl.load(C + b * sc_b + s * sc_s + offs_d, mask=rot_ok, other=0.0).to(tl.float32)  # (BLOCK_D,)
        sn = tl.load(S_ + b * sc_b + s * sc_s + offs_d, mask=rot_ok, other=0.0).to(tl.float32)
        a1 = (x.to(tl.float32) * c[None, :]).to(x.dtype).to(tl.float32)  # x * cos, rounded
        a2 = (rot * sn[None, :]).to(x.dtype).to(tl.float32)  # rotate_half(x) * sin, rounded
        y = tl.where(rot_ok[None, :], (a1 + a2).to(x.dtype), x)  # the rest passes through (partial rotary)
        tl.store(Y + t * sy_t + offs_h[:, None] * sy_h + offs_d[None, :], y, mask=m)

    # Tokens, tokens per row (suffix length, prompt length) and the per-row table stride (S x Dr) vary with every
    # job: not specialised, so a scan of another prompt or suffix length compiles nothing (tests/test_scan_launches.py)
    @triton.jit(do_not_specialize=["n_tok", "S", "sc_b"])
    def _rope_kernel(X, C, S_, Y, n_tok, S, n_heads, D, HALF,
                     sx_t, sx_h, sc_b, sc_s, sy_t, sy_h,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        """One token (b, s) per program: its n heads x D values."""
        t = tl.program_id(0).to(tl.int64)
        _rope_token(X, C, S_, Y, t, S, n_heads, HALF, D, sx_t, sx_h, sc_b, sc_s, sy_t, sy_h, BLOCK_H, BLOCK_D)

    @triton.jit(do_not_specialize=["n_tok", "S", "sc_b"])
    def _rope_qk_kernel(Q, K, C, S_, YQ, YK, n_tok, S, n_q, n_k, D, HALF,
                        sq_t, sq_h, sk_t, sk_h, sc_b, sc_s, syq_t, syk_t,
                        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        """Program (t, 0): token t's query heads; (t, 1): its key heads. The queries and keys of one layer share
        their tokens and tables: one launch for both (a launch-bound small wave pays one launch, not two)."""
        t = tl.program_id(0).to(tl.int64)
        if tl.program_id(1) == 0:
            _rope_token(Q, C, S_, YQ, t, S, n_q, HALF, D, sq_t, sq_h, sc_b, sc_s, syq_t, D, BLOCK_H, BLOCK_D)
        else:
            _rope_token(K, C, S_, YK, t, S, n_k, HALF, D, sk_t, sk_h, sc_b, sc_s, syk_t, D, BLOCK_H, BLOCK_D)

    @triton.jit(do_not_specialize=["n_rows"])
    def _silu_mul_kernel(G, U, Y, n_rows, N, stride_g, stride_u, BLOCK: tl.constexpr):
        """Program (r, j): columns j*BLOCK.. of row r. g and u rows at their own strides (the two halves of a fused
        gate|up output are views with the slab's row stride), y contiguous (rows, N)."""
        r = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = i < N
        g = tl.load(G + r * stride_g + i, mask=ok, other=0.0)
        u = tl.load(U + r * stride_u + i, mask=ok, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu in fp32 maths, rounded to the dtype
        tl.store(Y + r * N + i, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x as (rows, N) with unit stride along N and one row stride, without a copy; None if it has no such view."""
    if x.stride(-1) != 1:
        return None
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return None


def _rows_in_groups(x: torch.Tensor) -> tuple[int, int, int, int] | None:
    """x's rows (unit stride along the last dim) as (n_rows, n_inner, stride_outer, stride_inner): row r at
    (r // n_inner) * stride_outer + (r % n_inner) * stride_inner, without a copy. One row stride (n_inner = 1), or
    (T, n, N) with the leading dims collapsed (the q|k heads of a fused q|k|v slab); None if neither is a view."""
    x2 = _rows(x)
    if x2 is not None:
        return x2.shape[0], 1, x2.stride(0), 0
    if x.dim() < 3 or x.stride(-1) != 1:
        return None
    try:
        x3 = x.view(-1, x.shape[-2], x.shape[-1])  # (T, n, N)
    except RuntimeError:
        return None
    return x3.shape[0] * x3.shape[1], x3.shape[1], x3.stride(0), x3.stride(1)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, *, gemma_style: bool) -> torch.Tensor | None:
    """RMSNorm over the last dim, rounded as :func:`rmfast.kernels.torch_twins.rmsnorm` (fp32=False) rounds: a new
    contiguous tensor of x's shape and dtype. x's rows may be one strided (rows, N) view or the heads of a fused
    q|k slab (:func:`_rows_in_groups`); ``weight`` (N,), or (n, N) per head of x (..., n, N). None where x or the
    weight is laid out otherwise (the caller runs the torch twin)."""
    rows = _rows_in_groups(x)
    if rows is None or rows[0] == 0:
        return None
    if weight.dim() == 1:
        n_w, s_w = 1, 0
    elif weight.dim() == 2 and x.dim() >= 2 and weight.shape[0] == x.shape[-2] and weight.stride(-1) == 1:
        n_w, s_w = weight.shape[0], weight.stride(0)
    else:
        return None
    check_device(x, _rmsnorm_kernel)
    n_rows, n_inner, s_outer, s_inner = rows
    N = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block = next_pow2(N)
    _rmsnorm_kernel[(n_rows,)](x, weight, y, n_rows, N, n_inner, s_outer, s_inner, n_w, s_w, N, float(eps),
                               GEMMA=bool(gemma_style), BLOCK=block, num_warps=min(16, max(1, block // 256)))
    return y


def add_rmsnorm_triton(r: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, eps: float, *,
                       gemma_style: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The residual add and the next RMSNorm in one pass: ``h = r + a`` (torch's rounding) and its RMSNorm (as
    :func:`rmsnorm_triton`), both new contiguous tensors of a's shape. ``r`` may be the last positions of a longer
    residual stream (a (T, n, N) view, :func:`_rows_in_groups`), ``a`` a (rows, N) view, ``weight`` (N,). None where
    the layouts, shapes or dtypes differ from that (the caller runs the twin)."""
    if r.shape != a.shape or r.dtype != a.dtype or weight.dim() != 1 or a.numel() == 0:
        return None
    rows, a2 = _rows_in_groups(r), _rows(a)
    if rows is None or a2 is None:
        return None
    check_device(r, _add_rmsnorm_kernel)
    n_rows, n_inner, s_outer, s_inner = rows
    N = a.shape[-1]
    h = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    y = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    block = next_pow2(N)
    _add_rmsnorm_kernel[(n_rows,)](r, a2, weight, h, y, n_rows, N, n_inner, s_outer, s_inner, a2.stride(0), float(eps),
                                   GEMMA=bool(gemma_style), BLOCK=block, num_warps=min(16, max(1, block // 256)))
    return h, y


def _rope_layout(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`rope_triton` reads x (B, S, n, D) and the tables as they are laid out."""
    B, S, n, D = x.shape
    Dr = cos.shape[-1]
    return not (x.stride(-1) != 1 or x.stride(0) != S * x.stride(1) or cos.stride(-1) != 1
                or cos.stride() != sin.stride() or Dr % 2 or Dr > D or B * S == 0)


def _table_strides(cos: torch.Tensor) -> tuple[int, int]:
    """(per-row stride, per-token stride) of a (S, Dr) table (one for every row: 0) or a (B, S, Dr) one."""
    return (cos.stride(0), cos.stride(1)) if cos.dim() == 3 else (0, cos.stride(0))


#: RoPE's launches compile without fusing a multiply and an add into one FMA: x·cos + rot·sin then rounds as torch's
#: two ops do, whatever the block shape. With fusion, the compiler fused them in one kernel's code and not in the
#: other's: on an H200, rope_qk_triton's fp32 keys differed from rope_triton's in the last bit (gpu-check, 2026-11-29)
NO_FMA = {"enable_fp_fusion": False}


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """``x·cos + rotate_half(x)·sin`` over the first Dr = cos.shape[-1] dims of each head (the rest as they are):
    x (B, S, n, D) with unit stride along D; cos, sin (S, Dr) or (B, S, Dr), same strides. A new contiguous
    tensor, or None where the layout is not one this kernel reads (the caller runs the torch twin)."""
    if not _rope_layout(x, cos, sin):
        return None
    B, S, n, D = x.shape
    check_device(x, _rope_kernel)
    sc_b, sc_s = _table_strides(cos)
    y = torch.empty((B, S, n, D), dtype=x.dtype, device=x.device)
    _rope_kernel[(B * S,)](x, cos, sin, y, B * S, S, n, D, cos.shape[-1] // 2, x.stride(1), x.stride(2), sc_b, sc_s,
                           n * D, D, BLOCK_H=next_pow2(n), BLOCK_D=next_pow2(D), num_warps=4, **NO_FMA)
    return y


def rope_qk_triton(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`rope_triton` of q (B, S, H, D) and k (B, S, Hkv, D) at the same positions in ONE launch: (q', k'), each
    equal to its own :func:`rope_triton` bit for bit; None where the two differ in tokens, head dim or dtype, or a
    layout is not one the kernel reads (the caller ropes them one by one)."""
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1] or q.dtype != k.dtype:
        return None
    if not (_rope_layout(q, cos, sin) and _rope_layout(k, cos, sin)):
        return None
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    check_device(q, _rope_qk_kernel)
    sc_b, sc_s = _table_strides(cos)
    yq = torch.empty((B, S, H, D), dtype=q.dtype, device=q.device)
    yk = torch.empty((B, S, Hkv, D), dtype=k.dtype, device=k.device)
    _rope_qk_kernel[(B * S, 2)](q, k, cos, sin, yq, yk, B * S, S, H, Hkv, D, cos.shape[-1] // 2,
                                q.stride(1), q.stride(2), k.stride(1), k.stride(2), sc_b, sc_s, H * D, Hkv * D,
                                BLOCK_H=next_pow2(max(H, Hkv)), BLOCK_D=next_pow2(D), num_warps=4, **NO_FMA)
    return yq, yk


def silu_mul_triton(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """``F.silu(g) * u`` (two torch ops' roundings) in one pass: a new contiguous tensor. g and u alike in shape and
    dtype, each with a (rows, N) view (contiguous, or the two halves of a fused gate|up output); None otherwise
    (the caller runs the torch twin)."""
    if g.shape != u.shape or g.dtype != u.dtype or g.numel() == 0:
        return None
    g2, u2 = _rows(g), _rows(u)
    if g2 is None or u2 is None:
        return None
    check_device(g, _silu_mul_kernel)
    n_rows, N = g2.shape
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    block = min(1024, next_pow2(N))
    _silu_mul_kernel[(n_rows, triton.cdiv(N, block))](g2, u2, y, n_rows, N, g2.stride(0), u2.stride(0), BLOCK=block,
                                                      num_warps=4)
    return y
