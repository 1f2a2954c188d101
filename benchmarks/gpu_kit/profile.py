"""Step 4's profile: one best-of-N call under torch.profiler (a table by kernel, each phase's host span against its
device time), then the sweeps of :mod:`gpu_kit.sweeps` (a process of its own)."""

from __future__ import annotations

import io
import time
from pathlib import Path

from .config import PROFILE_SHAPES, WORKLOAD_MODEL
from .sweeps import (attention_configs, best_of_n_inputs, call_overhead, elementwise_ab, env_bandwidth,
                     form_crossover, fuse_ab, scan_profile)


def annotate_phases():
    """Wrap the best-of-N call's phases in torch.profiler.record_function ranges ("phase: ..."), in this
    subprocess only: tokenizing, the prompt pass (one engine's or a wave's), the rows' pass, the head."""
    import functools

    import torch

    from rmfast.fast import engine, wave
    from rmfast.scoring import plan, scorer

    def wrap(owner, attr, label):
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def inner(*a, **k):
            with torch.profiler.record_function(f"phase: {label}"):
                return fn(*a, **k)
        setattr(owner, attr, inner)

    wrap(scorer.RewardScorer, "prepare", "tokenize + group")
    wrap(engine.Engine, "_encode_prefix", "prompt pass (one engine)")
    wrap(wave, "encode_prompts", "prompt pass (wave)")
    wrap(plan, "score_prompts", "rows pass + head")
    wrap(engine, "_packed_rows_pass", "rows pass, packed")
    wrap(engine.Engine, "_head_scores", "head")


def profile_best_of_n(out: Path, dry: bool) -> None:
    """(run as a subprocess) Best-of-N calls of the 8B (bf16; dry: tiny, fp32, CPU) under torch.profiler,
    each after a warm-up call of its shape: the first shape's table by kernel (self device time; CPU: self
    CPU time), and for every shape the call's wall time against its summed kernel time and the phases'
    host spans and device times -> out."""
    import random

    import torch

    from rmfast.bench.best_of_n import BestOfNConfig, load_model
    from rmfast.scoring.scorer import RewardScorer

    cuda = not dry
    cfg = BestOfNConfig(random_init="llama-3.2-1b" if dry else WORKLOAD_MODEL, tiny=dry,
                        dtype="float32" if dry else "bfloat16", device="cuda" if cuda else "cpu")
    lm, name, template = load_model(cfg)
    annotate_phases()
    scorer = RewardScorer(lm, cache_prompts=0, template=template)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    key = "self_device_time_total" if cuda else "self_cpu_time_total"  # the kernels on a GPU
    text = []
    for i, (P, N) in enumerate(PROFILE_SHAPES["dry" if dry else "gpu"]):
        rng = random.Random(i)
        convs, responses = best_of_n_inputs(lm, P, N, rng, dry)
        scorer.score(convs, responses)  # warm-up: Triton compiles, cuBLAS picks its kernels
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        scorer.score(convs, responses)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        with torch.profiler.profile(activities=acts) as prof:
            scorer.score(convs, responses)
            if cuda:
                torch.cuda.synchronize()
        ev = prof.key_averages()
        dev_us = sum(getattr(e, key) for e in ev if not e.key.startswith("phase:")
                     and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA))
        head = (f"profile: {name}, {cfg.dtype}, {cfg.device}, one best-of-N call: prompt ~{P} tokens, N={N}: "
                f"{wall * 1e3:.1f} ms wall unprofiled; kernels {dev_us / 1e3:.1f} ms "
                f"({'device' if cuda else 'CPU'} busy {dev_us / 1e3 / (wall * 1e3):.0%} of the wall); "
                f"batches {scorer.last_stats.n_batches}, packed {scorer.last_stats.packed_batches}")
        phases = [e for e in ev if e.key.startswith("phase:")]
        rows = [f"  {e.key:38s} x{e.count:3d}  host span {e.cpu_time_total / 1e3:8.1f} ms"
                + (f"  device {e.device_time_total / 1e3:8.1f} ms" if cuda else "") for e in phases]
        text += [head, *rows]
        if i == 0:
            text.append(f"(sorted by {key})\n" + ev.table(sort_by=key, row_limit=25))
            text.append("(sorted by host time, children included)\n" + ev.table(sort_by="cpu_time_total", row_limit=15))
        if i == len(PROFILE_SHAPES["dry" if dry else "gpu"]) - 1:  # the smallest call: where its host time goes
            text += host_profile(lambda: scorer.score(convs, responses), cuda, f"{P} x {N}")
    text += elementwise_ab(lm, template, cuda, dry)
    text += scan_profile(lm, template, cuda, dry, env_bandwidth(out.parent / "env.json"))
    text += form_crossover(lm, template, cuda, dry)
    text += fuse_ab(lm, template, cuda, dry)
    text += attention_configs(lm, template, cuda, dry, env_bandwidth(out.parent / "env.json"))
    text += call_overhead(cuda, dry)
    out.write_text("\n".join(text) + "\n")
    print(out.read_text())


def host_profile(call, cuda: bool, shape: str, top: int = 20) -> list[str]:
    """The host's side of one call by Python function (cProfile, self time): a GRPO-sized call launches more than
    the GPU computes (run d: 29 ms of host span for a prompt pass the GPU runs in ~11), so this names what the host
    spends it on (the layer's Python, torch's dispatch, Triton's launcher, tokenizing)."""
    import cProfile
    import io
    import pstats

    import torch

    pr = cProfile.Profile()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    pr.enable()
    call()
    pr.disable()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # (file, line, name) -> (cc, calls, self, cum, ..)
    body = [f"  {tt * 1e3:8.2f} ms self {ct * 1e3:8.2f} ms cum {nc:6d} calls  {Path(f).name}:{ln}({fn})"
            for (f, ln, fn), (_, nc, tt, ct, _) in rows]
    return [f"host time of one best-of-N call {shape} by function (cProfile, self time; {wall * 1e3:.1f} ms wall "
            f"profiled, {st.total_tt * 1e3:.1f} ms in Python):", *body]
