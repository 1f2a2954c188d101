"""The decoder layer: ONE pure function of tensors, run eagerly or compiled, on CPU or CUDA.

Every fast-path architecture (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 1/2/3) is this one function with
different tensors (:class:`LayerWeights`) and constants (:class:`LayerConsts`), both built once
from :class:`rmfast.fast.arch.ArchSpec` by :func:`build_layers`. The engine runs every layer,
the prompt pass included, through :func:`decoder_layer`:

    h ─ rms ─ q|k|v GEMM ─ [q/k rms] ─ RoPE ─ attention(prompt K/V ⊕ own suffix) ─ o GEMM ─ [rms] ─ + h
      ─ rms ─ gate|up GEMM ─ act(gate)·up ─ down GEMM ─ [rms] ─ + h          ([ ]: some architectures)

Why a pure function: on CPU the GEMMs run near the machine's peak and the time left goes to
~40 small elementwise passes per layer. Written over plain tensors, ``torch.compile`` builds one
graph per batch shape that all layers share (weights are *arguments*) and inductor fuses each
run of elementwise work into one loop. Eagerly, the same function is the CUDA path (GEMMs and the
Triton attention kernel dominate there) and the fallback where compiling is impossible.

Attention is pluggable, chosen by the type of the ``prompt`` argument (:func:`attend`):
:class:`PromptKV` — the prompt's (Hkv, P, D) keys/values through :func:`rmfast.fast.ops.shared_prefix_attention`
(the Triton kernel on CUDA, the ``bmm`` reference on CPU; P = 0 for the prompt pass itself) — or
:class:`PackedPrompt` — the block-diagonal CPU form (:mod:`rmfast.kernels.blockdiag_attention`) — or
:class:`CascadePrompt` — the cascade form, every prompt of a batch in one call (:func:`rmfast.fast.ops.cascade_attention`) —
or :class:`PackedPrompts` — several prompts' own passes packed in one batch, the cascade's varlen response part.

Numerics, the same eager and compiled: Hugging Face's op order and rounding points. Every op
rounds its output to the model dtype, as HF eager does (RMSNorm statistics and the softmax in fp32,
as HF's explicit casts say). Eager, that is simply torch; :func:`compile_layer` turns on inductor's
``emulate_precision_casts``, so its fused loops round after each op too instead of keeping fp32
between ops. (The alternative, every elementwise run written in fp32 and rounded once, measured no
closer to fp32 truth on SmolLM2 bf16 scans — the GEMM outputs and the bf16 residual stream dominate
the error — and cost the eager paths, CUDA's included, extra cast passes.) What still differs between
eager and compiled is fp32 summation order inside fused reductions (RMSNorm means, attention sums).
In fp32 the layer is HF's arithmetic; the attention forms' own roundings are documented with them.

Example:
    >>> import torch
    >>> c = LayerConsts(n_heads=2, n_kv_heads=1, head_dim=4, eps=1e-6, gemma_norm=False, scale=0.5, softcap=None,
    ...                 act="silu", qk_norm=False, sandwich=False, window=None, rope_key="default")
    >>> w = LayerWeights(torch.ones(8), (torch.randn(16, 8),), None, None, torch.randn(8, 8), None, None,
    ...                  torch.ones(8), (torch.randn(12, 8),), None, torch.randn(8, 6), None, None)
    >>> h = torch.randn(3, 2, 8); cos = torch.ones(2, 4); sin = torch.zeros(2, 4)
    >>> prompt = PromptKV(torch.zeros(1, 0, 4), torch.zeros(1, 0, 4))  # no prompt keys
    >>> decoder_layer(h, w, cos, sin, prompt, c, 1).shape
    torch.Size([3, 1, 8])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import ops
from ..cpu import compile_here
from .arch import ACTIVATIONS

@dataclass(frozen=True)
class LayerConsts:
    """The Python constants of a layer (torch.compile specialises on the ones the layer reads).

    Attributes:
        n_heads, n_kv_heads, head_dim: attention shape.
        eps: RMSNorm epsilon.
        gemma_norm: Gemma's RMSNorm ``(x̂ · (1 + w)).to(dtype)`` instead of Llama's ``w · x̂.to(dtype)``.
        scale: score scale (1/sqrt(head_dim), or Gemma's query_pre_attn_scalar**-0.5).
        softcap: Gemma 2 attention-logit softcap, or None.
        act: "silu" | "gelu_tanh" | "gelu" | "relu" (the MLP's gate activation).
        qk_norm: RMSNorm over head_dim on q and k before RoPE (Gemma 3, Qwen3; in the model's
            norm style, ``gemma_norm``).
        sandwich: Gemma 2/3 norms on the attention and MLP outputs.
        window: sliding-window length, or None (read by :class:`PromptKV` attention only; the
            packed form has it in its masks, so compiled layers differing only here share a graph).
        rope_key: which rotary table the layer uses (Gemma 3: local or global); the caller picks
            cos/sin with it.
        fused: norms (the attention residual's add with the MLP's norm), RoPE and SiLU·up each as one Triton
            kernel (:mod:`rmfast.kernels.triton_elementwise`) instead of torch's chains of small ops
            (:func:`build_layers`' ``fused``).
    """

    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    gemma_norm: bool
    scale: float
    softcap: float | None
    act: str
    qk_norm: bool
    sandwich: bool
    window: int | None
    rope_key: str
    fused: bool = False  # the elementwise work (norms, RoPE, SiLU·up) as Triton kernels: CUDA, eager layer only


class LayerWeights(NamedTuple):
    """A layer's tensors, the model's own (norm weights as stored: :func:`rmfast.fast.ops.rmsnorm` applies them).

    Projections are tuples: fused ``(W_qkv,)`` / ``(W_gate_up,)`` (one GEMM each, a copy of those
    weights) or the model's own ``(W_q, W_k, W_v)`` / ``(W_gate, W_up)`` (no copy).
    """

    norm_in: torch.Tensor  # (Dm,)
    w_qkv: tuple[torch.Tensor, ...]  # (H·D + 2·Hkv·D, Dm) fused, or (H·D, Dm), (Hkv·D, Dm), (Hkv·D, Dm)
    b_qkv: tuple[torch.Tensor, ...] | None  # biases, same split (Qwen2; Qwen3 with attention_bias)
    qk_norm: torch.Tensor | None  # (H + Hkv, D): q_norm for the q heads, k_norm for the k heads
    w_o: torch.Tensor  # (Dm, H·D)
    b_o: torch.Tensor | None
    norm_post_attn: torch.Tensor | None  # (Dm,) (sandwich)
    norm_pre_mlp: torch.Tensor  # (Dm,)
    w_gate_up: tuple[torch.Tensor, ...]  # (2I, Dm) fused (gate then up), or (I, Dm), (I, Dm)
    b_gate_up: tuple[torch.Tensor, ...] | None
    w_down: torch.Tensor  # (Dm, I)
    b_down: torch.Tensor | None
    norm_post_mlp: torch.Tensor | None  # (Dm,) (sandwich)


class PromptKV(NamedTuple):
    """Attention over the prompt's K/V as stored: :func:`rmfast.fast.ops.shared_prefix_attention`
    (Triton on CUDA, the per-kv-head ``bmm`` reference on CPU). P may be 0 (the prompt pass).
    ``form``: the engine's attention form (:data:`rmfast.fast.ops.ATTENTION_FORMS`; None: the device's)."""

    k: torch.Tensor  # (Hkv, P, D)
    v: torch.Tensor  # (Hkv, P, D)
    form: str | None = None


class PackedPrompt(NamedTuple):
    """Attention over the block-diagonal prompt K/V (:func:`~rmfast.kernels.blockdiag_attention.pack_prefix`),
    for all S suffix positions (:func:`~rmfast.kernels.blockdiag_attention.visibility_bias` with Sq = S)."""

    k_bd: torch.Tensor  # (H·P, H·D)
    v_bd: torch.Tensor  # (H·D, H·P)
    pre_bias: torch.Tensor | None  # (S, 1, P) fp32, 0 / -inf; None: every prompt key visible
    suf_bias: torch.Tensor  # (S, 1, S) fp32, 0 / -inf


class MultiPrompt(NamedTuple):
    """Rows of several prompts in one batch: the first ``rows[0]`` rows attend to ``parts[0]``, the next
    ``rows[1]`` to ``parts[1]``, ... (each its own :class:`PromptKV`, of its own length). The projections
    and the MLP run over all rows at once; only attention is per prompt (:func:`attend`)."""

    parts: tuple  # (PromptKV, ...)
    rows: tuple  # (int, ...): consecutive rows per part, summing to B


class CascadePrompt(NamedTuple):
    """The cascade form (:func:`rmfast.fast.ops.cascade_attention`) for the rows of one or several prompts in
    ONE call: the prompt part over each prompt's K/V, the response part over each row's own keys (ragged:
    ``lengths``), merged by log-sum-exp. Rows are grouped by prompt, as in :class:`MultiPrompt`."""

    k: torch.Tensor  # (Hkv, sum P_i, D): the prompts' K/V, concatenated along positions
    v: torch.Tensor  # (Hkv, sum P_i, D)
    cu_kv: torch.Tensor  # (n+1,) int32: prompt i's keys at cu_kv[i]:cu_kv[i+1]
    cu_rows: torch.Tensor  # (n+1,) int32: prompt i's rows at cu_rows[i]:cu_rows[i+1]
    max_rows: int  # the most rows of one prompt (sizes the kernel's grid)
    lengths: torch.Tensor | None  # (B,) int32 real positions per row (pads after them), None: all S
    triton: bool  # the Triton kernels, else the torch twin


class PackedPrompts(NamedTuple):
    """The prompt pass of several prompts in ONE batch (:func:`rmfast.fast.wave.encode_prompts`): the layer's
    h is (1, T, Dm), the prompts' tokens back to back with no padding (the GEMMs, norms and MLP see only
    real tokens). Attention is each prompt's causal attention over its own tokens, run on the packed q/k/v
    as they are (:func:`rmfast.fast.ops.varlen_causal_attention`: the cascade's response part in the varlen
    layout, prompt i's tokens at ``cu_seqlens[i]:cu_seqlens[i+1]``): no scatter to padded rows, no gather."""

    cu_seqlens: torch.Tensor  # (n+1,) int32 on the device
    max_len: int  # the longest prompt (sizes the Triton kernel's grid)
    triton: bool  # the Triton kernel, else the torch twin


class PackedRows(NamedTuple):
    """The rows' pass with the rows packed back to back, no padding (:func:`rmfast.fast.engine.score_prompts`
    in the cascade form): the layer's h is (1, T, Dm), row r's tokens at ``cu_seqlens[r]:cu_seqlens[r+1]``,
    rows grouped by prompt, prompt i's rows' tokens at ``cu_q[i]:cu_q[i+1]``. Attention is the cascade on the
    packed q/k/v as they are (:func:`rmfast.fast.ops.cascade_attention_varlen`): each token over its prompt's
    K/V and its row's own keys (causal), a sliding window by the token's own position (``q_pos``), merged; the
    GEMMs, norms and MLP see only real tokens."""

    k: torch.Tensor  # (Hkv, sum P_i, D): the prompts' K/V, concatenated along positions
    v: torch.Tensor  # (Hkv, sum P_i, D)
    cu_kv: torch.Tensor  # (n+1,) int32: prompt i's keys at cu_kv[i]:cu_kv[i+1]
    cu_q: torch.Tensor  # (n+1,) int32: prompt i's rows' tokens at cu_q[i]:cu_q[i+1]
    max_q: int  # the most tokens of one prompt's rows (sizes the prompt kernel's grid)
    cu_seqlens: torch.Tensor  # (B+1,) int32: row r's tokens
    max_len: int  # the longest row (sizes the response kernel's grid)
    q_pos: torch.Tensor  # (T,) int32: each token's place in its row (its position is its prompt's length + that)
    triton: bool  # the Triton kernels, else the torch twin


# ---------------------------------------------------------------------------------- building


def build_layers(spec, fuse: bool, fused: bool = False) -> list[tuple[LayerWeights, LayerConsts]]:
    """Per layer of ``spec`` (:class:`rmfast.fast.arch.ArchSpec`): its weights and constants.

    fused: the layer's elementwise work as Triton kernels (:attr:`LayerConsts.fused`; the engine's rule:
    :func:`rmfast.fast.engine.fused_elementwise`).

    fuse: concatenate q|k|v and gate|up into one GEMM weight each. That costs a copy of those
    weights (~2/3 of a layer's), so the engine does it on CPU (small models; one GEMM call instead of
    three saves measurable overhead there) and not on CUDA (big models, big GEMMs).
    """
    return [(_weights(spec, L, fuse), _consts(spec, L, fused)) for L in spec.layers]


def _weights(spec, L, fuse: bool) -> LayerWeights:
    H, Hkv, D = spec.n_heads, spec.n_kv_heads, spec.head_dim
    w_qkv, b_qkv = _group(L.qkv, fuse, (H * D, Hkv * D, Hkv * D))
    inter = L.down.in_features
    w_gu, b_gu = _group(L.gate_up, fuse, (inter, inter))
    qk_norm = None
    if L.q_norm is not None:
        qk_norm = torch.cat([L.q_norm.weight.expand(H, -1), L.k_norm.weight.expand(Hkv, -1)])  # (H + Hkv, D)
    return LayerWeights(
        norm_in=L.input_norm.weight,
        w_qkv=w_qkv,
        b_qkv=b_qkv,
        qk_norm=qk_norm,
        w_o=L.o_proj.weight,
        b_o=L.o_proj.bias,
        norm_post_attn=None if L.post_attn_norm is None else L.post_attn_norm.weight,
        norm_pre_mlp=L.pre_mlp_norm.weight,
        w_gate_up=w_gu,
        b_gate_up=b_gu,
        w_down=L.down.weight,
        b_down=L.down.bias,
        norm_post_mlp=None if L.post_mlp_norm is None else L.post_mlp_norm.weight,
    )


def _group(mods: tuple, fuse: bool, sizes: tuple[int, ...]) -> tuple[tuple, tuple | None]:
    """Weights and biases (or None) of a projection group (q|k|v or gate|up) in the layout asked for.

    Stored separately: concatenated when fusing (a copy), else as they are. Stored fused (Phi-3):
    the model's own tensor when fusing (no copy), else row slices of it (views, no copy either).
    """
    ws = [m.weight for m in mods]
    bs = [m.bias for m in mods]
    if len(mods) == 1 and not fuse:
        ws = list(ws[0].split(sizes))
        bs = list(bs[0].split(sizes)) if bs[0] is not None else [None]
    elif len(mods) > 1 and fuse:
        ws = [torch.cat(ws)]
        bs = [torch.cat(bs)] if bs[0] is not None else [None]
    return tuple(ws), (tuple(bs) if bs[0] is not None else None)


def _consts(spec, L, fused: bool = False) -> LayerConsts:
    return LayerConsts(
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        head_dim=spec.head_dim,
        eps=spec.norm_eps,
        gemma_norm=spec.gemma_norm,
        scale=L.scale,
        softcap=L.softcap,
        act=ACTIVATIONS[spec.act],
        qk_norm=L.q_norm is not None,
        sandwich=L.post_attn_norm is not None,
        window=L.window,
        rope_key=L.rope_key,
        fused=fused,
    )


def compile_layer(fn=None):
    """``torch.compile`` of :func:`decoder_layer` (or of ``fn``, an own-code copy of it) that rounds
    after each op as eager does (``emulate_precision_casts``; see the module docstring)."""
    return compile_here(fn or decoder_layer, emulate_precision_casts=True)


# ---------------------------------------------------------------------------------- pieces


def _rms(x: torch.Tensor, w: torch.Tensor, c: LayerConsts) -> torch.Tensor:
    """The model's RMSNorm over the last dim, with HF's cast points (:func:`rmfast.fast.ops.rmsnorm`; ``c.fused``:
    one Triton kernel)."""
    return ops.rmsnorm(x, w, c.eps, gemma_style=c.gemma_norm, triton=c.fused)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, c: LayerConsts) -> torch.Tensor:
    """RoPE, HF's ``x·cos + rotate_half(x)·sin`` (:func:`rmfast.kernels.torch_twins.rope`; ``c.fused``: one Triton
    kernel, the same roundings): x (B, S, n, D), cos/sin (S, Dr), or (B, S, Dr) per row (rows of several prompts
    start at different positions, :class:`MultiPrompt`)."""
    return ops.rope(x, cos, sin, triton=c.fused)


def _linear(x: torch.Tensor, ws: tuple, bs: tuple | None, i: int) -> torch.Tensor:
    return ops.linear(x, ws[i], None if bs is None else bs[i])


def _q_k_v(x, w: LayerWeights, cos, sin, c: LayerConsts, n_out: int):
    """Projections, q/k norm and RoPE: x (B, S, Dm) -> q (B, Sq, H, D), k, v (B, S, Hkv, D).

    Only the last ``Sq = n_out`` positions get queries. k, v are views or fresh tensors; the last layer's
    query input is copied to rows of its own (see below), the one copy for layout's sake.
    """
    B, S, _ = x.shape
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    if len(w.w_qkv) == 1:  # fused: one GEMM, then norm + RoPE over the q|k slab at once
        qkv = _linear(x, w.w_qkv, w.b_qkv, 0).view(B, S, H + 2 * Hkv, D)  # (B, S, H+2Hkv, D)
        qk = qkv[:, :, : H + Hkv]
        if c.qk_norm:
            qk = _rms(qk, w.qk_norm, c)
        qk = _rope(qk, cos, sin, c)  # (B, S, H+Hkv, D); the last layer's extra q rows are < 1%
        return qk[:, S - n_out :, :H], qk[:, :, H:], qkv[:, :, H + Hkv :]
    # contiguous: as a strided view (rows S positions apart) cuBLAS picked a 512x8-tile kernel for it on the H100,
    # 69 ms of a 780 ms 16,128-row scan batch, ~80x its FLOP share (gpu_h100_2026-11-27_e); the copy is B·Dm values
    xq = x[:, S - n_out :].contiguous()  # (B, Sq, Dm)
    q = _linear(xq, w.w_qkv, w.b_qkv, 0).view(B, n_out, H, D)  # (B, Sq, H, D)
    k = _linear(x, w.w_qkv, w.b_qkv, 1).view(B, S, Hkv, D)  # (B, S, Hkv, D)
    v = _linear(x, w.w_qkv, w.b_qkv, 2).view(B, S, Hkv, D)
    if c.qk_norm:
        q, k = _rms(q, w.qk_norm[:H], c), _rms(k, w.qk_norm[H:], c)
    if n_out == S:  # queries at every position: q and k roped together (c.fused: one launch, not two)
        q, k = ops.rope_qk(q, k, cos, sin, triton=c.fused)
        return q, k, v
    return _rope(q, cos[..., S - n_out :, :], sin[..., S - n_out :, :], c), _rope(k, cos, sin, c), v


def attend(q, k, v, prompt: PromptKV | PackedPrompt | MultiPrompt | CascadePrompt | PackedPrompts | PackedRows,
           c: LayerConsts) -> torch.Tensor:
    """q (B, Sq, H, D) over the prompt's keys ⊕ the row's own k, v (B, S, Hkv, D) -> (B, Sq, H·D).

    The queries are the last Sq of the S suffix positions. Both forms soft-max in fp32 over prompt ⊕
    suffix keys; in bf16 the reference/Triton form rounds scores after each op as HF does, the packed
    form keeps the scaled scores fp32 (see each). A :class:`MultiPrompt` runs each prompt's rows
    against its own K/V (a row's attention never depends on the other rows); a :class:`CascadePrompt` runs
    every prompt's rows in one call, in fp32 soft-max tiles merged once (``rmfast.kernels.cascade_torch``);
    :class:`PackedPrompts` (several prompts' own passes, packed) runs the cascade's response part on them in the
    varlen layout (no padding); :class:`PackedRows` (rows packed, no padding) the whole cascade in that layout.
    """
    B, Sq, H, D = q.shape
    if isinstance(prompt, PackedRows):  # B = 1, Sq = S = T packed tokens
        a = ops.cascade_attention_varlen(q[0], k[0], v[0], prompt.k, prompt.v, prompt.cu_q, prompt.cu_kv, prompt.max_q,
                                         prompt.cu_seqlens, prompt.max_len, scale=c.scale, softcap=c.softcap,
                                         window=c.window, q_pos=prompt.q_pos, triton=prompt.triton)  # (T, H, D)
        return a.view(1, Sq, H * D)
    if isinstance(prompt, PackedPrompts):  # B = 1, Sq = S = T packed tokens
        a = ops.varlen_causal_attention(q[0], k[0], v[0], prompt.cu_seqlens, prompt.max_len, scale=c.scale,
                                        softcap=c.softcap, window=c.window, triton=prompt.triton)  # (T, H, D)
        return a.view(1, Sq, H * D)
    if isinstance(prompt, CascadePrompt):
        a = ops.cascade_attention(
            q, k, v, prompt.k, prompt.v, prompt.cu_rows, prompt.cu_kv, prompt.lengths, max_rows=prompt.max_rows,
            scale=c.scale, softcap=c.softcap, window=c.window, triton=prompt.triton,
        )  # (B, Sq, H, D)
        return a.reshape(B, Sq, H * D)
    if isinstance(prompt, MultiPrompt):
        out, r0 = [], 0
        for part, n in zip(prompt.parts, prompt.rows):
            out.append(attend(q[r0 : r0 + n], k[r0 : r0 + n], v[r0 : r0 + n], part, c))  # (n, Sq, H·D)
            r0 += n
        return torch.cat(out)
    if isinstance(prompt, PackedPrompt):
        pre = None if prompt.pre_bias is None else prompt.pre_bias[-Sq:]  # (Sq, 1, P)
        return ops.shared_prefix_attention_blockdiag(
            q, k, v, prompt.k_bd, prompt.v_bd, scale=c.scale, softcap=c.softcap, pre_bias=pre, suf_bias=prompt.suf_bias[-Sq:]
        )
    # ops' layouts: (B, H, Sq, D) queries, (B, Hkv, S, D) suffix K/V — strided views, no copies.
    a = ops.shared_prefix_attention(
        q.transpose(1, 2), prompt.k, prompt.v, k.transpose(1, 2), v.transpose(1, 2),
        scale=c.scale, softcap=c.softcap, window=c.window, form=prompt.form,
    )  # (B, Sq, H, D)
    return a.reshape(B, Sq, H * D)


def _mlp(x: torch.Tensor, w: LayerWeights, c: LayerConsts) -> torch.Tensor:
    """Gated MLP, HF's ``down(act(gate(x)) · up(x))``: x (B, Sq, Dm) -> (B, Sq, Dm)."""
    if len(w.w_gate_up) == 1:
        gu = _linear(x, w.w_gate_up, w.b_gate_up, 0)  # (B, Sq, 2I): gate then up
        i = gu.shape[-1] // 2
        g, u = gu[..., :i], gu[..., i:]
    else:
        g, u = _linear(x, w.w_gate_up, w.b_gate_up, 0), _linear(x, w.w_gate_up, w.b_gate_up, 1)  # (B, Sq, I)
    return ops.linear(ops.gated_act(g, u, c.act, triton=c.fused), w.w_down, w.b_down)


# ---------------------------------------------------------------------------------- the layer


def decoder_layer(
    h: torch.Tensor,
    w: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
    prompt: PromptKV | PackedPrompt | MultiPrompt | CascadePrompt | PackedPrompts | PackedRows,
    c: LayerConsts,
    n_out: int,
    collect_kv: bool = False,
    keep: torch.Tensor | None = None,
):
    """One decoder layer over a batch of rows that attend to a shared prompt.

    h: (B, S, Dm) residual stream at absolute positions P..P+S-1 (P: the prompt's length; 0 for the
        prompt pass itself, with an empty :class:`PromptKV`).
    cos, sin: (S, D) RoPE tables for those positions (HF's, in h.dtype; this layer's rope key), or
        (B, S, D) per row (:class:`MultiPrompt` batches: each prompt's rows start after their own prompt).
    prompt: the prompt's K/V for this layer, in the form that picks the attention (:func:`attend`).
    n_out: positions to return (the last n_out); the last layer needs only the read positions.
    collect_kv: also return this layer's roped keys and values (B, S, Hkv, D) (the prompt pass).
    keep: (R,) positions to return instead (packed rows, B = 1, n_out = S: the last layer's each row's final token):
        attention runs over every position, the output projection, the residual and the MLP over those R only.
    Returns (B, n_out, Dm) (with ``keep``: (1, R, Dm)), or (that, k, v) with collect_kv.
    """
    S = h.shape[1]
    q, k, v = _q_k_v(_rms(h, w.norm_in, c), w, cos, sin, c, n_out)  # (B, Sq, H, D), (B, S, Hkv, D) x2
    a = attend(q, k, v, prompt, c)  # (B, Sq, H·D)
    if keep is not None:  # gathers are copies: each kept token's arithmetic is what it was
        a, h = a[:, keep], h[:, keep]  # (1, R, H·D), (1, R, Dm)
        S = n_out = a.shape[1]
    a = ops.linear(a, w.w_o, w.b_o)  # (B, Sq, Dm)
    if c.sandwich:
        a = _rms(a, w.norm_post_attn, c)
    # h + a and the MLP's input norm (c.fused: one kernel, the same roundings)
    h, x = ops.add_rmsnorm(h[:, S - n_out :], a, w.norm_pre_mlp, c.eps, gemma_style=c.gemma_norm, triton=c.fused)
    m = _mlp(x, w, c)  # (B, Sq, Dm)
    if c.sandwich:
        m = _rms(m, w.norm_post_mlp, c)
    return (h + m, k, v) if collect_kv else h + m
