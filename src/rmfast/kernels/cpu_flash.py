"""Shared-prefix attention on CPU from torch's fused flash-attention kernel: for long prompts.

The torch twin form (:func:`rmfast.kernels.torch_twins.shared_prefix_attention`) writes every score
out: a (rows, heads, queries, P + S) block, then a mask, a soft-max and copies over it. For a
2,000-token prompt that block, not the GEMMs, is most of the time (the prompt pass attends 2,000
queries to 2,000 keys; each row's queries attend to all 2,000 prompt keys). Here each part runs
through ``aten::_scaled_dot_product_flash_attention_for_cpu``, which tiles the soft-max in fp32
and returns each query's log-sum-exp, and the two parts are merged exactly as a split soft-max is
(the cascade form of FlashInfer's shared-prefix attention):

    prompt part:  all rows' queries of one kv head stacked into one operand against the ONE
                  shared (Hkv, P, D) copy (never expanded per row): out_p, lse_p
    suffix part:  each row's queries against its own S keys, causal: out_s, lse_s
    merged:       (out_p · e^(lse_p - m) + out_s · e^(lse_s - m)) / (e^(lse_p - m) + e^(lse_s - m))

Numerics: fp32 accumulation and soft-max, merged in fp32, rounded once to q.dtype. In fp32 this
equals the torch twin to rounding (another summation order); in bf16/fp16 it is closer to fp32 truth
than HF eager's rounding points (scores are not rounded to bf16 before the soft-max). No softcap, and
no sliding window that hides a key (:func:`usable`); the caller keeps the torch twin form there.

Example:
    >>> import torch
    >>> q = torch.randn(2, 4, 3, 8); kp = torch.randn(2, 5, 8); ks = torch.randn(2, 2, 3, 8)
    >>> shared_prefix_attention_flash(q, kp, kp, ks, ks, scale=8**-0.5).shape
    torch.Size([2, 3, 4, 8])
"""

from __future__ import annotations

import torch


#: torch's CPU flash kernel returning the log-sum-exp (torch >= 2.3); without it the torch twin form runs
HAVE_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def usable(softcap: float | None, window: int | None, P: int, S: int) -> bool:
    """Whether this form computes the layer's attention: torch has the kernel, no softcap, and no key
    outside a window."""
    return HAVE_FLASH and softcap is None and (window is None or window >= P + S)


def _flash(q, k, v, scale: float, causal_from: int | None):
    """(1 or B, n, Lq, D) queries over (.., n, Lk, D) keys -> (out in q.dtype, lse fp32 (.., n, Lq)).

    causal_from: None (every key visible) or the key index of query 0 (query i sees keys <= causal_from + i).
    """
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if causal_from is None:
        return op(q, k, v, 0.0, False, scale=scale)
    Lq, Lk = q.shape[-2], k.shape[-2]
    if causal_from == 0 and Lq == Lk:
        return op(q, k, v, 0.0, True, scale=scale)
    i = torch.arange(Lq, device=q.device)[:, None]
    j = torch.arange(Lk, device=q.device)[None, :]
    mask = torch.zeros(Lq, Lk, dtype=q.dtype, device=q.device).masked_fill(j > causal_from + i, float("-inf"))
    return op(q, k, v, 0.0, False, attn_mask=mask, scale=scale)


def shared_prefix_attention_flash(q, k_prefix, v_prefix, k_suffix, v_suffix, *, scale: float) -> torch.Tensor:
    """q (B, H, Sq, D): the last Sq of each row's S suffix positions; k/v_prefix (Hkv, P, D), shared;
    k/v_suffix (B, Hkv, S, D). Returns (B, Sq, H, D) in q.dtype (the torch twin's layout)."""
    B, H, Sq, D = q.shape
    Hkv, P, _ = k_prefix.shape
    S = k_suffix.shape[2]
    G = H // Hkv
    # suffix: the row's own keys, shared by the G query heads of each kv head (expanded: S is short)
    ks = k_suffix[:, :, None].expand(B, Hkv, G, S, D).reshape(B, H, S, D)
    vs = v_suffix[:, :, None].expand(B, Hkv, G, S, D).reshape(B, H, S, D)
    out_s, lse_s = _flash(q, ks, vs, scale, S - Sq)  # (B, H, Sq, D), (B, H, Sq)
    if P == 0:
        return out_s.transpose(1, 2)
    # prompt: (1, Hkv, G·B·Sq, D) queries against the one (1, Hkv, P, D) copy
    qg = q.view(B, Hkv, G, Sq, D).permute(1, 2, 0, 3, 4).reshape(1, Hkv, G * B * Sq, D)
    out_p, lse_p = _flash(qg, k_prefix[None], v_prefix[None], scale, None)
    out_p = out_p.view(Hkv, G, B, Sq, D).permute(2, 0, 1, 3, 4).reshape(B, H, Sq, D)
    lse_p = lse_p.view(Hkv, G, B, Sq).permute(2, 0, 1, 3).reshape(B, H, Sq)
    m = torch.maximum(lse_p, lse_s)
    w_p, w_s = torch.exp(lse_p - m)[..., None], torch.exp(lse_s - m)[..., None]  # (B, H, Sq, 1) fp32
    out = (out_p.float() * w_p + out_s.float() * w_s) / (w_p + w_s)
    return out.to(q.dtype).transpose(1, 2)  # (B, Sq, H, D)


def response_part_varlen(q, k, v, cu_seqlens, *, scale: float, min_len: int, short):
    """Each row's causal attention over its own keys, rows packed back to back (q (T, H, D), k/v (T, Hkv, D), row
    r's tokens at cu_seqlens[r]:cu_seqlens[r+1]) -> (out (T, H, D) fp32, lse (T, H) fp32): a row of ``min_len`` or
    more tokens through torch's flash kernel, one call a row, the others through ``short`` (the torch twin's
    :func:`rmfast.kernels.cascade_torch.response_part_varlen`, on a pack of those rows alone). Each row's
    arithmetic is a function of the row alone (its call, its shapes), so a row gets the same bits whatever it is
    packed with (``rmfast serve``). No softcap, no window that hides a key (the caller checks :func:`usable`).

    >>> q = torch.randn(300 + 5, 4, 8); cu = torch.tensor([0, 300, 305], dtype=torch.int32)
    >>> from rmfast.kernels.cascade_torch import response_part_varlen as ref
    >>> o, l = response_part_varlen(q, q[:, :2], q[:, :2], cu, scale=8**-0.5, min_len=256,
    ...                             short=lambda *a: ref(*a, scale=8**-0.5))
    >>> o2, l2 = ref(q, q[:, :2], q[:, :2], cu, scale=8**-0.5)
    >>> bool(torch.allclose(o, o2, atol=1e-5) and torch.allclose(l, l2, atol=1e-5))
    True
    """
    T, H, D = q.shape
    G = H // k.shape[1]
    cu = cu_seqlens.tolist()
    spans = list(zip(cu[:-1], cu[1:]))
    long = [(a, b) for a, b in spans if b - a >= min_len]
    if not long:
        return short(q, k, v, cu_seqlens)
    out = q.new_empty(T, H, D, dtype=torch.float32)
    lse = q.new_empty(T, H, dtype=torch.float32)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    for a, b in long:
        kr = k[a:b].transpose(0, 1).repeat_interleave(G, dim=0)[None]  # (1, H, L, D): head h reads kv head h // G
        vr = v[a:b].transpose(0, 1).repeat_interleave(G, dim=0)[None]
        o, l = op(q[a:b].transpose(0, 1)[None], kr, vr, 0.0, True, scale=scale)  # (1, H, L, D), (1, H, L)
        out[a:b], lse[a:b] = o[0].transpose(0, 1).float(), l[0].transpose(0, 1)
    rest = [(a, b) for a, b in spans if b - a < min_len]
    if rest:  # the short rows as a pack of their own: the torch twin's per-row form, its bits the same
        idx = torch.cat([torch.arange(a, b) for a, b in rest]).to(q.device)  # (T_short,)
        cu_s = torch.tensor([0] + [b - a for a, b in rest], dtype=cu_seqlens.dtype).cumsum(0).to(cu_seqlens)
        o, l = short(q[idx], k[idx], v[idx], cu_s)
        out[idx], lse[idx] = o.float(), l
    return out, lse
