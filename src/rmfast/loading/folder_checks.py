"""What a model folder's files must satisfy before (and after) transformers loads them, one definition for every
loading path (:func:`rmfast.loading.loader.load` and the spread one, :mod:`rmfast.loading.spread`): no pickles
unless allowed, the config's vocabulary equal to the embedding's rows, a RoPE type the installed transformers
knows, the custom heads rmfast recognizes by their weight names, transformers' size mismatch as one line, and a
warning for checkpoint tensors the model does not use."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from ..errors import UserError
from .sources import PICKLE_GLOBS, damaged_fix


def check_weights(folder: Path, allow_pickle: bool = False) -> None:
    """Refuse a folder whose only weights are pickles (unpickling can run code) unless ``allow_pickle``."""
    if allow_pickle or any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for pat in PICKLE_GLOBS for p in folder.glob(pat))
    if pickles:
        raise UserError(f"model folder '{folder}' has only pickled weights ({', '.join(pickles[:3])}), and loading a "
                        "pickle can run code: convert them to safetensors, or pass --allow-pickle if you trust them (a sweep config: allow_pickle: true)")


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from model.safetensors(.index.json); {} without safetensors."""
    from safetensors import SafetensorError, safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"cannot read the weights index of '{folder}': {index.name}: {type(exc).__name__} "
                            f"({damaged_fix(folder)})") from None
        return {k: folder / v for k, v in wm.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        return {}
    try:
        with safe_open(str(single), "pt") as f:
            return {k: single for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise UserError(f"cannot read the weights of '{folder}': {single.name}: {str(exc).splitlines()[0][:200]} "
                        f"({damaged_fix(folder)})") from None


def custom_head_kind(names) -> str | None:
    """The custom reward head a checkpoint's weight names show (:mod:`rmfast.loading.custom_heads`): "gated"
    (ArmoRM/QRM), "urm", or None (not a custom head rmfast knows).

    >>> custom_head_kind({"model.embed_tokens.weight", "score.weight"}) is None
    True
    >>> custom_head_kind({"score.weight", "weights.fc.0.weight"})
    'urm'
    """
    names = set(names)
    if any(n.startswith("gating.layers.") for n in names) or "reward_transform_matrix" in names:
        return "gated"
    if any(n.startswith("weights.fc.") for n in names) and "score.weight" in names:
        return "urm"
    return None


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


def check_rope_type(folder: Path, config, trust_remote_code: bool = False) -> None:
    """Refuse a config whose RoPE type the installed transformers does not know (a newer one): transformers would
    stop with a KeyError deep in the model's construction. Not with ``trust_remote_code``: the model's own code may
    define a type transformers lacks (early Phi-3-128k's "su")."""
    if trust_remote_code:
        return
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:  # pragma: no cover - an older transformers: it checks its own
        return
    known = {"default", *ROPE_INIT_FUNCTIONS}
    for cfg in (config, getattr(config, "text_config", None)):
        params = getattr(cfg, "rope_parameters", None) if cfg is not None else None
        if not isinstance(params, dict):
            continue
        per_layer = params.values() if all(isinstance(v, dict) for v in params.values()) and params else [params]
        for p in per_layer:
            kind = p.get("rope_type", p.get("type", "default")) if isinstance(p, dict) else "default"
            if kind not in known:
                import transformers

                raise UserError(f"'{folder}': config.json asks for RoPE type {kind!r}, which transformers "
                                f"{transformers.__version__} does not know (it knows {', '.join(sorted(known))}): "
                                "upgrade transformers, or fix rope_scaling in config.json")


#: checkpoint tensors a model may carry without using them: a causal LM's head in a classifier checkpoint, RoPE tables
_UNUSED_OK = ("lm_head.", "rotary_emb.inv_freq", ".rotary_emb.", "masked_bias", ".attn.bias")


def warn_unexpected(folder, unexpected) -> None:
    """Checkpoint tensors the model has no place for (transformers drops them; rmfast keeps its load report quiet):
    one warning naming them, since a trained bias the config does not describe changes every score."""
    odd = sorted(k for k in unexpected or () if not any(part in k for part in _UNUSED_OK))
    if odd:
        shown = ", ".join(odd[:5]) + (f" and {len(odd) - 5} more" if len(odd) > 5 else "")
        warnings.warn(f"rmfast: {folder} has weights the model does not use ({shown}); they are ignored, as "
                      "transformers ignores them: if the model was trained with them (a bias its config.json does "
                      "not declare), these scores are not its own: fix config.json", stacklevel=4)
