"""Per-architecture facts the engine needs, read off a loaded Hugging Face model: the ONE place.

Everything that differs between the fast-path architectures is recorded here (norm style incl.
Gemma's ``1 + w``, attention softcap and scale, sliding windows, q/k norms, sandwich norms, the MLP
activation, which rotary table each layer uses). :func:`rmfast.layer.build_layers` turns it, once,
into the tensors and constants of the engine's single decoder-layer function; the embeddings, the
rotary tables and the final norm/heads are the model's own modules and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


# model_type -> family. Anything else takes the generic plain-HF path.
SUPPORTED = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}


#: config activation names -> the form the decoder layer (rmfast.layer) computes (others: not on the fast path).
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
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    q_norm: nn.Module | None  # Gemma 3: RMSNorm over head_dim before RoPE
    k_norm: nn.Module | None
    post_attn_norm: nn.Module | None  # Gemma 2/3 "sandwich" norm on the attention output
    pre_mlp_norm: nn.Module
    post_mlp_norm: nn.Module | None
    mlp: nn.Module
    scale: float
    softcap: float | None
    window: int | None
    rope_key: str  # which rotary table this layer uses (Gemma 3: per layer type)


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
    custom_head: object | None = None  # ArmoRM/QRM/URM: rmfast's head object (rmfast.models.heads)

    @property
    def score_outputs(self) -> int | None:
        """Outputs of the reward head (custom heads: 1), None without one."""
        if self.custom_head is not None:
            return 1
        return None if self.score_head is None else self.score_head.out_features

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos/sin tables (L, head_dim) in like.dtype for the given absolute positions, per rope key.

        Uses the model's own rotary module, so RoPE scaling variants (llama3, linear, ...) are HF's.
        """
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
    outside :data:`ACTIVATIONS`, an MLP that is not gate/up/down)."""
    cfg = model.config
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED:
        return None
    family = SUPPORTED[mt]
    bb = backbone_of(model)
    if not hasattr(bb, "layers") or not hasattr(bb, "embed_tokens"):
        return None
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    softcap = getattr(cfg, "attn_logit_softcapping", None) if family in ("gemma2", "gemma3") else None
    # HF's Gemma 2/3 MLPs read hidden_activation, the others hidden_act.
    act = (getattr(cfg, "hidden_activation", None) if family in ("gemma2", "gemma3") else None) or getattr(
        cfg, "hidden_act", None
    )
    if act not in ACTIVATIONS:
        return None
    layers = []
    rope_keys = set()
    for i, L in enumerate(bb.layers):
        a = L.self_attn
        if not all(hasattr(L.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return None
        sandwich = family in ("gemma2", "gemma3")
        window = getattr(a, "sliding_window", None)
        if mt == "mistral":
            window = getattr(cfg, "sliding_window", None)
        if family == "gemma3":
            rope_key = cfg.layer_types[i]
        else:
            rope_key = "default"
        rope_keys.add(rope_key)
        layers.append(
            LayerSpec(
                input_norm=L.input_layernorm,
                q_proj=a.q_proj,
                k_proj=a.k_proj,
                v_proj=a.v_proj,
                o_proj=a.o_proj,
                q_norm=getattr(a, "q_norm", None),
                k_norm=getattr(a, "k_norm", None),
                post_attn_norm=L.post_attention_layernorm if sandwich else None,
                pre_mlp_norm=L.pre_feedforward_layernorm if sandwich else L.post_attention_layernorm,
                post_mlp_norm=L.post_feedforward_layernorm if sandwich else None,
                mlp=L.mlp,
                scale=float(a.scaling),
                softcap=softcap,
                window=window,
                rope_key=rope_key,
            )
        )
    norm = bb.norm
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or cfg.rms_norm_eps
    score = getattr(model, "score", None)
    lm_head = getattr(model, "lm_head", None)
    return ArchSpec(
        model_type=mt,
        family=family,
        embed=bb.embed_tokens,
        layers=layers,
        final_norm=norm,
        norm_eps=float(eps),
        gemma_norm=family in ("gemma", "gemma2", "gemma3"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rotary=bb.rotary_emb,
        rope_keys=tuple(sorted(rope_keys)),
        score_head=score if isinstance(score, nn.Linear) else None,
        lm_head_weight=lm_head.weight if isinstance(lm_head, nn.Linear) else None,
        final_logit_softcap=getattr(cfg, "final_logit_softcapping", None),
        act=act,
        custom_head=getattr(model, "rmfast_head", None),
    )
