"""Tiny random-init models, one per architecture on the fast path, built from configs.

Weights are re-initialised with O(1) scales (HF's default std 0.02 makes every score nearly
the same, and a comparison of near-constants proves little). Every architecture gets the
features that make it different: GQA, qkv bias (Qwen2), sliding windows SHORTER than the
prompt (Mistral, Gemma 2/3), attention softcapping and query_pre_attn_scalar (Gemma 2),
q/k norms and local/global rope (Gemma 3), final-logit softcapping (Gemma 2 LM head), Llama-style
q/k norms with head_dim != hidden/heads, per-layer windows from max_window_layers, attention and
o_proj biases and a tied LM head (Qwen3), fused qkv/gate_up weights, partial rotary and LongRoPE
with a non-trivial short factor and attention scaling (Phi-3; Phi-4-mini's partial rotary).
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
    "qwen3": (tf.Qwen3Config, dict(head_dim=24, use_sliding_window=True, sliding_window=16, max_window_layers=1,
                                   attention_bias=True, tie_word_embeddings=True), "Qwen3"),
    "phi3": (tf.Phi3Config, dict(sliding_window=16, original_max_position_embeddings=256, bos_token_id=0,
                                 eos_token_id=1), "Phi3"),
    "gemma": (tf.GemmaConfig, dict(head_dim=16, num_key_value_heads=1), "Gemma"),
    "gemma2": (tf.Gemma2Config, dict(head_dim=16, sliding_window=16, attn_logit_softcapping=5.0,
                                     final_logit_softcapping=3.0, query_pre_attn_scalar=24), "Gemma2"),
    "gemma3": (tf.Gemma3TextConfig, dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=24,
                                         layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
               "Gemma3Text"),
}


def _longrope(kw: dict) -> dict:
    """Phi-3's LongRoPE over half of each head (partial rotary 0.5), short factors != 1: one factor
    per rotated dimension pair, so it follows the head size the config ends up with."""
    pairs = kw["hidden_size"] // kw["num_attention_heads"] // 4
    return {"rope_type": "longrope", "partial_rotary_factor": 0.5, "short_factor": [1.0 + 0.25 * i for i in range(pairs)],
            "long_factor": [4.0] * pairs}


#: arch -> config kwargs computed from the others (after COMMON and ARCHS' extras are merged)
DERIVED = {"phi3": lambda kw: {"rope_scaling": _longrope(kw)}}


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


def small(arch: str, kind: str = "classifier", **kw):
    """A smaller tiny model (hidden 32, 2 layers, windows of 8: still shorter than a short prompt), for tests
    whose cost grows with the layers (full-vocabulary references, the Triton interpreter)."""
    old = dict(COMMON)
    COMMON.update(hidden_size=32, intermediate_size=48, num_hidden_layers=2)
    extra = ARCHS[arch][1]
    saved = dict(extra)
    if "sliding_window" in extra:
        extra["sliding_window"] = 8
    if "layer_types" in extra:
        extra["layer_types"] = ["sliding_attention", "full_attention"]
    try:
        return tiny(arch, kind, **kw)
    finally:
        COMMON.clear(); COMMON.update(old)
        extra.clear(); extra.update(saved)


def tiny(arch: str, kind: str = "classifier", *, pad_token_id: int = 2, num_labels: int = 2, seed: int = 0,
         dtype=torch.float32, vocab: int = VOCAB):
    """A tiny random model: kind "classifier" (…ForSequenceClassification) or "causal_lm". ``vocab``: a smaller
    vocabulary (with :func:`chatml_tokenizer` of the same size) for a causal LM whose log-prob head runs in the
    Triton interpreter, where each of the vocabulary's tiles costs milliseconds of Python."""
    cfg_cls, extra, prefix = ARCHS[arch]
    kw = {**COMMON, "tie_word_embeddings": False, **extra, "vocab_size": vocab}
    kw.update(DERIVED.get(arch, lambda _: {})(kw))
    cfg = cfg_cls(**kw, num_labels=num_labels, pad_token_id=pad_token_id)
    cfg._attn_implementation = "eager"  # Gemma 2 softcapping needs eager; keep all references alike
    lm_prefix = prefix.replace("Gemma3Text", "Gemma3")  # Gemma3ForCausalLM takes the text config
    cls = getattr(tf, f"{prefix}ForSequenceClassification" if kind == "classifier" else f"{lm_prefix}ForCausalLM")
    torch.manual_seed(seed)
    m = cls(cfg)
    _reinit(m, seed)
    return m.to(dtype).eval().requires_grad_(False)


# A ChatML template like SmolLM2's, without its default system turn.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def chatml_tokenizer(vocab_size: int = VOCAB):
    """A generated byte-level tokenizer with a ChatML chat template and ``vocab_size`` ids: what the
    tiny-model tests need from a tokenizer (a template to split, ids to score), without SmolLM2's
    package. Special ids: 0 <|endoftext|> (bos), 1 <|im_end|> (eos), 2 <|pad|>, 3 <|im_start|>."""
    from rmfast.bench.random_init import synthetic_tokenizer

    return synthetic_tokenizer(vocab_size, bos="<|endoftext|>", eos="<|im_end|>", pad="<|pad|>",
                               extra=("<|im_start|>",), chat_template=CHATML)


def save_rms(folder, tokenizer, specs) -> None:
    """Save tiny one-output reward models with ``tokenizer``: ``specs`` of (name, arch, seed), each to
    ``folder / name`` (the sweep and scale-out tests' model folders)."""
    for name, arch, seed in specs:
        m = tiny(arch, num_labels=1, pad_token_id=tokenizer.pad_token_id, seed=seed)
        m.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)


def chat_ids(tok, prompt, text):
    """The chat template's own ids of the whole conversation (user ``prompt``, assistant ``text``)."""
    out = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": text}],
                                  tokenize=True, return_dict=False)
    return list(out["input_ids"] if hasattr(out, "keys") else out)
