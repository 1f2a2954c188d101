"""Triton cascade attention: the twin of :mod:`rmfast.kernels.cascade_torch` (the maths, the layouts
and the numerics are stated there), for responses of any length and many prompts per call.

Four kernels, each one launch per layer for a whole wave (the packed response part in its prompt pass, the
other three in its rows' pass):

  prompt part   grid (query tiles, prompts, kv heads). A program owns BLOCK_M query rows of one prompt and
                one kv head, a query row being (row b, position j, group head g) of that prompt's rows,
                flattened as r = (b·Sq + j)·G + g. Every query row of the program reads the same prompt
                K/V tile, so the tile is loaded once per BLOCK_M query rows and each step is two tl.dot
                tiles (tensor cores). Programs past a prompt's query count return at once (prompts of
                a wave differ in rows; the grid is sized for the largest).
  response part grid (query tiles, rows, query heads): flash attention over the row's own keys, causal,
                blocks past the row's length (or before its window) never loaded, tl.dot tiles.
  response part, grid (query tiles of the longest row, rows, query heads): the same flash loop over rows
  packed        packed back to back without padding, (T, H, D) with ``cu_seqlens`` (n+1,) (FlashAttention's
                varlen layout; the packed prompt pass, :mod:`rmfast.fast.wave`); programs past their row's
                end return at once; the output is written in the caller's dtype (no cast pass after it).
  merge         one program per BLOCK_R (row, position, head) triples: the two fp32 parts by their
                log-sum-exps, rounded once to the model dtype.

No per-length recompiles: the only constexprs are block sizes and flags (softcap, window, dot
precision); lengths, strides, counts and the group size are runtime arguments, and every integer
argument that varies with the job is listed in ``do_not_specialize`` (Triton would otherwise compile
a variant for values divisible by 16 and for 1).

fp32 inputs use IEEE dots (``input_precision="ieee"``: no silent TF32); bf16/fp16 tiles go to the tensor
cores with fp32 accumulation, probabilities rounded to the value dtype for the P·V product as every
flash kernel does (tested loosely; fp32 elementwise).
"""

from __future__ import annotations

import torch

from .triton_common import HAVE_TRITON, check_device, next_pow2, tl, triton  # noqa: F401

__all__ = ["HAVE_TRITON", "cascade_attention_triton", "prompt_part_triton", "response_part_triton",
           "response_part_varlen_triton", "merge_triton"]


if HAVE_TRITON:

    @triton.jit
    def _tanh(x):
        # tanh via exp (the interpreter has no libdevice); saturates to +-1 correctly.
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)

    @triton.jit
    def _online_step(s, visible, m_i, l_i, acc, v, DOT_PRECISION: tl.constexpr):
        """One key tile of the online soft-max: s (M, N) fp32 scores, visible (M, N), v (N, D).
        m_i may stay -inf for a row that has seen no key yet (never exp(-inf - -inf))."""
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (M,)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)  # (M,); 0 while m_i is -inf
        p = tl.exp(s - m_safe[:, None])  # (M, N); 0 where masked
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _scores(q, k, scale, softcap, HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (M, N) fp32
        if HAS_SOFTCAP:
            s = _tanh(s / softcap) * softcap
        return s

    @triton.jit
    def _finish(m_i, l_i, acc):
        """(out (M, D) fp32, lse (M,) fp32); no key seen: 0 and -inf."""
        seen = l_i > 0.0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
        return out, lse

    @triton.jit(do_not_specialize=["n_prompts", "Sq", "G", "q_pos0", "window"])
    def _prompt_kernel(
        Q, K, V, CU_ROWS, CU_KV, O, LSE, QPOS,
        stride_qb, stride_qs, stride_qh, stride_qd,
        stride_kh, stride_kn, stride_kd,  # K and V share strides
        stride_ob, stride_os, stride_oh,  # O (B, Sq, H, D) contiguous fp32; LSE (B, Sq, H) the same without D
        n_prompts, Sq, G, D, q_pos0,
        scale, softcap, window,
        HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_QPOS: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_p = tl.program_id(1)
        kvh = tl.program_id(2)
        r0 = tl.load(CU_ROWS + pid_p)
        r1 = tl.load(CU_ROWS + pid_p + 1)
        k0 = tl.load(CU_KV + pid_p)
        P = tl.load(CU_KV + pid_p + 1) - k0
        n_q = (r1 - r0) * Sq * G  # this prompt's query rows for one kv head
        if pid_m * BLOCK_M >= n_q:
            return  # no query row here (the grid is sized for the prompt with most rows)
        # An empty prompt (P = 0) runs no key tile: its rows get out 0 and lse -inf from _finish, written here, so the
        # launcher allocates out and lse without a fill (two launches per layer fewer).
        r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows within the prompt
        r_ok = r < n_q
        r = tl.minimum(r, n_q - 1)  # pad rows: copies of the last (loads stay in bounds; stores masked)
        b = (r0 + r // (Sq * G)).to(tl.int64)  # batch row
        j = (r // G) % Sq  # query position within the last Sq
        h = kvh * G + r % G  # query head
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + b[:, None] * stride_qb + j[:, None] * stride_qs + h[:, None] * stride_qh
                    + offs_d[None, :] * stride_qd, mask=d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        t = P + q_pos0 + j  # (BLOCK_M,) absolute query positions
        if HAS_QPOS:  # packed rows, every token a one-query row: its place in its row
            t = t + tl.load(QPOS + b)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo = 0
        if HAS_WINDOW:  # tiles wholly before every query's window are never loaded
            t_min = tl.min(t, 0)
            lo = tl.maximum(0, t_min - window + 1)
            lo = (lo // BLOCK_N) * BLOCK_N
        kv_base = kvh.to(tl.int64) * stride_kh + k0.to(tl.int64) * stride_kn
        offs_n = tl.arange(0, BLOCK_N)
        for start in range(lo, P, BLOCK_N):
            kpos = start + offs_n  # (BLOCK_N,) positions in the prompt
            k_ok = kpos < P
            off = kv_base + kpos[:, None].to(tl.int64) * stride_kn + offs_d[None, :] * stride_kd
            k = tl.load(K + off, mask=k_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
            v = tl.load(V + off, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
            s = _scores(q, k, scale, softcap, HAS_SOFTCAP, DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
            visible = k_ok[None, :]
            if HAS_WINDOW:
                visible = visible & (kpos[None, :] > t[:, None] - window)
            m_i, l_i, acc = _online_step(s, visible, m_i, l_i, acc, v, DOT_PRECISION)
        out, lse = _finish(m_i, l_i, acc)
        o_row = b * stride_ob + j * stride_os + h * stride_oh  # (BLOCK_M,) int64
        tl.store(O + o_row[:, None] + offs_d[None, :], out, mask=r_ok[:, None] & d_ok[None, :])
        tl.store(LSE + o_row // D, lse, mask=r_ok)  # LSE (B, Sq, H) is O's layout without D

    @triton.jit
    def _own_keys(q, t, lo, hi, K, V, kv_base, stride_kn, stride_kd, offs_d, d_ok, scale, softcap, window,
                  HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """The response part's key loop: queries q (BLOCK_M, BLOCK_D) at row positions t (BLOCK_M,) over the
        row's keys lo..hi-1 (key u at K + kv_base + u·stride_kn), causal and windowed -> (m_i, l_i, acc)."""
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        offs_n = tl.arange(0, BLOCK_N)
        for start in range(lo, hi, BLOCK_N):
            u = start + offs_n  # (BLOCK_N,) key positions in the row
            u_ok = u < hi
            off = kv_base + u[:, None].to(tl.int64) * stride_kn + offs_d[None, :] * stride_kd
            k = tl.load(K + off, mask=u_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
            v = tl.load(V + off, mask=u_ok[:, None] & d_ok[None, :], other=0.0)
            s = _scores(q, k, scale, softcap, HAS_SOFTCAP, DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
            visible = u_ok[None, :] & (u[None, :] <= t[:, None])
            if HAS_WINDOW:
                visible = visible & (t[:, None] - u[None, :] < window)
            m_i, l_i, acc = _online_step(s, visible, m_i, l_i, acc, v, DOT_PRECISION)
        return m_i, l_i, acc

    @triton.jit
    def _window_lo(t_lo, window, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
        """The first key tile a query tile starting at row position t_lo can see (tiles wholly before every
        query's window are never loaded)."""
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(0, t_lo - window + 1)
            lo = (lo // BLOCK_N) * BLOCK_N
        return lo

    @triton.jit(do_not_specialize=["Sq", "S", "G", "window"])
    def _response_kernel(
        Q, K, V, LEN, O, LSE,
        stride_qb, stride_qs, stride_qh, stride_qd,
        stride_kb, stride_ks, stride_kh, stride_kd,  # K and V share strides
        stride_ob, stride_os, stride_oh,
        Sq, S, G, D,
        scale, softcap, window,
        HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2)
        L = tl.load(LEN + b)  # the row's real positions
        j = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
        j_ok = j < Sq
        j = tl.minimum(j, Sq - 1)
        t = S - Sq + j  # (BLOCK_M,) row positions of the queries
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + b * stride_qb + j[:, None] * stride_qs + h * stride_qh + offs_d[None, :] * stride_qd,
                    mask=d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        hi = tl.minimum(tl.max(t, 0) + 1, L)  # causal, and never past the row's end
        lo = _window_lo(S - Sq + pid_m * BLOCK_M, window, HAS_WINDOW, BLOCK_N)
        kv_base = b * stride_kb + (h // G).to(tl.int64) * stride_kh
        m_i, l_i, acc = _own_keys(q, t, lo, hi, K, V, kv_base, stride_ks, stride_kd, offs_d, d_ok, scale, softcap,
                                  window, HAS_SOFTCAP, HAS_WINDOW, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
        out, lse = _finish(m_i, l_i, acc)
        o_row = b * stride_ob + j * stride_os + h * stride_oh  # (BLOCK_M,) int64
        tl.store(O + o_row[:, None] + offs_d[None, :], out, mask=j_ok[:, None] & d_ok[None, :])
        tl.store(LSE + o_row // D, lse, mask=j_ok)

    @triton.jit(do_not_specialize=["G", "window"])
    def _response_varlen_kernel(
        Q, K, V, CU, O, LSE,
        stride_qt, stride_qh, stride_qd,
        stride_kt, stride_kh, stride_kd,  # K and V share strides
        stride_ot, stride_oh,  # O (T, H, D) contiguous; LSE (T, H) the same without D
        G, D,
        scale, softcap, window,
        HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        i = tl.program_id(1)
        h = tl.program_id(2)
        s0 = tl.load(CU + i)
        L = tl.load(CU + i + 1) - s0  # row i's tokens at s0..s0+L-1
        if pid_m * BLOCK_M >= L:
            return  # the grid is sized for the longest row
        j = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) row positions of the queries
        j_ok = j < L
        j = tl.minimum(j, L - 1)  # pad rows: copies of the last (loads stay in the row; stores masked)
        tok = s0.to(tl.int64) + j  # (BLOCK_M,) packed token index
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + tok[:, None] * stride_qt + h * stride_qh + offs_d[None, :] * stride_qd,
                    mask=d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        hi = tl.max(j, 0) + 1  # causal: the row's keys up to its last query here (never past its end)
        lo = _window_lo(pid_m * BLOCK_M, window, HAS_WINDOW, BLOCK_N)
        kv_base = s0.to(tl.int64) * stride_kt + (h // G).to(tl.int64) * stride_kh
        m_i, l_i, acc = _own_keys(q, j, lo, hi, K, V, kv_base, stride_kt, stride_kd, offs_d, d_ok, scale, softcap,
                                  window, HAS_SOFTCAP, HAS_WINDOW, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
        out, lse = _finish(m_i, l_i, acc)
        o_row = tok * stride_ot + h * stride_oh  # (BLOCK_M,) int64
        tl.store(O + o_row[:, None] + offs_d[None, :], out.to(O.dtype.element_ty), mask=j_ok[:, None] & d_ok[None, :])
        tl.store(LSE + o_row // D, lse, mask=j_ok)

    @triton.jit(do_not_specialize=["n_triples"])
    def _merge_kernel(OA, LA, OB, LB, O, n_triples, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """(n_triples, D) fp32 parts and (n_triples,) lses, all contiguous -> O (n_triples, D) model dtype."""
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,)
        r_ok = r < n_triples
        offs_d = tl.arange(0, BLOCK_D)
        mask = r_ok[:, None] & (offs_d[None, :] < D)
        la = tl.load(LA + r, mask=r_ok, other=float("-inf"))
        lb = tl.load(LB + r, mask=r_ok, other=float("-inf"))
        m = tl.maximum(la, lb)
        m = tl.where(m == float("-inf"), 0.0, m)
        wa = tl.exp(la - m)
        wb = tl.exp(lb - m)
        den = wa + wb
        den = tl.where(den > 0.0, den, 1.0)
        off = r[:, None].to(tl.int64) * D + offs_d[None, :]
        oa = tl.load(OA + off, mask=mask, other=0.0)
        ob = tl.load(OB + off, mask=mask, other=0.0)
        out = (oa * wa[:, None] + ob * wb[:, None]) / den[:, None]
        tl.store(O + off, out.to(O.dtype.element_ty), mask=mask)


def _blocks(block_d: int, elt: int, on_cuda: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages), all tiles >= 16 (tl.dot). On CUDA: the K and V tiles of
    two pipeline stages kept within 64 KiB of shared memory (2 · 2 · BLOCK_N · BLOCK_D · elt), so fp32 and
    head dim 256 fit (the shared-prefix kernel ran out of shared memory there on the H100); BLOCK_M 64 where
    the fp32 accumulator stays small. Timed against six others on an H200 (2026-11-29, a best-of-N wave's prompt
    part, 64 rows x 110 tokens, prompt 2,048; ``rmfast.bench.attention_tune``): the fastest, 64 x 64 at 3 stages,
    was 1.3% faster (same bits), inside the run's noise: kept. In the interpreter larger tiles run faster (fewer
    programs; its per-op cost dominates)."""
    if not on_cuda:
        return 32, 32, 4, 1
    stages = 2
    bn = max(16, min(64, (64 * 1024) // (2 * stages * block_d * elt)))
    bm = 64 if block_d * elt <= 256 else 32
    return bm, bn, (4 if block_d <= 128 else 8), stages


def _check(q, kernel) -> None:
    if not HAVE_TRITON:
        raise RuntimeError("the Triton cascade kernels need triton, which is not installed")
    check_device(q, kernel)


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: IEEE dots, so the GPU does not silently use TF32 (10-bit mantissa) tensor cores
    return "ieee" if dtype == torch.float32 else "tf32"


def prompt_part_triton(q, k, v, cu_rows, cu_kv, max_rows: int, *, q_pos0: int = 0, scale: float,
                       softcap: float | None = None, window: int | None = None, q_pos: torch.Tensor | None = None,
                       blocks: tuple[int, int, int, int] | None = None):
    """:func:`rmfast.kernels.cascade_torch.prompt_part` in one launch for all prompts.

    cu_rows, cu_kv: (n+1,) int32 device tensors, every row some prompt's (cu_rows[-1] == B: a row outside them would
    not be written); max_rows: the most rows any prompt has (sizes the grid);
    q_pos: (B,) int32 each row's offset to its queries' positions (read only under a window), None: 0.
    blocks: (BLOCK_M, BLOCK_N, num_warps, num_stages) in place of :func:`_blocks`' (tiles >= 16; for timing others:
    :mod:`rmfast.bench.attention_tune`). Returns (out (B, Sq, H, D) fp32, lse (B, Sq, H) fp32)."""
    _check(q, _prompt_kernel)
    B, Sq, H, D = q.shape
    Hkv = k.shape[0]
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    n = cu_rows.numel() - 1
    if B == 0 or n == 0 or k.shape[1] == 0 or max_rows == 0:
        return (torch.zeros(B, Sq, H, D, dtype=torch.float32, device=q.device),
                torch.full((B, Sq, H), float("-inf"), dtype=torch.float32, device=q.device))
    # every row is some prompt's (cu_rows[-1] == B), and the kernel writes each of its query rows, an empty prompt's
    # too: no fill before it
    out = torch.empty(B, Sq, H, D, dtype=torch.float32, device=q.device)  # (B, Sq, H, D)
    lse = torch.empty(B, Sq, H, dtype=torch.float32, device=q.device)
    block_d = max(16, next_pow2(D))
    bm, bn, warps, stages = blocks or _blocks(block_d, q.element_size(), q.is_cuda)
    G = H // Hkv
    grid = (triton.cdiv(max_rows * Sq * G, bm), n, Hkv)
    has_qpos = window is not None and q_pos is not None
    _prompt_kernel[grid](
        q, k, v, cu_rows, cu_kv, out, lse, q_pos.to(torch.int32) if has_qpos else cu_rows,
        *q.stride(), *k.stride(), *out.stride()[:3],
        n, Sq, G, D, q_pos0,
        float(scale), float(softcap) if softcap is not None else 1.0, int(window) if window is not None else 0,
        HAS_SOFTCAP=softcap is not None, HAS_WINDOW=window is not None, HAS_QPOS=has_qpos,
        DOT_PRECISION=_precision(q.dtype),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, num_warps=warps, num_stages=stages,
    )
    return out, lse


def response_part_triton(q, k, v, lengths=None, *, scale: float, softcap: float | None = None,
                         window: int | None = None):
    """:func:`rmfast.kernels.cascade_torch.response_part`: q (B, Sq, H, D), k/v (B, S, Hkv, D), lengths
    (B,) int32 on the device (None: S). Returns (out (B, Sq, H, D) fp32, lse (B, Sq, H) fp32)."""
    _check(q, _response_kernel)
    B, Sq, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    out = torch.empty(B, Sq, H, D, dtype=torch.float32, device=q.device)  # (B, Sq, H, D)
    lse = torch.empty(B, Sq, H, dtype=torch.float32, device=q.device)
    if B == 0:
        return out, lse
    if lengths is None:
        lengths = torch.full((B,), S, dtype=torch.int32, device=q.device)
    lengths = lengths.to(device=q.device, dtype=torch.int32)
    block_d = max(16, next_pow2(D))
    bm, bn, warps, stages = _blocks(block_d, q.element_size(), q.is_cuda)
    grid = (triton.cdiv(Sq, bm), B, H)
    _response_kernel[grid](
        q, k, v, lengths, out, lse,
        *q.stride(), *k.stride(), *out.stride()[:3],
        Sq, S, H // Hkv, D,
        float(scale), float(softcap) if softcap is not None else 1.0, int(window) if window is not None else 0,
        HAS_SOFTCAP=softcap is not None, HAS_WINDOW=window is not None, DOT_PRECISION=_precision(q.dtype),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, num_warps=warps, num_stages=stages,
    )
    return out, lse


def response_part_varlen_triton(q, k, v, cu_seqlens, max_len: int, *, scale: float, softcap: float | None = None,
                                window: int | None = None, out_dtype: torch.dtype = torch.float32):
    """:func:`rmfast.kernels.cascade_torch.response_part_varlen` in one launch: q (T, H, D), k/v (T, Hkv, D)
    packed rows, cu_seqlens (n+1,) int32 on the device, max_len the longest row (sizes the grid; a host int).
    Returns (out (T, H, D) in ``out_dtype``, lse (T, H) fp32)."""
    _check(q, _response_varlen_kernel)
    T, H, D = q.shape
    Hkv = k.shape[1]
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)  # (T, H, D); every token is some row's
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    n = cu_seqlens.numel() - 1
    if T == 0 or n == 0 or max_len == 0:
        return out, lse
    block_d = max(16, next_pow2(D))
    bm, bn, warps, stages = _blocks(block_d, q.element_size(), q.is_cuda)
    grid = (triton.cdiv(max_len, bm), n, H)
    _response_varlen_kernel[grid](
        q, k, v, cu_seqlens, out, lse,
        *q.stride(), *k.stride(), *out.stride()[:2],
        H // Hkv, D,
        float(scale), float(softcap) if softcap is not None else 1.0, int(window) if window is not None else 0,
        HAS_SOFTCAP=softcap is not None, HAS_WINDOW=window is not None, DOT_PRECISION=_precision(q.dtype),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, num_warps=warps, num_stages=stages,
    )
    return out, lse


def merge_triton(out_a, lse_a, out_b, lse_b, dtype: torch.dtype) -> torch.Tensor:
    """:func:`rmfast.kernels.cascade_torch.merge` for contiguous (.., D) fp32 parts and (..) lses."""
    _check(out_a, _merge_kernel)
    D = out_a.shape[-1]
    out = torch.empty(out_a.shape, dtype=dtype, device=out_a.device)
    n = lse_a.numel()
    if n == 0:
        return out
    block_d = max(16, next_pow2(D))
    block_r = max(1, min(64, 4096 // block_d))
    _merge_kernel[(triton.cdiv(n, block_r),)](out_a.contiguous(), lse_a.contiguous(), out_b.contiguous(),
                                               lse_b.contiguous(), out, n, D, BLOCK_R=block_r, BLOCK_D=block_d)
    return out


def cascade_attention_triton(q, k_suffix, v_suffix, k_prompt, v_prompt, cu_rows, cu_kv, lengths=None, *,
                             max_rows: int, scale: float, softcap: float | None = None,
                             window: int | None = None) -> torch.Tensor:
    """:func:`rmfast.kernels.cascade_torch.cascade_attention` in three launches (prompt part, response
    part, merge) whatever the number of prompts. Returns (B, Sq, H, D) in q.dtype."""
    B, Sq, H, D = q.shape
    S, Hkv = k_suffix.shape[1], k_suffix.shape[2]
    if not (k_prompt.shape[0] == Hkv and H % Hkv == 0 and k_prompt.shape[2] == D == k_suffix.shape[3]):
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k_suffix {tuple(k_suffix.shape)}, "
                         f"k_prompt {tuple(k_prompt.shape)}")
    if not 1 <= Sq <= S:
        raise ValueError(f"need 1 <= Sq <= S, got Sq={Sq}, S={S}")
    out_r, lse_r = response_part_triton(q, k_suffix, v_suffix, lengths, scale=scale, softcap=softcap, window=window)
    if k_prompt.shape[1] == 0:
        return out_r.to(q.dtype)
    out_p, lse_p = prompt_part_triton(q, k_prompt, v_prompt, cu_rows, cu_kv, max_rows, q_pos0=S - Sq, scale=scale,
                                      softcap=softcap, window=window)
    return merge_triton(out_p, lse_p, out_r, lse_r, q.dtype)


def cascade_attention_varlen_triton(q, k, v, k_prompt, v_prompt, cu_q, cu_kv, max_q: int, cu_seqlens, max_len: int,
                                    *, scale: float, softcap: float | None = None, window: int | None = None,
                                    q_pos: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`rmfast.kernels.cascade_torch.cascade_attention_varlen` in three launches (response part varlen,
    prompt part with one query per token, merge) whatever the numbers of prompts and rows. ``max_q``: the most
    tokens of one prompt's rows, ``max_len``: the longest row (host ints sizing the grids); ``q_pos`` (T,) int32 each
    token's place in its row, needed with a ``window``. (T, H, D) in q.dtype."""
    if window is not None and q_pos is None:
        raise ValueError("a sliding window over packed rows needs q_pos (each token's place in its row)")
    out_r, lse_r = response_part_varlen_triton(q, k, v, cu_seqlens, max_len, scale=scale, softcap=softcap,
                                               window=window)
    if k_prompt.shape[1] == 0:
        return out_r.to(q.dtype)
    out_p, lse_p = prompt_part_triton(q[:, None], k_prompt, v_prompt, cu_q, cu_kv, max_q, scale=scale, softcap=softcap,
                                      window=window, q_pos=q_pos)
    return merge_triton(out_p[:, 0], lse_p[:, 0], out_r, lse_r, q.dtype)
