"""A model's dimensions as its config gives them: the ONE place they are read.

Hidden size, decoder layers, query and key/value heads, head dimension, MLP width and vocabulary are
read by the memory estimate (:func:`rmfast.scoring.batching.row_bytes`), the prompt-cache size
(:meth:`rmfast.scoring.scorer.RewardScorer.prompt_bytes`), the fast path's architecture facts
(:func:`rmfast.fast.arch.arch_spec`), the registry's parameter count
(:func:`rmfast.loading.registry.count_params`), the CPU dtype probe (:func:`mlp_dims`) and
the benchmark's FLOP and cost models (:mod:`rmfast.bench.flops`, :mod:`rmfast.bench.random_init`).
Each used to read the config fields itself, each with its own defaults; the per-architecture rules
live here instead:

* multimodal configs nest the language model's fields under ``text_config`` (transformers'
  ``get_text_config()``; a ``config.json`` dict's ``"text_config"``);
* ``num_key_value_heads`` absent or None: one key/value head per query head (no GQA);
* ``head_dim`` absent or None: ``hidden_size // num_attention_heads``. Gemma 2, Gemma 3 and Qwen3 give
  theirs explicitly, and it need not be hidden / heads (Gemma-2-2B: 256, where 2,304 / 8 heads is 288);
* ``intermediate_size`` absent or None: 4 x hidden (GPT-style MLPs).

Both transformers config objects and plain ``config.json`` dicts (the registry's) are read.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelDims", "model_dims", "mlp_dims", "text_config"]


@dataclass(frozen=True)
class ModelDims:
    """The shapes of a decoder, from its config (:func:`model_dims`)."""

    hidden: int  # residual stream width (hidden_size)
    layers: int  # decoder layers (num_hidden_layers)
    heads: int  # query heads (num_attention_heads)
    kv_heads: int  # key/value heads (num_key_value_heads; = heads without GQA)
    head_dim: int  # dimensions per head (head_dim, or hidden // heads)
    intermediate: int  # MLP width (intermediate_size, or 4 x hidden)
    vocab: int | None  # vocabulary rows of the embedding (vocab_size), None where the config has none

    @property
    def q_width(self) -> int:
        """Output features of the query projection: heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Output features of the key (or the value) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim


def text_config(config):
    """The language model's part of a config: a multimodal config's text config, others as they are."""
    if isinstance(config, dict):
        return config.get("text_config") or config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _field(c, key: str):
    return c.get(key) if isinstance(c, dict) else getattr(c, key, None)


def mlp_dims(config) -> tuple[int, int] | None:
    """(hidden, intermediate) of a config, by :func:`model_dims`' rules; None without a config or a hidden
    size. Only these two: the CPU dtype probe times the MLP's projection shape of any model
    (:func:`rmfast.cpu.choose_cpu_dtype`), attention or not.

    >>> mlp_dims({"hidden_size": 64}), mlp_dims(None)
    ((64, 256), None)
    """
    if config is None:
        return None
    c = text_config(config)
    hidden = _field(c, "hidden_size")
    if not hidden:
        return None
    return int(hidden), int(_field(c, "intermediate_size") or 4 * int(hidden))


def model_dims(config) -> ModelDims:
    """The dimensions of a transformers config (or a ``config.json`` dict), per the module's rules.

    A config without a hidden size, head count or layer count is not a decoder this can size: ValueError.

    >>> model_dims({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10})
    ModelDims(hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16, intermediate=256, vocab=10)
    """
    c = text_config(config)
    mlp, heads, layers = mlp_dims(c), _field(c, "num_attention_heads"), _field(c, "num_hidden_layers")
    missing = [k for k, v in (("hidden_size", mlp), ("num_attention_heads", heads), ("num_hidden_layers", layers))
               if not v]
    if missing:
        raise ValueError(f"the model config gives no {', '.join(missing)}: not a decoder whose shapes rmfast can read")
    (hidden, intermediate), heads = mlp, int(heads)
    vocab = _field(c, "vocab_size")
    return ModelDims(
        hidden=hidden,
        layers=int(layers),
        heads=heads,
        kv_heads=int(_field(c, "num_key_value_heads") or heads),
        head_dim=int(_field(c, "head_dim") or hidden // heads),
        intermediate=intermediate,
        vocab=None if vocab is None else int(vocab),
    )


def kv_bytes(model, n_tokens: int) -> int:
    """Bytes of the keys and values of ``n_tokens`` prompt tokens in every layer, in the model's dtype: one cached
    prompt encoding (RewardScorer's cache, rmfast serve's)."""
    dm = model_dims(model.config)
    return 2 * dm.layers * dm.kv_heads * dm.head_dim * int(n_tokens) * next(model.parameters()).element_size()

