"""Cascade attention, the torch twin: the oracle of :mod:`rmfast.kernels.triton_cascade` (and the CPU path
when the cascade form is forced, in tests).

The rows' pass of the engine attends each row's queries to ``prompt K/V ⊕ the row's own K/V``. The
cascade form (FlashInfer's name; here written from the maths) splits that soft-max in two parts and
merges them exactly:

    prompt part:    every query of every row of one prompt (rows x positions x group heads flattened into
                    one query axis) against that prompt's ONE shared K/V, no causal mask (every prompt key
                    precedes every row query), only a sliding window by absolute positions:  out_p, lse_p
    response part:  each row's queries against the row's own keys, causal, ragged (row b has ``lengths[b]``
                    real positions; a real position never reads a key after the row's end):  out_r, lse_r
    merge:          out = (out_p · e^(lse_p - m) + out_r · e^(lse_r - m)) / (e^(lse_p - m) + e^(lse_r - m)),
                    m = max(lse_p, lse_r), in fp32, rounded once to the model dtype

Several prompts are ONE call: their K/V are concatenated along positions, ``cu_kv`` (n+1,) gives prompt
i's keys ``cu_kv[i]:cu_kv[i+1]``, and ``cu_rows`` (n+1,) its rows ``cu_rows[i]:cu_rows[i+1]`` of the batch
(rows are grouped by prompt, as :class:`rmfast.fast.layer.MultiPrompt` orders them). Row query j (of the
last Sq of S row positions) of prompt i sits at absolute position ``P_i + S - Sq + j``.

The same response part on rows packed back to back without padding, ``cu_seqlens`` (n+1,) giving row i's
tokens (:func:`response_part_varlen`), is the packed prompt pass's attention (:mod:`rmfast.fast.wave`).
Rows packed that way AND attending to their prompts (:func:`cascade_attention_varlen`, the engine's packed
rows' pass) run the prompt part with every token as a one-query "row": a token's prompt is the prompt of its
row, so prompt i's queries are the tokens ``cu_q[i]:cu_q[i+1]``, each at its own position (``q_pos``: its place
in its row) for a sliding window.

Numerics: scores are formed in fp32 from the inputs (exact products of bf16/fp16 values), scaled,
Gemma-2 softcapped (``tanh(s / cap) · cap``) and soft-maxed in fp32; each part's output is fp32; the
merge rounds once. In fp32 this is :func:`rmfast.kernels.torch_twins.shared_prefix_attention` to fp32
rounding (another summation order); in bf16 it is closer to fp32 truth than HF eager's rounding points,
as :mod:`rmfast.kernels.cpu_flash` is. A query that sees no key in a part (a window that ends before the
prompt, or a pad position of a short row under a window) gets out 0 and lse -inf from that part; the
merge of two empty parts is 0. Pad positions (after a row's end) get finite values that no real
position reads.

Example:
    >>> import torch
    >>> q = torch.randn(3, 2, 4, 8); ks = torch.randn(3, 2, 2, 8); kp = torch.randn(2, 5 + 7, 8)
    >>> cu_rows, cu_kv = torch.tensor([0, 1, 3]), torch.tensor([0, 5, 12])
    >>> cascade_attention(q, ks, ks, kp, kp, cu_rows, cu_kv, torch.tensor([2, 1, 2]), scale=8**-0.5).shape
    torch.Size([3, 2, 4, 8])
"""

from __future__ import annotations

import torch

from .torch_twins import _bmm_rows, each_alike


def _mm(a: torch.Tensor, b: torch.Tensor, rule=None, own_shape: bool = False) -> torch.Tensor:
    """``a @ b``; under a rows rule (:func:`rmfast.fast.ops.gemm_rows`, ``rmfast serve``) 3-d operands made
    contiguous and M cut in fixed chunks (:func:`rmfast.kernels.torch_twins._bmm_rows`), so a query's result is
    its own whatever else shares the call (a strided operand, or another M, takes other kernels). ``own_shape``:
    the shapes are one row's own (its response part), so contiguous operands suffice, no chunks."""
    if rule is None:
        return a @ b
    if own_shape:
        return torch.bmm(a.contiguous(), b.contiguous())
    return _bmm_rows(a.contiguous(), b.contiguous(), rule)


def _softmax_parts(s: torch.Tensor, visible: torch.Tensor | None, v: torch.Tensor, rule=None,
                   own_shape: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 scores s (..., M, K) (a fresh tensor: overwritten), bool visibility (broadcast to s; None: every key),
    values v (..., K, D) fp32 -> (out (..., M, D) fp32, lse (..., M) fp32); an empty row gives out 0, lse -inf.
    The un-normalised exponentials meet v and are divided once after (a few passes over the scores, in place)."""
    if visible is not None:
        s.masked_fill_(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)  # (..., M, 1)
    m = torch.where(torch.isfinite(m), m, 0.0)  # a row that sees nothing: its exponentials are all 0
    alike = rule is not None and not own_shape  # M rows of others too: exp and log each element alike (each_alike)
    p = each_alike(torch.exp, s.sub_(m)) if alike else s.sub_(m).exp_()  # (..., M, K); 0 where masked
    den = p.sum(-1, keepdim=True)  # (..., M, 1)
    out = _mm(p, v, rule, own_shape) / torch.where(den > 0, den, 1.0)
    return out, (m + (each_alike(torch.log, den) if alike else den.log())).squeeze(-1)  # lse -inf: nothing visible


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, softcap: float | None, rule=None,
            own_shape: bool = False) -> torch.Tensor:
    s = _mm(q.float(), k.float().transpose(-1, -2), rule, own_shape) * scale  # fp32
    if softcap is not None:
        s = (each_alike(torch.tanh, s / softcap) if rule is not None and not own_shape else torch.tanh(s / softcap)) * softcap
    return s


def prompt_part(q, k, v, cu_rows, cu_kv, *, q_pos0: int = 0, scale: float, softcap: float | None = None,
                window: int | None = None, rule=None, q_pos=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' queries over their prompt's shared K/V.

    q: (B, Sq, H, D); rows cu_rows[i]:cu_rows[i+1] belong to prompt i, and their query j sits at absolute
    position P_i + q_pos0 + j (q_pos0 = S - Sq: the queries are the last Sq of S row positions).
    k, v: (Hkv, sum P_i, D), prompt i's keys at cu_kv[i]:cu_kv[i+1] (absolute positions 0..P_i-1).
    window: a query at absolute position t sees prompt keys at positions > t - window.
    q_pos: (B,) int, each row's own offset added to its queries' positions (rows packed back to back, every token a
    one-query row: its place in its row), None: 0.
    rule: a rows rule (:func:`_mm`): each query's result whatever the other rows of its prompt.
    Returns (out (B, Sq, H, D) fp32, lse (B, Sq, H) fp32).
    """
    B, Sq, H, D = q.shape
    Hkv = k.shape[0]
    G = H // Hkv
    out = q.new_zeros(B, Sq, H, D, dtype=torch.float32)  # (B, Sq, H, D)
    lse = q.new_full((B, Sq, H), float("-inf"), dtype=torch.float32)
    rows, kvs = cu_rows.tolist(), cu_kv.tolist()
    for i in range(len(rows) - 1):  # the oracle may loop; the Triton kernel is one launch
        r0, r1, k0, k1 = rows[i], rows[i + 1], kvs[i], kvs[i + 1]
        n, P = r1 - r0, k1 - k0
        if n == 0 or P == 0:
            continue
        # (Hkv, n·Sq·G, D): every query of the prompt's rows for one kv head, one GEMM operand
        qg = q[r0:r1].reshape(n, Sq, Hkv, G, D).permute(2, 0, 1, 3, 4).reshape(Hkv, n * Sq * G, D)
        s = _scores(qg, k[:, k0:k1], scale, softcap, rule)  # (Hkv, n·Sq·G, P)
        vis = None  # no window: every prompt key is visible to every query
        if window is not None:
            t = P + q_pos0 + torch.arange(Sq, device=q.device)[None, :]  # (1, Sq) absolute query positions
            if q_pos is not None:
                t = t + q_pos[r0:r1, None].to(q.device)  # (n, Sq)
            visible = torch.arange(P, device=q.device) > t[..., None] - window  # (1 or n, Sq, P)
            vis = visible[None, :, :, None, :].expand(Hkv, n, Sq, G, P).reshape(Hkv, n * Sq * G, P)
        o, l = _softmax_parts(s, vis, v[:, k0:k1].float(), rule)  # (Hkv, n·Sq·G, D), (Hkv, n·Sq·G)
        out[r0:r1] = o.view(Hkv, n, Sq, G, D).permute(1, 2, 0, 3, 4).reshape(n, Sq, H, D)
        lse[r0:r1] = l.view(Hkv, n, Sq, G).permute(1, 2, 0, 3).reshape(n, Sq, H)
    return out, lse


def response_part(q, k, v, lengths=None, *, scale: float, softcap: float | None = None,
                  window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's causal attention over its own keys.

    q: (B, Sq, H, D), the last Sq of the row's S positions; k, v: (B, S, Hkv, D); lengths: (B,) real
    positions per row (None: S). Query j (row position t = S - Sq + j) sees keys u <= t, u < lengths[b],
    t - u < window. Returns (out (B, Sq, H, D) fp32, lse (B, Sq, H) fp32).
    """
    B, Sq, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    dev = q.device
    qh = q.transpose(1, 2)  # (B, H, Sq, D)
    kh = k.transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, S, D): query head h reads kv head h // G
    vh = v.transpose(1, 2).repeat_interleave(G, dim=1)
    s = _scores(qh, kh, scale, softcap)  # (B, H, Sq, S)
    t = S - Sq + torch.arange(Sq, device=dev)  # (Sq,) row positions of the queries
    u = torch.arange(S, device=dev)
    vis = u[None, :] <= t[:, None]  # (Sq, S)
    if window is not None:
        vis &= t[:, None] - u[None, :] < window
    L = torch.full((B,), S, device=dev) if lengths is None else lengths.to(dev)
    real = u[None, :] < L[:, None]  # (B, S): keys before the row's end
    vis = vis[None] & real[:, None, :]  # (B, Sq, S)
    # values after the row's end are zeroed, not only masked: 0 · NaN would still reach the sum
    vh = vh.float().masked_fill(~real[:, None, :, None], 0.0)  # (B, H, S, D)
    o, l = _softmax_parts(s, vis[:, None], vh)  # (B, H, Sq, D), (B, H, Sq)
    return o.transpose(1, 2), l.transpose(1, 2)  # (B, Sq, H, D), (B, Sq, H)


def response_part_varlen(q, k, v, cu_seqlens, *, scale: float, softcap: float | None = None,
                         window: int | None = None, out_dtype: torch.dtype = torch.float32, rule=None):
    """:func:`response_part` on rows packed back to back, no padding: each row's causal attention over its
    own keys.

    q: (T, H, D), k, v: (T, Hkv, D); cu_seqlens: (n+1,) row i's tokens at cu_seqlens[i]:cu_seqlens[i+1]
    (row positions 0..L_i-1 there). Query t of a row sees the row's keys u <= t, t - u < window. ``rule``: a
    rows rule (:func:`_mm`: contiguous operands, so a row's result does not depend on where it sits in the pack).
    Returns (out (T, H, D) in ``out_dtype``, fp32 by default, lse (T, H) fp32). Every query sees at least
    itself, so no lse is -inf.
    """
    T, H, D = q.shape
    G = H // k.shape[1]
    out = q.new_zeros(T, H, D, dtype=torch.float32)  # (T, H, D)
    lse = q.new_full((T, H), float("-inf"), dtype=torch.float32)
    cu = cu_seqlens.tolist()
    for a, b in zip(cu[:-1], cu[1:]):  # the oracle may loop over rows; the Triton kernel is one launch
        if b == a:
            continue
        kh = k[a:b].transpose(0, 1).repeat_interleave(G, dim=0)  # (H, L, D): query head h reads kv head h // G
        vh = v[a:b].transpose(0, 1).repeat_interleave(G, dim=0).float()
        s = _scores(q[a:b].transpose(0, 1), kh, scale, softcap, rule, own_shape=True)  # (H, L, L)
        t = torch.arange(b - a, device=q.device)
        vis = t[None, :] <= t[:, None]  # (L, L): causal
        if window is not None:
            vis &= t[:, None] - t[None, :] < window
        o, l = _softmax_parts(s, vis, vh, rule, own_shape=True)  # (H, L, D), (H, L)
        out[a:b], lse[a:b] = o.transpose(0, 1), l.transpose(0, 1)
    return out.to(out_dtype), lse


def merge(out_a, lse_a, out_b, lse_b, dtype: torch.dtype, rule=None) -> torch.Tensor:
    """Two parts' (.., D) fp32 outputs and (..) fp32 log-sum-exps -> the soft-max over both key sets, in
    fp32, rounded once to ``dtype``. Both parts empty (lse -inf): 0. ``rule``: a rows rule (each exp alike)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, 0.0)
    exp = torch.exp if rule is None else (lambda x: each_alike(torch.exp, x))
    wa, wb = exp(lse_a - m)[..., None], exp(lse_b - m)[..., None]  # (.., 1) fp32
    den = wa + wb
    return ((out_a * wa + out_b * wb) / torch.where(den > 0, den, 1.0)).to(dtype)


def cascade_attention(q, k_suffix, v_suffix, k_prompt, v_prompt, cu_rows, cu_kv, lengths=None, *, scale: float,
                      softcap: float | None = None, window: int | None = None) -> torch.Tensor:
    """The rows' attention over prompt ⊕ own keys, in the cascade form -> (B, Sq, H, D) in q.dtype.

    q: (B, Sq, H, D); k/v_suffix: (B, S, Hkv, D), the rows' own keys (right-padded; ``lengths`` (B,) real
    positions, None: all S); k/v_prompt: (Hkv, sum P_i, D) with cu_kv (n+1,); cu_rows (n+1,): rows per
    prompt (see the module docstring). Equal to :func:`rmfast.kernels.torch_twins.shared_prefix_attention`
    of each prompt's rows to fp32 rounding, at every real position.
    """
    S, Sq = k_suffix.shape[1], q.shape[1]
    out_r, lse_r = response_part(q, k_suffix, v_suffix, lengths, scale=scale, softcap=softcap, window=window)
    if k_prompt.shape[1] == 0:
        return out_r.to(q.dtype)
    out_p, lse_p = prompt_part(q, k_prompt, v_prompt, cu_rows, cu_kv, q_pos0=S - Sq, scale=scale, softcap=softcap,
                               window=window)
    return merge(out_p, lse_p, out_r, lse_r, q.dtype)


def cascade_attention_varlen(q, k, v, k_prompt, v_prompt, cu_q, cu_kv, cu_seqlens, *, scale: float,
                             softcap: float | None = None, window: int | None = None, rule=None,
                             q_pos: torch.Tensor | None = None, response_part=None) -> torch.Tensor:
    """Rows packed back to back with no padding over prompt ⊕ own keys -> (T, H, D) in q.dtype.

    q: (T, H, D), k, v: (T, Hkv, D): rows grouped by prompt, row r's tokens at cu_seqlens[r]:cu_seqlens[r+1];
    prompt i's rows' tokens at cu_q[i]:cu_q[i+1] (n+1,), its keys k/v_prompt (Hkv, sum P_i, D) at
    cu_kv[i]:cu_kv[i+1]. ``window``: a token at place t of its row (absolute position P_i + t) sees its row's keys
    u > t - window and its prompt's keys at positions > P_i + t - window. Equal to :func:`cascade_attention` of the
    same rows right-padded, to fp32 rounding, at every real position. ``q_pos``: (T,) each token's place in its
    row where the caller has it (else worked out from ``cu_seqlens``; only a window reads it). ``response_part``:
    another form of the rows' own part, ``(q, k, v, cu_seqlens) -> (out fp32, lse)`` (None: the one here).
    """
    if response_part is None:
        out_r, lse_r = response_part_varlen(q, k, v, cu_seqlens, scale=scale, softcap=softcap, window=window,
                                            rule=rule)  # (T, H, D), (T, H)
    else:
        out_r, lse_r = response_part(q, k, v, cu_seqlens)
    if k_prompt.shape[1] == 0:
        return out_r.to(q.dtype)
    if window is not None and q_pos is None:  # each token's place in its row (its prompt part's queries: P_i + that)
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        q_pos = torch.arange(q.shape[0], device=q.device) - torch.repeat_interleave(cu_seqlens[:-1].long(), lens.long())
    out_p, lse_p = prompt_part(q[:, None], k_prompt, v_prompt, cu_q, cu_kv, scale=scale, softcap=softcap,
                               window=window, rule=rule, q_pos=q_pos)
    return merge(out_p[:, 0], lse_p[:, 0], out_r, lse_r, q.dtype, rule)
