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

Semantics are those of :func:`rmfast.kernels.torch_twins.shared_prefix_attention`.
"""

from __future__ import annotations

import torch

from .attention_config import AttnConfig, launch_config
from .triton_common import HAVE_TRITON, check_device, dot_precision, tl, triton  # noqa: F401

__all__ = ["HAVE_TRITON", "shared_prefix_attention_triton"]


if HAVE_TRITON:

    @triton.jit
    def _tanh(x):
        # tanh via exp: libdevice is not available in the interpreter.  Saturates correctly:
        # exp(2x) -> inf gives 1, exp(2x) -> 0 gives -1.
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)

    @triton.jit
    def _scores(s, scale, softcap, DT: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
        """Raw fp32 q.k products -> scaled (softcapped) fp32 scores.

        The torch twin (like HF eager attention) forms scores in q.dtype: the product is
        rounded to q.dtype, and so is each of `* scale`, `/ softcap`, `tanh`, `* softcap`.
        Rounding at the same points keeps bf16 scores equal to the torch twin's instead of
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

    # Counts and lengths vary with the job (prompt, candidates, suffix length): never specialised on, so one
    # compiled variant serves every scan of a model (tests/test_scan_launches.py).
    @triton.jit(do_not_specialize=["n_rows", "P", "S", "Sq", "prefix_lo"])
    def _shared_prefix_attn_kernel(
        Q, KP, VP, KS, VS, O,
        stride_qb, stride_qh, stride_qs, stride_qd,
        stride_ph, stride_pn, stride_pd,  # k_prefix and v_prefix share strides
        stride_sb, stride_sh, stride_ss, stride_sd,  # k_suffix and v_suffix share strides
        stride_ob, stride_os, stride_oh, stride_od,
        n_rows,  # B * G * Sq query rows per KV head
        P, S, Sq, D, prefix_lo,
        scale, softcap, window,
        G: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
        EVEN_D: tl.constexpr,  # D == BLOCK_D: no head-dim masks
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
        # Padded rows become copies of the last real row: every address stays in bounds, so
        # loads need no row mask; only the final store is masked.
        rows_c = tl.minimum(rows, n_rows - 1)
        b = rows_c // (G * Sq)  # batch row, (BLOCK_M,)
        rem = rows_c % (G * Sq)
        h = kvh * G + rem // Sq  # query head
        qi = rem % Sq  # query index within the last Sq suffix positions
        q_pos = P + S - Sq + qi  # absolute position of each query, (BLOCK_M,)
        # Addresses are a 64-bit per-program base plus small int32 offsets from the tile's
        # first batch row b0: 2D int64 pointer tensors kept live across the loops would
        # cost two registers per element and make the kernel spill.
        b0 = (pid_m * BLOCK_M) // (G * Sq)
        b_rel = b - b0  # (BLOCK_M,) in [0, BLOCK_M)

        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D  # head dims that are not a power of two are padded and masked

        q_off = b_rel[:, None] * stride_qb + h[:, None] * stride_qh + qi[:, None] * stride_qs \
            + offs_d[None, :] * stride_qd  # (BLOCK_M, BLOCK_D) int32
        q_base = Q + b0.to(tl.int64) * stride_qb
        if EVEN_D:
            q = tl.load(q_base + q_off)  # (BLOCK_M, BLOCK_D)
        else:
            q = tl.load(q_base + q_off, mask=d_ok[None, :], other=0.0)

        # Online-softmax state.  m starts at a large finite negative (not -inf) so that a
        # tile in which a row sees no key gives exp(-inf - m) = 0 instead of NaN.
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        # ---- phase 1: shared prefix, keys 0..P-1 (always causally visible) -------------
        # Every query row of the program reads the same (BLOCK_N, D) prefix tile: one
        # (BLOCK_M x BLOCK_N) matmul per tile against the single shared copy.
        p_base = kvh.to(tl.int64) * stride_ph
        offs_n = tl.arange(0, BLOCK_N)
        # prefix_lo (a multiple of BLOCK_N, from the launcher) skips the prefix tiles that lie
        # outside the sliding window of every query.
        for start_n in range(prefix_lo, P, BLOCK_N):
            kpos = start_n + offs_n  # (BLOCK_N,) absolute key positions
            k_ok = kpos < P
            kv_off = kpos[:, None] * stride_pn + offs_d[None, :] * stride_pd  # (BLOCK_N, BLOCK_D)
            if EVEN_D:
                kv_mask = k_ok[:, None]
            else:
                kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(KP + p_base + kv_off, mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
            v = tl.load(VP + p_base + kv_off, mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) fp32
            s = _scores(s, scale, softcap, q.dtype, HAS_SOFTCAP)
            if HAS_WINDOW:
                visible = k_ok[None, :] & (kpos[None, :] > q_pos[:, None] - window)
            else:
                visible = k_ok[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N); masked -> 0
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        # ---- phase 2: each row's own suffix, keys P..P+S-1 (causal + window) -----------
        # Query rows of a program belong to different batch rows, so each suffix key/value
        # is gathered per row, one suffix position at a time (S is small in this workload),
        # and scored with a row-wise dot product.
        s_off = b_rel[:, None] * stride_sb + offs_d[None, :] * stride_sd  # (BLOCK_M, BLOCK_D) int32
        s_base = b0.to(tl.int64) * stride_sb + kvh.to(tl.int64) * stride_sh
        for n in range(0, S):
            kpos_s = P + n
            if EVEN_D:
                k = tl.load(KS + s_base + n * stride_ss + s_off)  # (BLOCK_M, BLOCK_D)
                v = tl.load(VS + s_base + n * stride_ss + s_off)
            else:
                k = tl.load(KS + s_base + n * stride_ss + s_off, mask=d_ok[None, :], other=0.0)
                v = tl.load(VS + s_base + n * stride_ss + s_off, mask=d_ok[None, :], other=0.0)
            s = tl.sum(q.to(tl.float32) * k.to(tl.float32), 1)  # (BLOCK_M,)
            s = _scores(s, scale, softcap, q.dtype, HAS_SOFTCAP)
            visible = kpos_s <= q_pos
            if HAS_WINDOW:
                visible = visible & (kpos_s > q_pos - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, s)
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)  # (BLOCK_M,)
            l_i = l_i * alpha + p
            acc = acc * alpha[:, None] + p[:, None] * v.to(tl.float32)
            m_i = m_new

        # Every query sees at least itself, so l_i > 0.
        out = acc / l_i[:, None]  # (BLOCK_M, BLOCK_D)
        o_off = b_rel[:, None] * stride_ob + qi[:, None] * stride_os + h[:, None] * stride_oh \
            + offs_d[None, :] * stride_od
        o_base = O + b0.to(tl.int64) * stride_ob
        tl.store(o_base + o_off, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _max_offset(strides, extents) -> int:
    """Largest element offset reached by indices below `extents` along `strides`."""
    return sum(st * (n - 1) for st, n in zip(strides, extents) if n > 0)


def shared_prefix_attention_triton(q, k_prefix, v_prefix, k_suffix, v_suffix, *, scale: float,
                                   softcap: float | None = None,
                                   window: int | None = None, config: AttnConfig | None = None) -> torch.Tensor:
    """Triton twin of :func:`rmfast.kernels.torch_twins.shared_prefix_attention`.

    q: (B, H, Sq, D); k_prefix, v_prefix: (Hkv, P, D) one shared copy; k_suffix, v_suffix:
    (B, Hkv, S, D).  Returns (B, Sq, H, D) in q.dtype.  Works on CUDA tensors, and on CPU
    tensors when TRITON_INTERPRET=1 was set before triton was imported.  ``config``: the tiles,
    warps and stages (default :func:`rmfast.kernels.attention_config.launch_config`, which fits
    them to the device's shared memory); a ValueError where none fits (the caller's torch form
    runs then: :func:`rmfast.fast.ops.shared_prefix_attention`).
    """
    if not HAVE_TRITON:
        raise RuntimeError("shared_prefix_attention_triton needs triton, which is not installed")
    check_device(q, _shared_prefix_attn_kernel)
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
    # K and V of each part are read with one set of offsets: give them equal strides.
    if k_suffix.stride() != v_suffix.stride():
        k_suffix, v_suffix = k_suffix.contiguous(), v_suffix.contiguous()
    if P == 0:
        # Empty prefix: the prefix loop never runs, but an empty tensor may carry a null data
        # pointer that the launcher rejects, so pass the suffix tensors in its place.
        k_prefix, v_prefix = k_suffix[0], v_suffix[0]  # (Hkv, S, D), never read
    elif k_prefix.stride() != v_prefix.stride():
        k_prefix, v_prefix = k_prefix.contiguous(), v_prefix.contiguous()

    cfg = config or launch_config(q)
    if cfg is None:
        raise ValueError(f"no Triton attention configuration fits this device's shared memory for head_dim {D} in "
                         f"{q.dtype}: use the torch form (rmfast.fast.ops.shared_prefix_attention does)")
    block_m, block_n, block_d = cfg.block_m, cfg.block_n, cfg.block_d
    if block_d < D:
        raise ValueError(f"config block_d {block_d} < head_dim {D}")
    n_rows = B * G * Sq
    # In-tile offsets are int32, relative to the tile's first batch row (a tile spans at most
    # block_m + 1 batch rows) or, for the prefix, to the kv head.
    b_span = block_m + 1
    spans = [_max_offset(q.stride(), (b_span, H, Sq, D)),
             _max_offset(out.stride(), (b_span, Sq, H, D)),
             _max_offset(k_suffix.stride()[:1] + k_suffix.stride()[2:], (b_span, S, D)),
             _max_offset(k_prefix.stride()[1:], (P, D))]
    if max(spans) >= 2**31:
        raise ValueError("tensor strides too large for the kernel's int32 in-tile offsets")
    prefix_lo = 0
    if window is not None:
        # The earliest query sits at P + S - Sq; keys at or before P + S - Sq - window are
        # invisible to every query, so whole prefix tiles below that are never loaded.
        prefix_lo = min(P, max(0, P + S - Sq - window + 1))
        prefix_lo = (prefix_lo // block_n) * block_n
    # fp32 inputs: "ieee" so the GPU does not silently use TF32 (10-bit mantissa) tensor cores.
    precision = dot_precision(q.dtype)
    grid = (triton.cdiv(n_rows, block_m), Hkv)
    _shared_prefix_attn_kernel[grid](
        q, k_prefix, v_prefix, k_suffix, v_suffix, out,
        *q.stride(), *k_prefix.stride(), *k_suffix.stride(), *out.stride(),
        n_rows, P, S, Sq, D, prefix_lo,
        float(scale), float(softcap) if softcap is not None else 1.0,
        int(window) if window is not None else 0,
        G=G,
        HAS_SOFTCAP=softcap is not None,
        HAS_WINDOW=window is not None,
        EVEN_D=block_d == D,
        DOT_PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
