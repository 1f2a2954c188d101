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

from . import cpu
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


def lm_only(model) -> bool:
    """A causal LM: an LM head and no reward head (a classifier's ``score``/``classifier``, or the
    ArmoRM/QRM/URM head rmfast runs, ``rmfast_head``), so nothing for a score head to read."""
    return isinstance(getattr(model, "lm_head", None), torch.nn.Module) and not any(
        getattr(model, h, None) is not None for h in ("score", "classifier", "rmfast_head"))


#: a batch's estimated activations may take at most this fraction of the memory available when
#: the job starts (the rest: the allocator's slack, temporaries the estimate leaves out, other programs)
MEM_FRACTION = 0.5


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device``, or None where unknown.

    CUDA: ``torch.cuda.mem_get_info``. CPU (Linux): ``MemAvailable`` of /proc/meminfo, or less when
    a cgroup (a container) limits this process (memory.max - memory.current).
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    avail = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except OSError:
        return None
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read())
        if limit != "max":
            avail = min(avail, int(limit) - used) if avail is not None else int(limit) - used
    except (OSError, ValueError):
        pass
    return avail


def row_bytes(model, tokens_per_row: int, *, prefix_len: int = 0, head: str = "score", full_sequence: bool = False) -> int:
    """Estimated peak activation bytes one row of a batch needs (upper-bound style, from the config).

    One decoder layer's activations are live at a time (inference): per token the residual stream and
    its norm/attention outputs (4·hidden), q|k|v ((H + 2·Hkv)·D) and the MLP's gate, up and product
    (3·intermediate), in the model's dtype; the attention scores and their softmax (2·H·T·(P + T),
    fp32); with ``full_sequence`` (the plain-HF path) every layer's K/V cache; for the logprob head an
    fp32 logits block per token (a vocabulary chunk of 8,192 on the fast path, the whole vocabulary
    with ``full_sequence``).

    >>> from types import SimpleNamespace as NS
    >>> cfg = NS(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    ...          num_hidden_layers=3, vocab_size=1000)
    >>> m = NS(config=cfg, parameters=lambda: iter([torch.zeros(1, dtype=torch.float32)]))
    >>> row_bytes(m, 2, prefix_len=10)  # 2·(4·64 + (4+4)·16 + 3·96)·4 + 2·4·2·12·4
    6144
    """
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    hid, inter = int(c.hidden_size), int(getattr(c, "intermediate_size", 4 * c.hidden_size))
    H = int(c.num_attention_heads)
    kv = int(getattr(c, "num_key_value_heads", None) or H)
    D = int(getattr(c, "head_dim", None) or hid // H)
    nbytes = next(model.parameters()).element_size()
    T = max(1, int(tokens_per_row)) + (int(prefix_len) if full_sequence else 0)
    keys = T + (0 if full_sequence else int(prefix_len))
    per = T * (4 * hid + (H + 2 * kv) * D + 3 * inter) * nbytes + 2 * H * T * keys * 4
    if full_sequence:
        per += int(c.num_hidden_layers) * T * 2 * kv * D * nbytes
    if head == "logprob":
        per += 2 * T * (int(c.vocab_size) if full_sequence else min(8192, int(c.vocab_size))) * 4
    return int(per)


def memory_cap(device: torch.device, per_row: int | None, available: int | None = None) -> int | None:
    """Most rows whose activations (``per_row`` bytes each) fit in MEM_FRACTION of the available
    memory (``available``, default :func:`available_memory`); None where unknown.

    >>> memory_cap(torch.device("cpu"), 1_000_000, available=100_000_000)
    50
    >>> memory_cap(torch.device("cpu"), 10**12, available=100_000_000)  # at least one row
    1
    """
    if not per_row:
        return None
    avail = available_memory(device) if available is None else available
    if avail is None:
        return None
    return max(1, int(MEM_FRACTION * avail) // int(per_row))


def auto_batch_size(device: torch.device, tokens_per_row: int, per_row: int | None = None,
                    available: int | None = None) -> int:
    """CPU: ~4k tokens per batch keeps GEMMs large and activations in cache. CUDA: start big; OOM halves it.

    With ``per_row`` (:func:`row_bytes`), never more rows than fit in memory (:func:`memory_cap`): on
    CPU memory pressure raises no out-of-memory error to back off from, it swaps or gets killed.

    >>> auto_batch_size(torch.device("cpu"), 4)
    1024
    >>> auto_batch_size(torch.device("cpu"), 4, per_row=1_000_000, available=100_000_000)
    50
    """
    if device.type == "cuda":
        bs = max(64, min(16384, 131072 // max(1, tokens_per_row)))
    else:
        bs = max(32, min(2048, 4096 // max(1, tokens_per_row)))
    cap = memory_cap(device, per_row, available)
    return bs if cap is None else min(bs, cap)


def cap_batch_size(bs: int, device: torch.device, per_row: int | None, available: int | None = None) -> int:
    """A batch size the user chose, lowered (with a one-line warning) to what fits in memory."""
    cap = memory_cap(device, per_row, available)
    if cap is None or bs <= cap:
        return bs
    avail = available_memory(device) if available is None else available
    warnings.warn(f"rmfast: --batch-size {bs} needs ~{bs * per_row / 2**30:.2g} GiB of activations, over "
                  f"{MEM_FRACTION:.0%} of the {avail / 2**30:.2g} GiB available on {device.type}; using {cap}",
                  stacklevel=3)
    return cap


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


#: the manifest fields that decide a job's scores: a checkpoint is resumed only by a job that agrees on all
RUN_FIELDS = ("model", "prompt", "template", "head", "head_index", "dtype", "engine")


def run_fields(manifest: dict) -> dict:
    """The :data:`RUN_FIELDS` of a job's manifest. ``model`` is the loader's provenance, which names the
    content (a GGUF's sha256, a hub revision, a folder's :func:`rmfast.loader.content_sha256`): a model
    whose weights changed is another job, never a resume of the old one's scores."""
    return {k: manifest[k] for k in RUN_FIELDS if k in manifest}


def run_key(manifest: dict) -> str:
    """The key a job's checkpoint is saved under: a hash of its :func:`run_fields`."""
    return hashlib.sha256(json.dumps(run_fields(manifest), sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_head(model, head: str, head_index: int) -> str:
    """Validate the head options; "auto" -> "score" for classifiers, "logprob" for causal LMs.

    "score" on a causal LM is refused: it has no reward head, and the plain-HF path would read its
    LM logits at the final position, output ``head_index`` being the logit of that token id: a
    ranking by "how likely is token 0 next", silently. A classifier head, seeded at random, is what
    ``random_head_seed`` loads (``rmfast gcg --random-head-seed N``, a sweep's ``random_head_seed``).
    """
    if head == "auto":
        head = default_head(model)
    if head not in ("score", "logprob"):
        raise UserError(f"unknown head {head!r}; use score or logprob")
    if head == "logprob" and not hasattr(model, "lm_head"):
        raise UserError("--head logprob needs a causal language model; this model has no LM head (use --head score)")
    if head == "score" and lm_only(model):
        raise UserError(f"--head score needs a reward model or classifier, and "
                        f"{getattr(model.config, 'name_or_path', None) or type(model).__name__} is a causal LM (no "
                        "score head: its next-token logits would be read as rewards); use --head logprob (or auto), "
                        "or load it with a seeded random score head (rmfast gcg --random-head-seed N; random_head_seed: "
                        "N in a sweep; rmfast.load(..., random_head_seed=N))")
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
        **cpu.manifest_fields(model),
        "device": str(p.device),
        "engine": engine,
        "score_position": "final position of prefix + response + suffix (never 'last non-pad')",
    }
