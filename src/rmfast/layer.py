"""One decoder layer as a pure function of tensors: the CPU path that ``torch.compile`` fuses.

Why a second form of the layer: on CPU the engine's GEMMs run near the machine's peak, and
the time left goes to ~40 small elementwise passes per layer (casts, RMSNorm statistics, RoPE,
the softmax, SwiGLU, residual adds), each a round trip through memory. Written as one function
of plain tensors, the whole layer compiles once (weights are *arguments*, so all layers of a
model share one graph per batch shape) and inductor fuses each run of elementwise work into
one vectorised loop, leaving the GEMMs to oneDNN. The attention uses the block-diagonal GEMM
form (:mod:`rmfast.kernels.blockdiag_attention`), whose layouts need no permute copies.

Numerics: statistics, softmax and activations in fp32 inside each fused loop, rounded to the
model dtype once per loop (HF eager rounds after every op). In fp32 this equals the reference to
float32 reassociation; in bf16 it is at least as close to fp32 truth (tests check ranks).

The eager engine path (:meth:`rmfast.engine.Engine._run_layers`) stays the reference layout and
the CUDA path; this one serves batched CPU scoring when ``Engine(compile=True)``.

Example:
    >>> import torch
    >>> c = LayerConsts(n_heads=2, n_kv_heads=1, head_dim=4, eps=1e-6, scale=0.5, softcap=None, act="silu",
    ...                 qk_norm=False, sandwich=False)
    >>> w = LayerWeights(torch.ones(8), torch.randn(16, 8), None, None, torch.randn(8, 8), None, None,
    ...                  torch.ones(8), torch.randn(12, 8), torch.randn(8, 6), None)
    >>> h = torch.randn(3, 2, 8); cos = torch.ones(2, 4); sin = torch.zeros(2, 4)
    >>> k_bd, v_bd = torch.zeros(0, 8), torch.zeros(8, 0)
    >>> decoder_layer(h, w, k_bd, v_bd, cos, sin, None, None, c, 1).shape
    torch.Size([3, 1, 8])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .kernels.blockdiag_attention import shared_prefix_attention_blockdiag

#: config activation names -> the one this module computes (others: no compiled path).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


@dataclass(frozen=True)
class LayerConsts:
    """The Python constants of a layer (hashable: torch.compile specialises on them).

    Attributes:
        n_heads, n_kv_heads, head_dim: attention shape.
        eps: RMSNorm epsilon.
        scale: score scale (1/sqrt(head_dim), or Gemma's query_pre_attn_scalar**-0.5).
        softcap: Gemma 2 attention-logit softcap, or None.
        act: "silu" | "gelu_tanh" | "gelu" (the MLP's gate activation).
        qk_norm: Gemma 3's RMSNorm over head_dim on q and k before RoPE.
        sandwich: Gemma 2/3 norms on the attention and MLP outputs.
    """

    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    scale: float
    softcap: float | None
    act: str
    qk_norm: bool
    sandwich: bool


class LayerWeights(NamedTuple):
    """A layer's tensors. Norm weights are *effective* fp32 multipliers (Gemma's ``1 + w`` folded in)."""

    norm_in: torch.Tensor  # (Dm,) fp32
    w_qkv: torch.Tensor  # (H·D + 2·Hkv·D, Dm): q, k, v stacked
    b_qkv: torch.Tensor | None
    qk_norm: torch.Tensor | None  # (H + Hkv, D) fp32: q_norm for the q heads, k_norm for the k heads
    w_o: torch.Tensor  # (Dm, H·D)
    b_o: torch.Tensor | None
    norm_post_attn: torch.Tensor | None  # (Dm,) fp32 (sandwich)
    norm_pre_mlp: torch.Tensor  # (Dm,) fp32
    w_gate_up: torch.Tensor  # (2I, Dm): gate then up
    w_down: torch.Tensor  # (Dm, I)
    norm_post_mlp: torch.Tensor | None  # (Dm,) fp32 (sandwich)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32 with an effective fp32 weight, rounded once to x.dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def _act(x: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu":
        return F.silu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return F.gelu(x)


def decoder_layer(
    h: torch.Tensor,
    w: LayerWeights,
    k_bd: torch.Tensor,
    v_bd: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pre_bias: torch.Tensor | None,
    suf_bias: torch.Tensor | None,
    c: LayerConsts,
    n_out: int,
) -> torch.Tensor:
    """One layer over a batch of suffix rows that attend to the packed prompt K/V.

    h: (B, S, Dm) residual stream at absolute positions P..P+S-1.
    k_bd, v_bd: the prompt's K/V for this layer, block-diagonal (:func:`pack_prefix`).
    cos, sin: (S, D) RoPE tables (HF's, in h.dtype).
    pre_bias, suf_bias: visibility masks (:func:`visibility_bias`).
    n_out: positions to return (the last n_out); the last layer needs only the read positions.
    Returns (B, n_out, Dm).
    """
    B, S, Dm = h.shape
    H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
    x = _rms(h, w.norm_in, c.eps)  # (B, S, Dm)
    qkv = F.linear(x, w.w_qkv, w.b_qkv).view(B, S, H + 2 * Hkv, D)  # (B, S, H+2Hkv, D)
    qk = qkv[:, :, : H + Hkv]
    if c.qk_norm:
        qk = _rms(qk, w.qk_norm, c.eps)
    # RoPE on q and k at once: x·cos + rotate_half(x)·sin, with rotate_half written over the
    # (2, D/2) halves so each half is a contiguous vector load (torch.roll compiles to a gather).
    xh = qk.unflatten(-1, (2, D // 2))  # (B, S, H+Hkv, 2, D/2)
    rot = torch.stack([-xh[..., 1, :], xh[..., 0, :]], dim=-2).flatten(-2)  # rotate_half(qk)
    qk = qk * cos[:, None] + rot * sin[:, None]  # (B, S, H+Hkv, D)
    q = qk[:, S - n_out :, :H]  # (B, Sq, H, D)
    k = qk[:, :, H:]  # (B, S, Hkv, D)
    v = qkv[:, :, H + Hkv :]  # (B, S, Hkv, D)
    a = shared_prefix_attention_blockdiag(
        q, k, v, k_bd, v_bd, scale=c.scale, softcap=c.softcap, pre_bias=pre_bias, suf_bias=suf_bias
    )  # (B, Sq, H·D)
    a = F.linear(a, w.w_o, w.b_o)  # (B, Sq, Dm)
    if c.sandwich:
        a = _rms(a, w.norm_post_attn, c.eps)
    h = h[:, S - n_out :] + a
    x = _rms(h, w.norm_pre_mlp, c.eps)
    gu = F.linear(x, w.w_gate_up)  # (B, Sq, 2I)
    i = gu.shape[-1] // 2
    m = F.linear(_act(gu[..., :i], c.act) * gu[..., i:], w.w_down)
    if c.sandwich:
        m = _rms(m, w.norm_post_mlp, c.eps)
    return h + m
