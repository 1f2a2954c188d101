"""config.json's ``vocab_size`` against the checkpoint's embedding, before transformers loads the weights.

transformers refuses a mismatch with a multi-line report and a RuntimeError; rmfast says it in one
line, naming both sizes and the fix (:func:`check_vocab_size`). :func:`mismatch_error` turns the
error transformers raises for any other shape mismatch into one line too.

Example:
    >>> embedding_names({"model.embed_tokens.weight", "lm_head.weight", "score.weight"})
    ['model.embed_tokens.weight']
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError

#: how the input embedding is named across the architectures transformers loads
_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight",
                       "tok_embeddings.weight")


def embedding_names(names) -> list[str]:
    """The input-embedding tensor names among a checkpoint's weight names."""
    return sorted(n for n in names if n.endswith(_EMBEDDING_SUFFIXES))


def _vocab_sizes(config) -> list[tuple[str, int]]:
    out = []
    for where, cfg in (("", config), ("text_config.", getattr(config, "text_config", None))):
        v = getattr(cfg, "vocab_size", None) if cfg is not None else None
        if isinstance(v, int):
            out.append((where + "vocab_size", v))
    return out


def check_vocab_size(folder: Path, config, files: dict[str, Path]) -> None:
    """Refuse a folder whose config ``vocab_size`` is not the embedding's row count (``files``: tensor name ->
    safetensors file; nothing is checked without safetensors)."""
    from safetensors import SafetensorError, safe_open

    sizes = _vocab_sizes(config)
    names = embedding_names(files)
    if not sizes or not names:
        return
    name = names[0]
    try:
        with safe_open(str(files[name]), "pt") as f:
            rows = f.get_slice(name).get_shape()[0]
    except (SafetensorError, OSError, IndexError):
        return  # a damaged file: the weight loader names it
    if all(v != rows for _, v in sizes):
        key, v = sizes[0]
        raise UserError(f"'{folder}': config.json says {key} {v} but the embedding {name} has {rows} rows: the config "
                        f"does not belong to these weights; set {key} to {rows} in config.json, or fetch the model again")


def mismatch_error(folder: Path, exc: BaseException) -> UserError | None:
    """transformers' size-mismatch RuntimeError as one line; None for any other error."""
    if "ignore_mismatched_sizes" not in str(exc):
        return None
    return UserError(f"'{folder}': the weights' shapes do not match config.json (transformers refuses to load them): "
                     "the config does not belong to these weights; fetch the model again")
