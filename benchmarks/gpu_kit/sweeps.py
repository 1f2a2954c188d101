"""The profile's A/B runs and sweeps on the 8B's shapes: elementwise kernels on/off, the scan's GEMM share against
its cost model, the attention forms by row length, fused vs separate projections, the attention kernels' launch
configurations, a scorer call's fixed host cost."""

from __future__ import annotations

import json
from pathlib import Path

from .config import CROSSOVER, GEMM_KERNEL, PROFILE_SHAPES, TUNE


def scan_template(lm, template):
    """The profile's scans: the default prompt on the model's template."""
    from rmfast.template import build_template

    return build_template(lm.tokenizer, "What, in one word, is the greatest thing ever?", template=template)


def best_of_n_inputs(lm, P: int, N: int, rng, dry: bool) -> tuple[list[str], list[list[str]]]:
    """One prompt of ~P tokens and N responses of 20-200 tokens (dry: 4-24), drawn from ``rng``."""
    from rmfast.bench.best_of_n import text_of

    lo, hi = (4, 24) if dry else (20, 200)
    return [text_of(lm.tokenizer, P, rng)], [[text_of(lm.tokenizer, rng.randint(lo, hi), rng) for _ in range(N)]]


def best_wall(fn, cuda: bool, reps: int = 3) -> float:
    import torch

    from rmfast.bench.machine import best_wall

    return best_wall(fn, torch.device("cuda" if cuda else "cpu"), reps)


def elementwise_ab(lm, template, cuda: bool, dry: bool) -> list[str]:
    """The layer's elementwise kernels on vs off (the plan's "elementwise" decision forced to torch), in this one
    process: best-of-N calls (best of 3 each) and a plain scan of one-token candidates."""
    import random

    import torch

    from rmfast.fast.engine import Engine
    from rmfast.scoring import decisions
    from rmfast.scoring.scorer import RewardScorer

    rule, lines = decisions.fused_elementwise, ["elementwise kernels on vs off (the same process; best of 3):"]
    shapes = PROFILE_SHAPES["dry" if dry else "gpu"]
    for i, (P, N) in enumerate(shapes):
        rng = random.Random(100 + i)
        convs, responses = best_of_n_inputs(lm, P, N, rng, dry)
        walls = {}
        for on in (True, False):
            decisions.fused_elementwise = rule if on else (lambda *a: False)
            try:
                sc = RewardScorer(lm, cache_prompts=0, template=template)
                sc.score(convs, responses)  # warm-up
                walls[on] = best_wall(lambda: sc.score(convs, responses), cuda)
                picked = sc.last_stats.decisions.get("elementwise", {}).get("value")
            finally:
                decisions.fused_elementwise = rule
            lines.append(f"  best-of-N {P} x {N}: elementwise {picked}: {walls[on] * 1e3:.1f} ms")
        lines.append(f"  best-of-N {P} x {N}: off / on = {walls[False] / walls[True]:.3f}")
    tmpl = scan_template(lm, template)
    n = 64 if dry else 8192
    ids = torch.randint(10, min(2000, lm.model.config.vocab_size), (n, 1), device=next(lm.model.parameters()).device)
    walls = {}
    for on in (True, False):
        eng = Engine(lm.model, tmpl, head="score", elementwise=None if on else False)  # None: the engine rule
        eng.score(ids)
        walls[on] = best_wall(lambda: eng.score(ids), cuda)
        lines.append(f"  scan {n} one-token candidates, eager, elementwise {'rule' if on else 'off'} "
                     f"({eng.layers[0][1].fused}): {walls[on] * 1e3:.1f} ms, {n / walls[on]:,.0f} cand/s")
    lines.append(f"  scan: off / on = {walls[False] / walls[True]:.3f}")
    return lines


def env_bandwidth(path: Path) -> float | None:
    """The env step's measured copy bandwidth (TB/s, read + write), None where it is not on record."""
    try:
        return float(json.loads(path.read_text())["copy"]["tb_s_read_plus_write"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scan_profile(lm, template, cuda: bool, dry: bool, bandwidth_tb_s: float | None = None) -> list[str]:
    """The exhaustive scan's batch as the whole vocabulary runs it (the plan's auto rows, eager): its rate beside a
    batch of 8,192 rows, and one batch under torch.profiler: device time in GEMMs against the rest, by kernel.
    What is left between the scan and the GEMM peak, named (issue 33: the whole vocabulary's <= 6.5 s)."""
    import torch

    from rmfast.fast.engine import Engine
    from rmfast.scoring.decisions import choose_rows_per_batch

    tmpl = scan_template(lm, template)
    eng = Engine(lm.model, tmpl, head="score")
    rows = choose_rows_per_batch(lm.model, tmpl, "score", 1, True, "auto")
    dev, V = next(lm.model.parameters()).device, lm.model.config.vocab_size
    lines = [f"scan batches (eager, elementwise {eng.layers[0][1].fused}; the whole vocabulary's auto rows: {rows}; "
             "best of 3):"]
    for n in sorted({64 if dry else 8192, rows}):
        ids = torch.randint(10, V, (n, 1), device=dev)
        eng.score(ids)  # warm-up: this row count's kernels
        wall = best_wall(lambda: eng.score(ids), cuda)
        lines.append(f"  {n} rows: {wall * 1e3:.1f} ms, {n / wall:,.0f} cand/s")
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        eng.score(ids)
        if cuda:
            torch.cuda.synchronize()
    ev = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    mine = [e for e in ev if (e.device_type == torch.autograd.DeviceType.CUDA) == cuda and getattr(e, key) > 0
            and (cuda or e.key.startswith("aten::"))]
    total = sum(getattr(e, key) for e in mine) or 1
    gemm = sum(getattr(e, key) for e in mine if GEMM_KERNEL.search(e.key))
    lines.append(f"  one {rows}-row batch profiled: {'kernels' if cuda else 'aten ops'} {total / 1e3:.1f} ms, GEMMs "
                 f"{gemm / 1e3:.1f} ms ({gemm / total:.1%}), the rest {(total - gemm) / 1e3:.1f} ms; by "
                 f"{'kernel' if cuda else 'op'} (self time):")
    for e in sorted(mine, key=lambda e: -getattr(e, key))[:20]:
        t = getattr(e, key)
        lines.append(f"    {t / 1e3:8.2f} ms {t / total:6.1%} x{e.count:<5d} {'GEMM ' if GEMM_KERNEL.search(e.key) else '     '}"
                     f"{e.key[:110]}")
    if bandwidth_tb_s:  # the per-kernel model (rmfast.bench.layer_cost) at the measured GEMM time and copy bandwidth
        from rmfast.bench.layer_cost import scan_batch_cost
        from rmfast.dims import model_dims

        shape = dict(rows=rows, row_tokens=1 + len(tmpl.suffix_ids), prompt=len(tmpl.prefix_ids),
                     sandwich=eng.layers[0][1].sandwich)
        dims = model_dims(lm.model.config)
        tflop = scan_batch_cost(dims, **shape, peak_tflops=1.0, bandwidth_tb_s=1.0)["gemm_tflop"]
        rate = tflop / max(gemm, 1e-9) * 1e6  # TFLOP/s of the profiled GEMMs (gemm: microseconds)
        c = scan_batch_cost(dims, **shape, peak_tflops=rate, bandwidth_tb_s=bandwidth_tb_s)
        lines.append(f"  the per-kernel model (rmfast.bench.layer_cost) at the GEMMs' measured {rate:,.1f} TFLOP/s and "
                     f"the copy's {bandwidth_tb_s} TB/s: the rest (elementwise + attention) "
                     f"{c['elementwise_ms'] + c['attention_ms']:.1f} ms predicted, {(total - gemm) / 1e3:.1f} ms measured")
    return lines


def call_overhead(cuda: bool, dry: bool) -> list[str]:
    """A scorer call's fixed host cost on this device (benchmarks/scorer_call_overhead.py: the weights check fresh
    vs with kept views, the eval-mode switch; predicted ~15 ms less per call on the GPU host, never measured)."""
    import contextlib
    import io

    import scorer_call_overhead

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        scorer_call_overhead.main(["--layers", "4" if dry else "32", "--device", "cuda" if cuda else "cpu"])
    return ["a scorer call's fixed host cost (benchmarks/scorer_call_overhead.py, best of 5 x 50):",
            *[f"  {line}" for line in buf.getvalue().splitlines()]]


def attention_configs(lm, template, cuda: bool, dry: bool, bandwidth_tb_s: float | None) -> list[str]:
    """Issue 54, item 4: the shared-prefix kernel's launch configurations on the scan's shapes (its middle layers: every
    row position a query; its last: the final position only) beside the bandwidth model's bytes, and the cascade's
    prompt part's on a best-of-N wave, each against the plan's own (rmfast.bench.attention_tune). CUDA, or the
    interpreter in a dry run (TRITON_INTERPRET=1 before triton's import: the tests' subprocess)."""
    import torch

    from rmfast.bench import attention_tune as at
    from rmfast.dims import model_dims
    from rmfast.kernels import triton_attention

    if not triton_attention.HAVE_TRITON or not (
            cuda or type(triton_attention._shared_prefix_attn_kernel).__name__ == "InterpretedFunction"):
        return ["attention configurations: skipped (the Triton kernels need CUDA, or TRITON_INTERPRET=1 on a CPU)"]
    from rmfast.scoring.decisions import choose_rows_per_batch

    tmpl = scan_template(lm, template)
    d, dev = model_dims(lm.model.config), next(lm.model.parameters()).device
    dtype = next(lm.model.parameters()).dtype
    cfg = TUNE["dry" if dry else "gpu"]
    rows = cfg["scan_rows"] or choose_rows_per_batch(lm.model, tmpl, "score", 1, True, "auto")
    S, P, reps = 1 + len(tmpl.suffix_ids), len(tmpl.prefix_ids), 1 if dry else 5
    bw = f"the copy's {bandwidth_tb_s} TB/s" if bandwidth_tb_s else "the copy bandwidth (none on record: the env step)"
    lines = [f"attention configurations (best of {reps}; max |diff| against the plan's own; 'of bw': the bandwidth "
             f"model's bytes at {bw}):"]
    for what, Sq in (("middle layers", S), ("last layer", 1)):
        shape = dict(rows=rows, heads=d.heads, kv_heads=d.kv_heads, suffix=S, queries=Sq, prompt=P, head_dim=d.head_dim)
        _, res = at.tune_shared_prefix(**shape, dtype=dtype, device=dev, reps=reps,
                                       tries=at.SHARED_PREFIX_TRIES[-(cfg["tries"] or 99):])
        lines.append(f"  shared-prefix kernel, the scan's {what}: {rows} rows x {S} tokens, "
                     f"{Sq} {'query' if Sq == 1 else 'queries'} a row, "
                     f"prompt {P}:")
        lines += at.table(res, bytes_=at.shared_prefix_bytes(**shape, elem=torch.tensor([], dtype=dtype).element_size()),
                          bandwidth_tb_s=bandwidth_tb_s)
    n, L, P = cfg["bon"]
    _, res = at.tune_prompt_part(rows=n, row_tokens=L, heads=d.heads, kv_heads=d.kv_heads, prompt=P,
                                 head_dim=d.head_dim, dtype=dtype, device=dev, reps=reps,
                                 tries=at.PROMPT_PART_TRIES[-(cfg["tries"] or 99):])
    lines.append(f"  cascade prompt part, a best-of-N wave: {n} rows x {L} tokens packed, prompt {P}:")
    lines += at.table(res, flops=at.prompt_part_flops(tokens=n * L, heads=d.heads, prompt=P, head_dim=d.head_dim))
    return lines


def form_crossover(lm, template, cuda: bool, dry: bool) -> list[str]:
    """Rows of one length through both attention forms, the shared-prefix Triton kernel and the cascade (a dry run:
    the CPU's eager form and the cascade's torch twin), ~the same tokens per batch at every length: where the
    cascade starts to win, against the plan's threshold (decisions.CASCADE_MIN_ROW_TOKENS)."""
    import torch

    from rmfast.fast.engine import Engine
    from rmfast.scoring.decisions import CASCADE_MIN_ROW_TOKENS

    tmpl = scan_template(lm, template)
    cfg, forms = CROSSOVER["dry" if dry else "gpu"], ("cpu-flash", "cascade") if dry else ("triton", "cascade")
    engs = {f: Engine(lm.model, tmpl, head="score", attention=f) for f in forms}
    dev, V, suffix = next(lm.model.parameters()).device, lm.model.config.vocab_size, len(tmpl.suffix_ids)
    lines = [f"attention forms by row length (rows of one length, ~{cfg['tokens']} row tokens a batch, best of 3; "
             f"the plan's threshold: cascade above {CASCADE_MIN_ROW_TOKENS} row tokens, measured on the H100 2026-11-27):",
             f"  {'row tokens':>10s} {'rows':>6s} " + " ".join(f"{f + ' ms':>12s}" for f in forms) + "   faster"]
    last_first = None
    for t in cfg["row_tokens"]:
        n = max(1, t - suffix)  # response tokens
        rows = max(1, cfg["tokens"] // (n + suffix))
        ids = torch.randint(10, V, (rows, n), device=dev)
        walls = {}
        for f, eng in engs.items():
            eng.score(ids)  # warm-up: this shape's kernels
            walls[f] = best_wall(lambda eng=eng: eng.score(ids), cuda)
        win = min(walls, key=walls.get)
        last_first = t if win == forms[0] else last_first
        lines.append(f"  {n + suffix:10d} {rows:6d} " + " ".join(f"{walls[f] * 1e3:12.2f}" for f in forms) + f"   {win}")
    lines.append(f"  measured: {forms[0]} last faster at {last_first} row tokens (the plan's threshold: "
                 f"{CASCADE_MIN_ROW_TOKENS})")
    return lines


def fuse_ab(lm, template, cuda: bool, dry: bool) -> list[str]:
    """q|k|v and gate|up as one GEMM weight each (``--projections fused``: a copy of ~2/3 of the weights) vs the
    model's own separate projections (what ``auto`` runs on CUDA), in this one process: a scan batch of 8,192 rows and
    the profile's best-of-N calls (best of 3 each). Whether the copy's memory buys speed on a GPU."""
    import random

    import torch

    from rmfast.scoring.decisions import decide
    from rmfast.scoring.options import ScoringOptions
    from rmfast.scoring.plan import plan_scoring
    from rmfast.scoring.scorer import RewardScorer

    tmpl = scan_template(lm, template)
    auto = decide(lm.model, ScoringOptions(), "scan", template=tmpl, response_tokens=1).reasons["projections"]["value"]
    lines = [f"fused q|k|v and gate|up weights vs separate (auto: {auto} on this device; best of 3):"]
    n = 64 if dry else 8192
    ids = torch.randint(10, lm.model.config.vocab_size, (n, 1))
    walls = {}
    for proj in ("separate", "fused"):
        plan = plan_scoring(lm.model, tmpl, ScoringOptions(compile="off", projections=proj), response_tokens=1)
        plan.score(ids, n)
        walls[proj] = best_wall(lambda: plan.score(ids, n), cuda)
        del plan
    lines.append(f"  scan {n} rows: separate {walls['separate'] * 1e3:.1f} ms, fused {walls['fused'] * 1e3:.1f} ms, "
                 f"separate / fused = {walls['separate'] / walls['fused']:.3f}")
    for i, (P, N) in enumerate(PROFILE_SHAPES["dry" if dry else "gpu"]):
        rng = random.Random(200 + i)
        convs, responses = best_of_n_inputs(lm, P, N, rng, dry)
        for proj in ("separate", "fused"):
            sc = RewardScorer(lm, cache_prompts=0, template=template, options=ScoringOptions(projections=proj))
            sc.score(convs, responses)  # warm-up
            walls[proj] = best_wall(lambda: sc.score(convs, responses), cuda)
            del sc
        lines.append(f"  best-of-N {P} x {N}: separate {walls['separate'] * 1e3:.1f} ms, fused "
                     f"{walls['fused'] * 1e3:.1f} ms, separate / fused = {walls['separate'] / walls['fused']:.3f}")
    return lines
