"""Steps 3 and 5, the benchmarks: `rmfast bench --random-init NAME` per model of the plan, its baselines' batches
planned for the card, skipped where the budget cannot hold it."""

from __future__ import annotations

import sys
from pathlib import Path

from .config import CUDA_RESERVE, GUARD_MARGIN
from .steps import run_step, say


def bench_cmd(name: str, out: Path, dry: bool, plan: dict, check_n: int) -> list[str]:
    cmd = [sys.executable, "-m", "rmfast", "bench", "--random-init", name, "--out", str(out), "--no-plot"]
    if dry:
        return cmd + ["--tiny", "--layers", "2", "--device", "cpu", "--dtype", "float32", "--n-candidates", "48",
                      "--n-naive", "16", "--naive-batch", "16", "--hf-batch", "24", "--repeats", "1", "--check-n", "8",
                      "--compile", "off", "--threads", "1"]
    return cmd + ["--device", "cuda", "--dtype", "bfloat16", "--n-candidates", str(plan["n"]), "--n-naive",
                  str(plan["n_naive"]), "--hf-batch", plan["hf_batch"], "--naive-batch", plan["naive_batch"],
                  "--repeats", "2", "--check-n", str(check_n)] + (["--full"] if plan.get("full") else []) + (
                  # item 3 of issue 33: the layer compiled around the Triton kernel, timed beside the eager one; the
                  # whole vocabulary as `rmfast scan` runs it by default (auto: eager on a GPU, no compile in its wall)
                  ["--compile", "on", "--full-compile", "auto"] if plan.get("compile") else [])


def pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def plan_batches(plan: dict, gpu_mem_bytes: int, lm=None) -> dict:
    """``plan`` with its baseline batch options lowered to what ``rmfast bench``'s memory guard allows on a card
    of ``gpu_mem_bytes`` (:func:`rmfast.bench.memory_check.largest_batches`, the guard's own rule), so no
    model is refused before timing (the first H100 run: --hf-batch 2048 for the 8B, 512 for the 27B).

    The free memory the guard will read is planned as the card's less the bf16 weights and
    :data:`CUDA_RESERVE`, and the batches stay within :data:`GUARD_MARGIN` of its limit: an option over it
    is dropped and the largest power of two under the limit takes its place. ``lm``: the model's shapes
    (default :func:`rmfast.bench.random_init.random_init_shapes`, the meta device: no memory). Adds
    ``guard`` (the planned free memory and the limits) to the returned copy.
    """
    import torch

    from rmfast.bench.memory_check import largest_batches, row_estimates
    from rmfast.bench.models import DEFAULT_PROMPT
    from rmfast.bench.random_init import random_init_shapes

    lm = lm or random_init_shapes(plan["name"], dtype=torch.bfloat16)
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    free = int(gpu_mem_bytes) - weights - CUDA_RESERVE
    out = dict(plan)
    if free <= 0:
        out["guard"] = {"free_bytes": free, "note": "the bf16 weights do not fit"}
        return out
    fits = largest_batches(row_estimates(lm, DEFAULT_PROMPT, "score"), free)
    out["guard"] = {"free_bytes": free, "weights_bytes": weights, **{k.strip("-"): v for k, v in fits.items()}}
    for key, opt, rows in (("hf_batch", "--hf-batch", plan["n"]), ("naive_batch", "--naive-batch", plan["n_naive"])):
        cap = max(1, int(GUARD_MARGIN * fits[opt]))
        nominal = [int(x) for x in str(plan[key]).split(",")]
        keep = {o for o in nominal if min(o, rows) <= cap}
        if len(keep) < len(nominal):
            keep.add(pow2_floor(cap))
        out[key] = ",".join(str(o) for o in sorted(keep))
    return out


def model_fit(name: str, env: dict) -> tuple[bool, int, str]:
    """(runs, fp32-check size, why): bf16 weights + 12 GiB must fit; the fp32 check needs 4 bytes per parameter."""
    from rmfast.bench.random_init import param_count

    mem = env.get("gpu_mem_bytes") or 0
    n = param_count(name)
    if 2 * n + 12 * 2**30 > mem:
        return False, 0, f"{n / 1e9:.1f}B parameters: bf16 weights {2 * n / 2**30:.0f} GiB + 12 GiB > {mem / 2**30:.0f} GiB"
    check = 64 if 4 * n + 6 * 2**30 < mem else 0
    return True, check, f"{n / 1e9:.2f}B parameters" + ("" if check else "; no fp32 check (an fp32 copy does not fit)")


def bench_model(name: str, plan: dict | None, ctx: dict) -> dict:
    """One model's `rmfast bench` step (its batch options planned for the card: :func:`plan_batches`); its record."""
    from rmfast.bench.random_init import label

    dry, clock, log = ctx["dry"], ctx["clock"], ctx["log"]
    plan = plan or {"name": name, "n": 8192, "n_naive": 512, "hf_batch": "256,1024", "naive_batch": "128,256", "est_s": 90}
    m = {"name": name, "label": label(name, layers=2, tiny=True) if dry else label(name)}
    est = 5 if dry else plan["est_s"]
    check_n = 8
    if not dry:
        fits, check_n, why = model_fit(name, ctx["env"])
        m["fit"] = why
        if not fits:
            m["status"] = f"skipped: does not fit ({why})"
            say(f"{name}: {m['status']}", log)
            return m
    if clock.left() < est:
        m["status"] = f"skipped: {max(0, clock.left()):.0f} s of budget left, needs ~{est} s"
        say(f"{name}: {m['status']}", log)
        return m
    if not dry:
        plan = plan_batches(plan, ctx["env"].get("gpu_mem_bytes") or 0)
        m["guard"] = plan["guard"]
    st = run_step(f"bench-{name}", bench_cmd(name, ctx["out"] / "bench" / name, dry, plan, check_n), ctx["out"] / "steps",
                  clock.left(), log)
    ctx["steps"].append(st)
    lowered = lowered_after_refusal(plan, (ctx["out"] / st["log"]).read_text(errors="replace")) if st["rc"] == 2 else None
    if lowered is not None and clock.left() >= est:  # the guard measured less free memory than planned: once more
        m["replanned"] = {k: lowered[k] for k in ("hf_batch", "naive_batch")}
        say(f"{name}: refused by the memory guard; again with {m['replanned']}", log)
        st = run_step(f"bench-{name}-lowered", bench_cmd(name, ctx["out"] / "bench" / name, dry, lowered, check_n),
                      ctx["out"] / "steps", clock.left(), log)
        ctx["steps"].append(st)
    m["rc"], m["check_n"], m["failed"] = st["rc"], check_n, False
    disagree = st["rc"] == 1 and "scores disagree" in (ctx["out"] / st["log"]).read_text(errors="replace")
    if st["rc"] == 0:
        m["status"] = "ok"
    elif st["rc"] is None:
        m["status"] = f"cut at the budget ({st['wall_s']:.0f} s)"
    elif disagree and check_n == 0:
        # bf16 ranks below the HF-vs-HF floor and no fp32 truth to judge them by: not verified, not wrong
        m["status"] = "bf16 ranks unverified (no fp32 truth: an fp32 copy does not fit)"
    else:
        m["status"], m["failed"] = ("DISAGREES" if disagree else f"FAILED ({st['status']})"), True
    return m


def lowered_after_refusal(plan: dict, log_text: str) -> dict | None:
    """``plan`` with the batch options the bench's memory guard named in its one-line refusal ("give --hf-batch
    N or less") lowered to at most N (the largest power of two under it where an option was over), or None
    when the log holds no such line (any other failure is not retried).

    >>> lowered_after_refusal({"hf_batch": "512,2048", "naive_batch": "128"}, "... give --hf-batch 1849 or less")
    {'hf_batch': '512,1024', 'naive_batch': '128'}
    """
    import re

    found = re.findall(r"give --(hf|naive)-batch (\d+) or less", log_text)
    if not found:
        return None
    out = dict(plan)
    for which, n in found:
        key, cap = f"{which}_batch", int(n)
        nominal = [int(x) for x in str(plan[key]).split(",")]
        keep = {o for o in nominal if o <= cap} | {pow2_floor(cap)}
        out[key] = ",".join(str(o) for o in sorted(keep))
    return out
