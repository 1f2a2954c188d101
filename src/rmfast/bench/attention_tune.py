"""The attention kernels' launch configurations timed on one shape each, beside their bandwidth model (issue 54,
item 4: "the shared-prefix kernel toward its bandwidth model").

Run f's H100 profile (``benchmarks/results/gpu_h100_2026-11-27_f/``) put the scan's shared-prefix attention at ~3x
the time its bytes take at the copy bandwidth (24.0 ms of a 16,128-row batch), and the cascade's prompt part at
~12% of a 2,048 x 64 best-of-N call; both kernels run one configuration chosen for registers and shared memory,
never timed against another (:func:`rmfast.kernels.attention_config.attention_config`,
``triton_cascade._blocks``). This module times a short list of configurations on the workload's own shapes, each
checked against the configuration the plan uses (max |diff|), so that one GPU call says which to keep.

What "the bandwidth model" counts (:func:`shared_prefix_bytes`): the queries read, each row's suffix keys and values
read, the output written, and the prompt's keys and values read once: the least traffic to DRAM the kernel can
have. Everything here runs on CUDA; on a CPU only under ``TRITON_INTERPRET=1`` (tiny shapes, for the tests).

Example (arithmetic only):
    >>> shared_prefix_bytes(rows=16128, heads=32, kv_heads=8, suffix=2, queries=2, prompt=69, head_dim=128, elem=2)
    660885504
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.attention_config import AttnConfig, attention_config, device_smem_bytes, smem_estimate
from .machine import best_wall

#: (BLOCK_M, BLOCK_N, num_warps, num_stages) tried for the shared-prefix kernel besides the plan's own: smaller
#: query tiles (fewer registers: more programs in flight on a memory-bound kernel), wider key tiles, fewer stages
SHARED_PREFIX_TRIES = ((64, 32, 4, 3), (64, 32, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2), (32, 64, 4, 2), (32, 32, 2, 2),
                       (16, 32, 2, 2), (16, 64, 4, 2), (128, 32, 8, 2), (64, 32, 8, 2))
#: the same for the cascade's prompt part (BLOCK_M query rows of one prompt x BLOCK_N of its keys)
PROMPT_PART_TRIES = ((64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 3),
                     (128, 64, 4, 3), (32, 64, 4, 2))


def shared_prefix_bytes(*, rows: int, heads: int, kv_heads: int, suffix: int, queries: int, prompt: int,
                        head_dim: int, elem: int) -> int:
    """The least DRAM traffic of one shared-prefix attention call: q (rows, heads, queries, D) read, the suffix's
    k and v (rows, kv heads, suffix, D) read, the output (rows, queries, heads, D) written, the prompt's k and v
    (kv heads, prompt, D) read once."""
    return elem * head_dim * (2 * rows * heads * queries + 2 * rows * kv_heads * suffix + 2 * kv_heads * prompt)


def prompt_part_flops(*, tokens: int, heads: int, prompt: int, head_dim: int) -> float:
    """The prompt part's matmul FLOPs: every packed row token's query (all heads) against every prompt key, q·k and
    p·v."""
    return 4.0 * tokens * heads * prompt * head_dim


@dataclass
class Timed:
    """One configuration's result: its tiles, the best time, and its largest difference from the plan's own."""

    config: tuple
    ms: float | None  # None: it did not fit this device's shared memory, or did not compile
    max_diff: float | None
    note: str = ""


def _best_ms(fn, device, reps: int) -> float:
    """Best wall of ``reps`` calls after one untimed call (its compile), in milliseconds."""
    fn()
    return best_wall(fn, torch.device(device), reps) * 1e3


def _try(run, want: torch.Tensor | None, config: tuple, device, reps: int) -> Timed:
    try:
        got = run()
        ms = _best_ms(run, device, reps)
    except Exception as e:  # noqa: BLE001 - a configuration that does not compile or launch is a result here
        return Timed(config, None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}")
    diff = None if want is None else float((got.float() - want.float()).abs().max())
    return Timed(config, ms, diff)


def tune_shared_prefix(*, rows: int, heads: int, kv_heads: int, suffix: int, queries: int, prompt: int,
                       head_dim: int, dtype: torch.dtype, device, tries=SHARED_PREFIX_TRIES, reps: int = 5,
                       seed: int = 0) -> tuple[AttnConfig | None, list[Timed]]:
    """Time the shared-prefix kernel on one shape with the plan's configuration and each of ``tries``: (the plan's
    configuration, [its result first, then each try's]). A try that needs more shared memory than the device has is
    reported, not run."""
    from ..kernels.triton_attention import shared_prefix_attention_triton

    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q = rand(rows, heads, queries, head_dim)  # (B, H, Sq, D)
    kp, vp = rand(kv_heads, prompt, head_dim), rand(kv_heads, prompt, head_dim)  # (Hkv, P, D)
    ks, vs = rand(rows, kv_heads, suffix, head_dim), rand(rows, kv_heads, suffix, head_dim)  # (B, Hkv, S, D)
    scale = head_dim ** -0.5
    smem = device_smem_bytes(q.device)
    plan = attention_config(head_dim, dtype, smem, on_cuda=q.is_cuda)

    def run_with(cfg):
        return lambda: shared_prefix_attention_triton(q, kp, vp, ks, vs, scale=scale, config=cfg)

    base = (_try(run_with(plan), None, _tiles(plan), device, reps) if plan is not None
            else Timed((), None, None, "no configuration fits"))
    want = run_with(plan)() if base.ms is not None else None
    out = [base]
    elem, block_d = q.element_size(), plan.block_d if plan is not None else head_dim
    for bm, bn, warps, stages in (t for t in tries if plan is None or t != _tiles(plan)):  # the plan's: timed once
        need = smem_estimate(bm, bn, block_d, elem, stages)
        if smem is not None and need > smem:
            out.append(Timed((bm, bn, warps, stages), None, None, f"needs ~{need:,} B of shared memory"))
            continue
        cfg = AttnConfig(bm, bn, block_d, warps, stages, need)
        out.append(_try(run_with(cfg), want, (bm, bn, warps, stages), device, reps))
    return plan, out


def tune_prompt_part(*, rows: int, row_tokens: int, heads: int, kv_heads: int, prompt: int, head_dim: int,
                     dtype: torch.dtype, device, tries=PROMPT_PART_TRIES, reps: int = 5,
                     seed: int = 0) -> tuple[tuple, list[Timed]]:
    """Time the cascade's prompt part as a packed best-of-N wave runs it (one prompt, ``rows`` rows of ``row_tokens``
    tokens packed, every token a one-query row) with its own blocks and each of ``tries``: (its own blocks, [its
    result first, then each try's])."""
    from ..kernels.triton_cascade import _blocks, prompt_part_triton
    from ..kernels.triton_common import next_pow2

    g = torch.Generator(device="cpu").manual_seed(seed)
    T = rows * row_tokens
    q = torch.randn(T, 1, heads, head_dim, generator=g).to(device=device, dtype=dtype)  # (T, 1, H, D)
    k = torch.randn(kv_heads, prompt, head_dim, generator=g).to(device=device, dtype=dtype)  # (Hkv, P, D)
    v = torch.randn(kv_heads, prompt, head_dim, generator=g).to(device=device, dtype=dtype)
    cu_q = torch.tensor([0, T], dtype=torch.int32, device=device)
    cu_kv = torch.tensor([0, prompt], dtype=torch.int32, device=device)
    own = _blocks(max(16, next_pow2(head_dim)), q.element_size(), q.is_cuda)

    def run_with(blocks):
        return lambda: prompt_part_triton(q, k, v, cu_q, cu_kv, T, scale=head_dim ** -0.5, blocks=blocks)[0]

    base = _try(run_with(None), None, own, device, reps)
    want = run_with(None)() if base.ms is not None else None
    return own, [base] + [_try(run_with(b), want, b, device, reps) for b in tries if b != own]


def _tiles(cfg: AttnConfig) -> tuple:
    return cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages


def table(results: list[Timed], *, bytes_: float | None = None, flops: float | None = None,
          bandwidth_tb_s: float | None = None) -> list[str]:
    """One line per configuration: its tiles, ms, the rate it reached (GB/s of the bandwidth model's bytes, or
    TFLOP/s), the share of the copy bandwidth, its max |diff| from the plan's own; the fastest marked."""
    ok = [r for r in results if r.ms is not None]
    best = min(ok, key=lambda r: r.ms) if ok else None
    lines = [f"    {'BLOCK_M,N warps stages':24s} {'ms':>9s} {'rate':>14s} {'of bw':>7s} {'max |diff|':>11s}"]
    for i, r in enumerate(results):
        tiles = "x".join(map(str, r.config[:2])) + f" w{r.config[2]} s{r.config[3]}" if r.config else "-"
        tiles += " (plan)" if i == 0 else ""
        if r.ms is None:
            lines.append(f"    {tiles:24s} {'-':>9s}  {r.note}")
            continue
        if bytes_ is not None:
            rate = f"{bytes_ / r.ms / 1e6:,.0f} GB/s"
            share = f"{bytes_ / r.ms / 1e9 / bandwidth_tb_s:6.0%}" if bandwidth_tb_s else "-"
        else:
            rate, share = f"{flops / r.ms / 1e9:,.1f} TFLOP/s", "-"
        diff = "-" if r.max_diff is None else f"{r.max_diff:.2e}"
        mark = "   fastest" if r is best else ""
        lines.append(f"    {tiles:24s} {r.ms:9.3f} {rate:>14s} {share:>7s} {diff:>11s}{mark}")
    return lines


__all__ = ["PROMPT_PART_TRIES", "SHARED_PREFIX_TRIES", "Timed", "prompt_part_flops", "shared_prefix_bytes", "table",
           "tune_prompt_part", "tune_shared_prefix"]
