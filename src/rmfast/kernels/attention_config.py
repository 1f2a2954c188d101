"""The launch configuration of the Triton shared-prefix attention, chosen to fit the device's shared memory.

Pure functions of (head dim, dtype, shared memory per block), which run without triton, so the choice is
testable on any machine. :func:`attention_config` returns the first configuration, in order of
preference, whose shared-memory estimate (:func:`smem_estimate`) fits, or None: then no Triton
configuration fits this device and the caller takes the torch form (:func:`rmfast.fast.ops.shared_prefix_attention`).

Why: with the fixed tiles of the first version, head_dim 256 in fp32 asked for 303,232 bytes of shared
memory on an H100, which has 232,448 per block (gpu-check of 2026-11-26, issue 32): Gemma 2 and
Gemma 3 scanned in fp32 on a GPU crashed. The estimate reproduces that figure (tests/test_kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Triton's default software-pipelining depth on CUDA (the first version launched with it)
DEFAULT_STAGES = 3
#: barriers and layout-conversion scratch the estimate adds (the measured case needed 128 bytes)
SMEM_SLACK = 1024


@dataclass(frozen=True)
class AttnConfig:
    """Tiles, warps and pipeline stages of one launch, and the shared memory they are estimated to need."""

    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int
    smem_bytes: int


def _block_d(head_dim: int) -> int:
    """The head dim padded to a power of two, at least 16 (``tl.dot``'s minimum)."""
    from .triton_common import next_pow2

    return max(16, next_pow2(head_dim))


def min_smem_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """The estimate of the smallest configuration :func:`attention_config` tries (16 x 16 tiles, no pipelining)."""
    return smem_estimate(16, 16, _block_d(head_dim), torch.tensor([], dtype=dtype).element_size(), 1)


def smem_estimate(block_m: int, block_n: int, block_d: int, elem_bytes: int, num_stages: int) -> int:
    """Bytes of shared memory one program of the attention kernel needs (an upper-bound style estimate).

    The prefix loop's K and V tiles (BLOCK_N x BLOCK_D each) are multi-buffered by Triton's pipeliner,
    ``num_stages - 1`` copies (one without pipelining); the query tile (BLOCK_M x BLOCK_D) and the
    probabilities tile (BLOCK_M x BLOCK_N) are staged for the two dots; plus :data:`SMEM_SLACK`.
    Calibrated on the one failure measured: BLOCK 32 x 64 x 256, fp32, 3 stages, which Triton reported
    as 303,232 bytes on an H100: 2 x 2 x 64·256·4 + 32·256·4 + 32·64·4 + 128.

    >>> smem_estimate(32, 64, 256, 4, 3) >= 303_232
    True
    """
    buffers = max(1, num_stages - 1)
    kv = 2 * block_n * block_d * elem_bytes  # (BLOCK_N, BLOCK_D) keys + values
    q = block_m * block_d * elem_bytes  # (BLOCK_M, BLOCK_D)
    p = block_m * block_n * elem_bytes  # (BLOCK_M, BLOCK_N) probabilities in the values' dtype
    return buffers * kv + q + p + SMEM_SLACK


def _preferred(block_d: int, even_d: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the first version, chosen for registers (sm_90 compiles, bf16):
    the largest BLOCK_M (prefix reuse) at or under 255 registers without meaningful spills."""
    if block_d <= 64:
        return 64, 64, 4  # ~168 registers
    if block_d <= 128:
        # Padded head dims (e.g. 80, 96) pay for masks: a 64-row tile would spill.
        return (64, 32, 4) if even_d else (32, 64, 4)  # 255 regs + 8-byte spill / ~205 regs
    return 32, 64, 8  # D=256: ~171 registers


def attention_config(head_dim: int, dtype: torch.dtype, smem_bytes: int | None, *,
                     on_cuda: bool = True) -> AttnConfig | None:
    """The launch configuration for ``head_dim`` and ``dtype`` within ``smem_bytes`` of shared memory per
    block (None: unknown, no limit), or None where none fits.

    CUDA: the first version's tiles at 3 stages, then fewer stages, then a narrower key tile (BLOCK_N down
    to 16), then fewer query rows (BLOCK_M down to 16): register pressure only falls along the way, and
    every tile stays >= 16 (``tl.dot`` on the GPU needs it). The interpreter (``on_cuda=False``): 32 x 32
    tiles, which run fastest there (its per-op overhead), no shared-memory limit.

    Timed against nine others on an H200 (2026-11-29, the 8B scan's shapes, ``rmfast.bench.attention_tune``): the
    fastest on the last layer; on the middle layers 64 x 64 at 2 stages was 10% faster (0.70 ms against 0.78 ms) but
    rounds bf16 outputs differently (one ulp). The kernel is ~3% of the scan's kernel time, so it would save ~0.3% of
    the whole vocabulary's wall: kept, and the scores stay those of every earlier run.

    >>> attention_config(256, torch.float32, 232_448)          # the H100's limit: one buffer fewer
    AttnConfig(block_m=32, block_n=64, block_d=256, num_warps=8, num_stages=2, smem_bytes=173056)
    >>> attention_config(256, torch.float32, 40_000) is None   # nothing fits: the torch form
    True
    """
    block_d = _block_d(head_dim)
    elem = torch.tensor([], dtype=dtype).element_size()
    if not on_cuda:
        return AttnConfig(32, 32, block_d, 4, 1, smem_estimate(32, 32, block_d, elem, 1))
    block_m, block_n, warps = _preferred(block_d, block_d == head_dim)
    tries = [(block_m, block_n, DEFAULT_STAGES), (block_m, block_n, 2)]
    bn = block_n
    while bn > 16:
        bn //= 2
        tries.append((block_m, bn, 2))
    bm = block_m
    while bm > 16:
        bm //= 2
        tries.append((bm, 16, 2))
    tries.append((16, 16, 1))
    for m, n, stages in tries:
        need = smem_estimate(m, n, block_d, elem, stages)
        if smem_bytes is None or need <= smem_bytes:
            return AttnConfig(m, n, block_d, warps if m * n >= 32 * 32 else 4, stages, need)
    return None


def device_smem_bytes(device: torch.device) -> int | None:
    """Shared memory one block may use on ``device`` (opt-in maximum: 232,448 on an H100), None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    if smem:
        return int(smem)
    try:  # older torch: ask Triton's driver, the number its own launch check uses
        from triton.compiler import max_shared_mem

        return int(max_shared_mem(device.index if device.index is not None else torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - unknown: let the launch find out
        return None


def launch_config(q: torch.Tensor) -> AttnConfig | None:
    """The attention's configuration for queries like ``q`` on their device, or None: no configuration fits
    its shared memory (then the torch form runs; :func:`rmfast.fast.ops.shared_prefix_attention`)."""
    return attention_config(q.shape[-1], q.dtype, device_smem_bytes(q.device), on_cuda=q.is_cuda)
