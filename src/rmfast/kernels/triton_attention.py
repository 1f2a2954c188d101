"""Triton shared-prefix attention: every candidate row reads ONE shared copy of the prompt's K/V.

Workload: a prompt of P tokens is run once; then B candidate rows (B is large: a batch of
vocabulary tokens) each append S suffix tokens (S is small) and need attention over
prefix ⊕ own suffix.  Materialising the prefix per row would cost B x P x D memory and
bandwidth, so the kernel reads the prefix from a single (Hkv, P, D) tensor.

Layout of the work (why it is not one program per (row, head)):
  a program owns one KV head and a block of BLOCK_M "query rows", where a query row is a
  (batch row b, query head g of this KV head's group, query i) triple, flattened as
  r = (b * G + g) * Sq + i.  All query rows of a program share the same prefix K/V, so the
  prefix phase is a real (BLOCK_M x BLOCK_N) tiled matmul that reads each prefix tile once
  per BLOCK_M query rows instead of once per row and head.  The suffix phase differs per
  row b, so it gathers each row's suffix key/value one suffix position at a time (S is
  small) and does a row-wise dot product.
One online softmax (running max m, running sum l, fp32 accumulator) spans both phases, so
the result equals softmax over the concatenated key set.

Semantics are those of :func:`rmfast.kernels.reference.shared_prefix_attention`.
"""

from __future__ import annotations

import torch

try:  # the module must import without triton (CPU-only installs use the torch twins)
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only on installs without triton
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "shared_prefix_attention_triton"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _check_device(t: torch.Tensor, kernel) -> None:
    """CPU tensors only work when the kernel was built by the interpreter.

    triton.jit picks compiled vs interpreted when the module is imported, so
    TRITON_INTERPRET=1 must already be set then; say so instead of failing obscurely.
    """
    if not t.is_cuda and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("Triton kernels need CUDA tensors; CPU tensors work only when "
                           "TRITON_INTERPRET=1 is set before rmfast.kernels.triton_* is imported")


if HAVE_TRITON:

    @triton.jit
    def _tanh(x):
        # tanh via exp: libdevice is not available in the interpreter.  Saturates correctly:
        # exp(2x) -> inf gives 1, exp(2x) -> 0 gives -1.
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)

    @triton.jit
    def _scores(s, scale, softcap, DT: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
        """Raw fp32 q.k products -> scaled (softcapped) fp32 scores.

        The reference (like HF eager attention) forms scores in q.dtype: the product is
        rounded to q.dtype, and so is each of `* scale`, `/ softcap`, `tanh`, `* softcap`.
        Rounding at the same points keeps bf16 scores equal to the reference's instead of
        off by up to |s| * 2**-9, which would move the softmax by far more than the
        accumulation-order noise.  For fp32 inputs every cast is a no-op.
        """
        s = s.to(DT).to(tl.float32)
        s = (s * scale).to(DT).to(tl.float32)
        if HAS_SOFTCAP:
            t = (s / softcap).to(DT).to(tl.float32)
            t = _tanh(t).to(DT).to(tl.float32)
            s = (t * softcap).to(DT).to(tl.float32)
        return s

    @triton.jit
    def _shared_prefix_attn_kernel(
        Q, KP, VP, KS, VS, O,
        stride_qb, stride_qh, stride_qs, stride_qd,
        stride_kph, stride_kpn, stride_kpd,
        stride_vph, stride_vpn, stride_vpd,
        stride_ksb, stride_ksh, stride_kss, stride_ksd,
        stride_vsb, stride_vsh, stride_vss, stride_vsd,
        stride_ob, stride_os, stride_oh, stride_od,
        n_rows,  # B * G * Sq query rows per KV head
        P, S, Sq, D,
        scale, softcap, window,
        G: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        kvh = tl.program_id(1)

        # ---- which (b, head, query) each of the BLOCK_M query rows is -------------------
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        row_ok = rows < n_rows
        rows_c = tl.where(row_ok, rows, 0)  # keep padded rows' addresses in bounds
        b = (rows_c // (G * Sq)).to(tl.int64)  # int64: B * stride can exceed 2**31
        rem = rows_c % (G * Sq)
        h = kvh * G + rem // Sq  # query head
        qi = rem % Sq  # query index within the last Sq suffix positions
        q_pos = P + S - Sq + qi  # absolute position of each query, (BLOCK_M,)

        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D  # head dims that are not a power of two are padded and masked

        q_ptrs = Q + b[:, None] * stride_qb + h[:, None] * stride_qh + qi[:, None] * stride_qs \
            + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)

        # Online-softmax state.  m starts at a large finite negative (not -inf) so that a
        # block in which a row sees no key gives exp(-inf - m) = 0 instead of NaN.
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        # ---- phase 1: shared prefix, keys 0..P-1 (always causally visible) -------------
        kvh64 = kvh.to(tl.int64)
        kp_base = KP + kvh64 * stride_kph
        vp_base = VP + kvh64 * stride_vph
        lo = 0
        if HAS_WINDOW:
            # Skip prefix tiles that are outside the window of every query of this program
            # (the earliest query position is P + S - Sq).
            lo = tl.maximum(P + S - Sq - window + 1, 0)
            lo = (lo // BLOCK_N) * BLOCK_N
        offs_n = tl.arange(0, BLOCK_N)
        for start_n in range(lo, P, BLOCK_N):
            kpos = start_n + offs_n  # (BLOCK_N,) absolute key positions
            k_ok = kpos < P
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(kp_base + kpos[:, None] * stride_kpn + offs_d[None, :] * stride_kpd,
                        mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
            v = tl.load(vp_base + kpos[:, None] * stride_vpn + offs_d[None, :] * stride_vpd,
                        mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) fp32
            s = _scores(s, scale, softcap, q.dtype, HAS_SOFTCAP)
            visible = k_ok[None, :] & row_ok[:, None]
            if HAS_WINDOW:
                visible = visible & (kpos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N); masked -> 0
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        # ---- phase 2: each row's own suffix, keys P..P+S-1 (causal + window) -----------
        # Different query rows belong to different batch rows, so keys are gathered per row,
        # one suffix position at a time; S is small in this workload.
        ks_base = KS + b * stride_ksb + kvh64 * stride_ksh  # (BLOCK_M,) pointers
        vs_base = VS + b * stride_vsb + kvh64 * stride_vsh
        qf = q.to(tl.float32)
        ld_mask = row_ok[:, None] & d_ok[None, :]
        for n in range(0, S):
            kpos_s = P + n
            k = tl.load(ks_base[:, None] + n * stride_kss + offs_d[None, :] * stride_ksd,
                        mask=ld_mask, other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_D)
            s = _scores(tl.sum(qf * k, 1), scale, softcap, q.dtype, HAS_SOFTCAP)  # (BLOCK_M,)
            visible = row_ok & (kpos_s <= q_pos)
            if HAS_WINDOW:
                visible = visible & (kpos_s > q_pos - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, s)
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)  # (BLOCK_M,)
            v = tl.load(vs_base[:, None] + n * stride_vss + offs_d[None, :] * stride_vsd,
                        mask=ld_mask, other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_D)
            l_i = l_i * alpha + p
            acc = acc * alpha[:, None] + p[:, None] * v
            m_i = m_new

        # Every real query sees at least itself, so l_i > 0 for real rows; the guard only
        # keeps padded rows finite.
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]  # (BLOCK_M, BLOCK_D)
        o_ptrs = O + b[:, None] * stride_ob + qi[:, None] * stride_os + h[:, None] * stride_oh \
            + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _attn_blocks(block_d: int, on_cuda: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps).  All >= 16 because tl.dot needs it on GPU.

    Larger head dims get smaller tiles to keep the fp32 accumulator in registers.  The
    interpreter has a large per-op overhead, so bigger tiles (fewer programs) run faster.
    """
    if not on_cuda:
        return 32, 32, 4
    if block_d <= 64:
        return 64, 64, 4
    if block_d <= 128:
        return 64, 32, 4
    return 32, 32, 8


def shared_prefix_attention_triton(q, k_prefix, v_prefix, k_suffix, v_suffix, *, scale: float,
                                   softcap: float | None = None,
                                   window: int | None = None) -> torch.Tensor:
    """Triton twin of :func:`rmfast.kernels.reference.shared_prefix_attention`.

    q: (B, H, Sq, D); k_prefix, v_prefix: (Hkv, P, D) one shared copy; k_suffix, v_suffix:
    (B, Hkv, S, D).  Returns (B, Sq, H, D) in q.dtype.  Works on CUDA tensors, and on CPU
    tensors when TRITON_INTERPRET=1 was set before triton was imported.
    """
    if not HAVE_TRITON:
        raise RuntimeError("shared_prefix_attention_triton needs triton, which is not installed")
    B, H, Sq, D = q.shape
    Hkv, P, Dk = k_prefix.shape
    Bs, Hkv_s, S, Ds = k_suffix.shape
    if not (Dk == D == Ds and Bs == B and Hkv_s == Hkv):
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k_prefix {tuple(k_prefix.shape)}, "
                         f"k_suffix {tuple(k_suffix.shape)}")
    if v_prefix.shape != k_prefix.shape or v_suffix.shape != k_suffix.shape:
        raise ValueError("value tensors must have the shapes of the key tensors")
    if H % Hkv != 0:
        raise ValueError(f"H={H} is not a multiple of Hkv={Hkv}")
    if not 1 <= Sq <= S:
        raise ValueError(f"need 1 <= Sq <= S, got Sq={Sq}, S={S}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    G = H // Hkv

    out = torch.empty((B, Sq, H, D), dtype=q.dtype, device=q.device)  # (B, Sq, H, D)
    if B == 0:
        return out
    block_d = max(16, _next_pow2(D))
    block_m, block_n, num_warps = _attn_blocks(block_d, q.is_cuda)
    n_rows = B * G * Sq
    # fp32 inputs: "ieee" so the GPU does not silently use TF32 (10-bit mantissa) tensor cores.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if P == 0:
        # Empty prefix: the prefix loop never runs, but an empty tensor may carry a null data
        # pointer that the launcher rejects, so pass the suffix tensors in its place.
        k_prefix, v_prefix = k_suffix[0], v_suffix[0]  # (Hkv, S, D), never read
    grid = (triton.cdiv(n_rows, block_m), Hkv)
    _shared_prefix_attn_kernel[grid](
        q, k_prefix, v_prefix, k_suffix, v_suffix, out,
        *q.stride(), *k_prefix.stride(), *v_prefix.stride(),
        *k_suffix.stride(), *v_suffix.stride(),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        n_rows, P, S, Sq, D,
        float(scale), float(softcap) if softcap is not None else 1.0,
        int(window) if window is not None else 0,
        G=G,
        HAS_SOFTCAP=softcap is not None,
        HAS_WINDOW=window is not None,
        DOT_PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return out
