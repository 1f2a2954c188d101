"""How many rows a batch may hold: estimated activation bytes per row against the memory free.

On CPU, memory pressure raises no out-of-memory error to back off from (it swaps, or the process
is killed), so every batch size, chosen or asked for, is bounded by an estimate made up front.
"""

from __future__ import annotations

import warnings

import torch

from ..dims import model_dims
from ..errors import UserError
from .options import parse_batch_size  # noqa: F401  (its one definition; imported from here by older callers)


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
    dm = model_dims(model.config)
    hid, inter, H, kv, D = dm.hidden, dm.intermediate, dm.heads, dm.kv_heads, dm.head_dim
    nbytes = next(model.parameters()).element_size()
    T = max(1, int(tokens_per_row)) + (int(prefix_len) if full_sequence else 0)
    keys = T + (0 if full_sequence else int(prefix_len))
    per = T * (4 * hid + (H + 2 * kv) * D + 3 * inter) * nbytes + 2 * H * T * keys * 4
    if full_sequence:
        per += dm.layers * T * 2 * kv * D * nbytes
    if head == "logprob":
        per += 2 * T * (int(dm.vocab) if full_sequence else min(8192, int(dm.vocab))) * 4
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
