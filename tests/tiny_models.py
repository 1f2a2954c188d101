"""Tiny random-init models, one per architecture on the fast path, built from configs.

Weights are re-initialised with O(1) scales (HF's default std 0.02 makes every score nearly
the same, and a comparison of near-constants proves little). Every architecture gets the
features that make it different: GQA, qkv bias (Qwen2), sliding windows SHORTER than the
prompt (Mistral, Gemma 2/3), attention softcapping and query_pre_attn_scalar (Gemma 2),
q/k norms and local/global rope (Gemma 3), final-logit softcapping (Gemma 2 LM head).
"""

from __future__ import annotations

import math

import torch
import transformers as tf

VOCAB = 49152  # the real SmolLM2 tokenizer's vocabulary

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)

ARCHS = {
    "llama": (tf.LlamaConfig, dict(), "Llama"),
    "mistral": (tf.MistralConfig, dict(sliding_window=16), "Mistral"),
    "qwen2": (tf.Qwen2Config, dict(use_sliding_window=False), "Qwen2"),
    "gemma": (tf.GemmaConfig, dict(head_dim=16, num_key_value_heads=1), "Gemma"),
    "gemma2": (tf.Gemma2Config, dict(head_dim=16, sliding_window=16, attn_logit_softcapping=5.0,
                                     final_logit_softcapping=3.0, query_pre_attn_scalar=24), "Gemma2"),
    "gemma3": (tf.Gemma3TextConfig, dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=24,
                                         layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
               "Gemma3Text"),
}


def _reinit(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    gemma = "gemma" in model.config.model_type
    for name, p in model.named_parameters():
        if p.dim() == 2:  # linear / embedding
            std = 1.0 if "embed" in name else 1.0 / math.sqrt(p.shape[1])
            p.data = torch.randn(p.shape, generator=g) * std
        elif "norm" in name:
            p.data = (0.0 if gemma else 1.0) + 0.2 * torch.randn(p.shape, generator=g)
        else:  # biases
            p.data = 0.1 * torch.randn(p.shape, generator=g)


def tiny(arch: str, kind: str = "classifier", *, pad_token_id: int = 2, num_labels: int = 2, seed: int = 0,
         dtype=torch.float32):
    """A tiny random model: kind "classifier" (…ForSequenceClassification) or "causal_lm"."""
    cfg_cls, extra, prefix = ARCHS[arch]
    cfg = cfg_cls(**{**COMMON, **extra}, num_labels=num_labels, pad_token_id=pad_token_id, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"  # Gemma 2 softcapping needs eager; keep all references alike
    lm_prefix = prefix.replace("Gemma3Text", "Gemma3")  # Gemma3ForCausalLM takes the text config
    cls = getattr(tf, f"{prefix}ForSequenceClassification" if kind == "classifier" else f"{lm_prefix}ForCausalLM")
    torch.manual_seed(seed)
    m = cls(cfg)
    _reinit(m, seed)
    return m.to(dtype).eval().requires_grad_(False)
