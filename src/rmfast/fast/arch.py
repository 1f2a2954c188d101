"""Per-architecture facts the engine needs, read off a loaded Hugging Face model: the ONE place.

Everything that differs between the fast-path architectures is recorded here (norm style incl.
Gemma's ``1 + w``, attention softcap and scale, sliding windows, q/k norms, sandwich norms, the MLP
activation, fused or separate projection weights, which rotary table each layer uses and how many
dimensions it rotates, RoPE variants whose tables depend on the sequence length). :func:`rmfast.fast.layer.build_layers` turns it, once,
into the tensors and constants of the engine's single decoder-layer function; the embeddings, the
rotary tables and the final norm/heads are the model's own modules and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..dims import model_dims
from ..errors import UserError

# model_type -> family. Anything else takes the generic plain-HF path.
SUPPORTED = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",  # + q/k RMSNorm over head_dim before RoPE (Llama's w·x̂ form, unlike Gemma 3's)
    "phi3": "llama",  # fused qkv_proj / gate_up_proj, partial rotary (Phi-4-mini), LongRoPE
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}

#: families whose RMSNorms (all of them, q/k norms included) compute (1 + w) · x̂ instead of w · x̂
GEMMA_NORM = {"gemma", "gemma2", "gemma3"}

#: model types whose sliding window is one config value for every layer; the others' attention
#: modules carry their own per-layer ``sliding_window`` (None on full-attention layers).
WINDOW_FROM_CONFIG = {"mistral", "phi3"}

#: RoPE types whose tables change with the sequence length (HF recomputes them from the longest
#: position seen): a shared prompt encoded at one length cannot serve rows that cross the limit.
LENGTH_DEPENDENT_ROPE = {"dynamic", "longrope"}


#: config activation names -> the form the decoder layer (rmfast.fast.layer) computes (others: not on the fast path).
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


@dataclass
class LayerSpec:
    """One decoder layer: its modules and attention facts."""

    input_norm: nn.Module
    qkv: tuple[nn.Linear, ...]  # (q_proj, k_proj, v_proj), or Phi-3's one qkv_proj (rows q | k | v)
    o_proj: nn.Linear
    q_norm: nn.Module | None  # Gemma 3, Qwen3: RMSNorm over head_dim before RoPE (the model's norm style)
    k_norm: nn.Module | None
    post_attn_norm: nn.Module | None  # Gemma 2/3 "sandwich" norm on the attention output
    pre_mlp_norm: nn.Module
    post_mlp_norm: nn.Module | None
    gate_up: tuple[nn.Linear, ...]  # (gate_proj, up_proj), or Phi-3's one gate_up_proj (rows gate | up)
    down: nn.Linear
    scale: float
    softcap: float | None
    window: int | None
    rope_key: str  # which rotary table this layer uses (Gemma 3: per layer type)

    def linears(self) -> list[nn.Linear]:
        """Every projection of the layer (q, k, v, o, gate, up, down; fused ones as stored)."""
        return [*self.qkv, self.o_proj, *self.gate_up, self.down]


@dataclass
class ArchSpec:
    """Everything the shared-prompt engine reads from a model."""

    model_type: str
    family: str
    embed: nn.Module
    layers: list[LayerSpec]
    final_norm: nn.Module
    norm_eps: float
    gemma_norm: bool  # (1 + w) · x̂ instead of w · x̂
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary: nn.Module
    rope_keys: tuple[str, ...]
    score_head: nn.Linear | None  # classifiers
    lm_head_weight: torch.Tensor | None  # causal LMs, (V, D)
    final_logit_softcap: float | None
    act: str  # the MLP's activation, a key of ACTIVATIONS
    rope_max_len: int | None = None  # LENGTH_DEPENDENT_ROPE: the longest sequence its tables stay fixed for
    custom_head: object | None = None  # ArmoRM/QRM/URM: rmfast's head object (rmfast.fast.heads)

    @property
    def score_outputs(self) -> int | None:
        """Outputs of the reward head (custom heads: 1), None without one."""
        if self.custom_head is not None:
            return 1
        return None if self.score_head is None else self.score_head.out_features

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos/sin tables (L, rotary_dim) in like.dtype for the given absolute positions, per rope key.

        Uses the model's own rotary module, so RoPE scaling variants (llama3, linear, LongRoPE, ...) are
        HF's. rotary_dim is head_dim, or less with partial rotary (the layer rotates the first
        rotary_dim dimensions of each head). A sequence longer than ``rope_max_len`` is refused: HF
        would switch every position, the shared prompt's included, to other tables.
        """
        if self.rope_max_len is not None and len(positions) and int(positions.max()) + 1 > self.rope_max_len:
            raise UserError(
                f"this model's RoPE ({self.model_type}, length-dependent) changes for sequences longer than "
                f"{self.rope_max_len} tokens, and one here has {int(positions.max()) + 1}: the shared prompt cannot "
                "serve it; shorten the prompt or responses, or use --engine hf"
            )
        pos = positions[None, :]  # (1, L)
        out = {}
        for key in self.rope_keys:
            if key == "default":
                cos, sin = self.rotary(like, pos)
            else:
                cos, sin = self.rotary(like, pos, key)
            out[key] = (cos[0], sin[0])  # (L, head_dim)
        return out


def backbone_of(model: nn.Module) -> nn.Module:
    """The decoder stack (``model.model`` for HF causal LMs and sequence classifiers)."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    return base if base is not None else model


def arch_spec(model: nn.Module) -> ArchSpec | None:
    """Read the engine's facts off ``model``; None when the architecture is not on the fast path
    (an unknown model type, or a layer the decoder-layer function has no form for: an activation
    outside :data:`ACTIVATIONS`, an MLP that is not gate/up/down, q/k norms with their own epsilon,
    a length-dependent RoPE with per-layer-type tables, bidirectional attention: :func:`bidirectional`)."""
    cfg = model.config
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED or bidirectional(cfg):
        return None
    family = SUPPORTED[mt]
    bb = backbone_of(model)
    if not hasattr(bb, "layers") or not hasattr(bb, "embed_tokens"):
        return None
    dims = model_dims(cfg)
    n_heads, n_kv, head_dim = dims.heads, dims.kv_heads, dims.head_dim
    # Gemma 2's attention softcap; Gemma 3's config keeps the key, but HF's Gemma3Attention never applies it (qk-norm
    # took its place): read it there and the engine would compute another model than HF's
    softcap = getattr(cfg, "attn_logit_softcapping", None) if family == "gemma2" else None
    # HF's Gemma 2/3 MLPs read hidden_activation, the others hidden_act.
    act = (getattr(cfg, "hidden_activation", None) if family in ("gemma2", "gemma3") else None) or getattr(
        cfg, "hidden_act", None
    )
    if act not in ACTIVATIONS:
        return None
    norm = bb.norm
    eps = _eps(norm) or cfg.rms_norm_eps
    layers = []
    for i, L in enumerate(bb.layers):
        spec = _layer_spec(cfg, mt, family, i, L, softcap)
        if spec is None or any(n is not None and _eps(n) != eps for n in (spec.q_norm, spec.k_norm)):
            return None
        layers.append(spec)
    rope_max_len = _rope_max_len(bb.rotary_emb, cfg)
    if rope_max_len == -1:
        return None
    score = getattr(model, "score", None)
    lm_head = getattr(model, "lm_head", None)
    return ArchSpec(
        model_type=mt,
        family=family,
        embed=bb.embed_tokens,
        layers=layers,
        final_norm=norm,
        norm_eps=float(eps),
        gemma_norm=family in GEMMA_NORM,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rotary=bb.rotary_emb,
        rope_keys=tuple(sorted({L.rope_key for L in layers})),
        score_head=score if isinstance(score, nn.Linear) else None,
        lm_head_weight=lm_head.weight if isinstance(lm_head, nn.Linear) else None,
        final_logit_softcap=getattr(cfg, "final_logit_softcapping", None),
        act=act,
        rope_max_len=rope_max_len,
        custom_head=getattr(model, "rmfast_head", None),
    )


def bidirectional(cfg) -> bool:
    """Whether the config asks every token to attend to every other (``use_bidirectional_attention``, e.g.
    EmbeddingGemma-style Gemma 3 configs): the engine is causal by construction, so such a model is not on the fast
    path (its scores were silently another model's). HF's Gemma 1/2 keep a causal mask with the flag; refused all
    the same, the plain-HF path being correct either way."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return bool(getattr(cfg, "use_bidirectional_attention", False) or getattr(text, "use_bidirectional_attention", False))


def _eps(norm: nn.Module) -> float | None:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None)


def _layer_spec(cfg, mt: str, family: str, i: int, L: nn.Module, softcap) -> LayerSpec | None:
    """Layer i's modules and attention facts, or None when its MLP has no gate/up/down form."""
    a, mlp = L.self_attn, L.mlp
    if hasattr(mlp, "gate_up_proj"):  # Phi-3: one (2I, Dm) weight, gate rows then up rows
        gate_up = (mlp.gate_up_proj,)
    elif hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj"):
        gate_up = (mlp.gate_proj, mlp.up_proj)
    else:
        return None
    if not hasattr(mlp, "down_proj"):
        return None
    qkv = (a.qkv_proj,) if hasattr(a, "qkv_proj") else (a.q_proj, a.k_proj, a.v_proj)  # Phi-3: rows q | k | v
    sandwich = family in ("gemma2", "gemma3")
    window = getattr(cfg, "sliding_window", None) if mt in WINDOW_FROM_CONFIG else getattr(a, "sliding_window", None)
    return LayerSpec(
        input_norm=L.input_layernorm,
        qkv=qkv,
        o_proj=a.o_proj,
        q_norm=getattr(a, "q_norm", None),
        k_norm=getattr(a, "k_norm", None),
        post_attn_norm=L.post_attention_layernorm if sandwich else None,
        pre_mlp_norm=L.pre_feedforward_layernorm if sandwich else L.post_attention_layernorm,
        post_mlp_norm=L.post_feedforward_layernorm if sandwich else None,
        gate_up=gate_up,
        down=mlp.down_proj,
        scale=float(a.scaling),
        softcap=softcap,
        window=window,
        rope_key=cfg.layer_types[i] if family == "gemma3" else "default",
    )


def _rope_max_len(rotary: nn.Module, cfg) -> int | None:
    """The longest sequence a length-dependent RoPE keeps its tables for (None: any length; -1: a
    length-dependent variant per layer type, not on the fast path). HF's rules
    (``dynamic_rope_update``): LongRoPE switches to its long factors beyond the pretraining length
    ``original_max_position_embeddings``; dynamic NTK recomputes beyond ``max_position_embeddings``."""
    kind = getattr(rotary, "rope_type", "default")
    if isinstance(kind, dict):
        return -1 if set(kind.values()) & LENGTH_DEPENDENT_ROPE else None
    if kind == "longrope":
        params = getattr(cfg, "rope_parameters", None) or {}
        return int(params.get("original_max_position_embeddings") or cfg.original_max_position_embeddings)
    if kind == "dynamic":
        return int(rotary.original_max_seq_len)
    return None
