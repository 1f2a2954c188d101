"""Each option of a scoring job resolved to one decision: head, engine, compile, batch size.

Decisions are made once per job from the whole job (never from the part left after a resume),
so a resumed job runs the same path as an uninterrupted one; each is recorded in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import torch

from .version import __version__
from .engine import MAX_BLOCKDIAG_EXTRA, Engine
from .errors import UserError
from .models.arch import arch_spec
from .template import Template


def default_head(model) -> str:
    """'score' for classifiers / reward models, 'logprob' for causal LMs."""
    names = " ".join(getattr(model.config, "architectures", None) or [type(model).__name__])
    if isinstance(getattr(model, "score", None), torch.nn.Module) or "SequenceClassification" in names or "Reward" in names:
        return "score"
    if hasattr(model, "lm_head") or "CausalLM" in names:
        return "logprob"
    return "score"


def auto_batch_size(device: torch.device, tokens_per_row: int) -> int:
    """CPU: ~4k tokens per batch keeps GEMMs large and activations in cache. CUDA: start big; OOM halves it."""
    if device.type == "cuda":
        return max(64, min(16384, 131072 // max(1, tokens_per_row)))
    return max(32, min(2048, 4096 // max(1, tokens_per_row)))


#: "auto" compiles the CPU layer when a job is at least this many FLOPs (≈15 s of eager work on a
#: 2-core CPU; the one-off compile costs ~5–12 s, ~3 s once inductor's on-disk cache is warm).
COMPILE_MIN_FLOPS = 1e13


def layer_params(model) -> int:
    """Parameters of the decoder layers' projections (q, k, v, o, MLP): 2× this = FLOPs per token."""
    spec = arch_spec(model)
    if spec is None:
        return 0
    mods = [m for L in spec.layers for m in L.linears()]
    return sum(p.numel() for m in mods for p in m.parameters())


def resolve_compile(compile, model, n_tokens: int, engine: Engine | None = None) -> bool:
    """"auto" (default) -> compile on CPU for jobs of >= COMPILE_MIN_FLOPS; "on"/"off" or a bool.

    With ``engine``, "auto" also declines when its block-diagonal prompt attention would add more
    than MAX_BLOCKDIAG_EXTRA of a layer's FLOPs (long prompts on many heads).
    ``RMFAST_COMPILE=0`` turns "auto" off (e.g. where no C++ compiler is installed).
    """
    if isinstance(compile, bool):
        return compile
    if compile not in ("auto", "on", "off"):
        raise UserError(f"unknown --compile {compile!r}; use auto, on or off")
    if compile != "auto":
        return compile == "on"
    if os.environ.get("RMFAST_COMPILE", "1") == "0":
        return False
    device = next(model.parameters()).device
    if engine is not None and engine.blockdiag_overhead() > MAX_BLOCKDIAG_EXTRA:
        return False
    return device.type == "cpu" and 2.0 * layer_params(model) * n_tokens >= COMPILE_MIN_FLOPS


def even_batch(n: int, bs: int) -> int:
    """The batch size <= bs that splits n rows into equal batches (the last short by < the batch count).

    The compiled engine pads a short final batch to its compiled shape; equal batches waste nothing.
    """
    if n <= 0 or bs <= 0:
        return bs
    k = -(-n // bs)  # batches needed
    return -(-n // k)


def run_key(manifest: dict) -> str:
    keep = {k: manifest[k] for k in ("model", "prompt", "template", "head", "head_index", "dtype", "engine") if k in manifest}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_head(model, head: str, head_index: int) -> str:
    """Validate the head options; "auto" -> "score" for classifiers, "logprob" for causal LMs."""
    if head == "auto":
        head = default_head(model)
    if head not in ("score", "logprob"):
        raise UserError(f"unknown head {head!r}; use score or logprob")
    if head == "logprob" and not hasattr(model, "lm_head"):
        raise UserError("--head logprob needs a causal language model; this model has no LM head (use --head score)")
    if head == "score" and head_index < 0:
        raise UserError("--head-index must be >= 0")
    return head


def resolve_engine(model, head: str, head_index: int, engine: str) -> str:
    """"auto" -> "fast" where the architecture is on the fast path, else "reference" with a warning."""
    spec = arch_spec(model)
    if engine == "auto":
        engine = "fast" if spec is not None and (head != "score" or spec.score_outputs is not None) else "reference"
        if engine == "reference":
            warnings.warn(
                f"rmfast: architecture {getattr(model.config, 'model_type', '?')!r} is not on the fast path; "
                "using the plain Hugging Face path (correct, slower)",
                stacklevel=3,
            )
    elif engine not in ("fast", "reference"):
        raise UserError(f"unknown engine {engine!r}; use auto, fast or reference")
    if head == "score" and spec is not None and spec.score_outputs is not None and head_index >= spec.score_outputs:
        raise UserError(f"--head-index {head_index} is out of range: the score head has {spec.score_outputs} outputs")
    return engine


def base_manifest(model, tmpl: Template, prompt: str, *, head: str, head_index: int, engine: str, model_info=None) -> dict:
    """The manifest fields every scoring job records (model, prompt, template ids, head, dtype, device)."""
    p = next(model.parameters())
    return {
        "rmfast_version": __version__,
        "model": model_info or {"name": getattr(model.config, "name_or_path", None) or type(model).__name__},
        "architecture": (getattr(model.config, "architectures", None) or [type(model).__name__])[0],
        "prompt": prompt,
        "template": tmpl.manifest(),
        "head": head,
        "head_index": head_index,
        "dtype": str(p.dtype).replace("torch.", ""),
        "device": str(p.device),
        "engine": engine,
        "score_position": "final position of prefix + response + suffix (never 'last non-pad')",
    }
