"""The bf16 self-audit: how far a reduced-precision scan's ranking can be trusted, measured on the job.

A bf16 (or fp16) scan rescores a seeded sample of its own rows in fp32 (sized to the job,
:func:`audit_size`: a tenth of its rows, at least 32, at most ``--audit N``) and records, in the
manifest, how far the two agree: max and mean |diff|, the Spearman correlation of the sample's
scores, and the overlap of the sample's top k. :func:`rmfast.scoring.pipeline.run_scan` calls
:func:`audit_bf16` for every reduced-precision scan (CLI ``scan --audit N``, sweep ``audit:``);
:func:`audit_line` is the one line the CLI prints.

The fp32 model is a copy made for the audit and dropped right after it. It is built parameter by
parameter (never a second bf16 copy first): on the model's device when it fits there, else on
the CPU when it fits there, else the audit is skipped (and says so).

Example:
    >>> import numpy as np
    >>> a = agreement(np.array([3.0, 2.0, 1.0, 0.5]), np.array([3.1, 1.9, 1.2, 0.4]), k=2)
    >>> a["spearman"], a["top_k"], a["top_k_overlap"], round(a["max_abs_diff"], 3)
    (1.0, 2, 2, 0.2)
"""

from __future__ import annotations

import copy
import gc
import math
import time
from typing import Callable

import numpy as np
import torch

from .batching import available_memory

#: rows rescored in fp32 by default (``--audit N``; 0 turns the audit off)
DEFAULT_AUDIT_N = 512
#: the sample is this fraction of the job's rows (issue 37: 512 rows of a 300-item scan cost 24 s of its 57)
AUDIT_FRACTION = 0.1
#: ... but at least this many rows (fewer say little about a ranking), or all of a smaller job
MIN_AUDIT = 32
#: the sample's seed (fixed: the same job audits the same rows)
DEFAULT_AUDIT_SEED = 0
#: the fp32 copy must fit in this fraction of the memory available where it is made
FIT_FRACTION = 0.5
LOW_PRECISION = (torch.bfloat16, torch.float16)


def top_k_for(n: int) -> int:
    """k of the top-k overlap: 10% of the sample, at most 50 (512 rows -> 50).

    >>> top_k_for(512), top_k_for(100), top_k_for(3)
    (50, 10, 1)
    """
    return max(1, min(50, n // 10))


def audit_size(n_rows: int, cap: int = DEFAULT_AUDIT_N) -> int:
    """Rows the audit of an ``n_rows``-row job rescores: :data:`AUDIT_FRACTION` of them, at least
    :data:`MIN_AUDIT` (all of a smaller job), at most ``cap`` (``--audit N``; 0: none).

    >>> audit_size(49152), audit_size(2000), audit_size(300), audit_size(20), audit_size(300, 0)
    (512, 200, 32, 20, 0)
    """
    if cap <= 0:
        return 0
    return min(cap, n_rows, max(MIN_AUDIT, math.ceil(AUDIT_FRACTION * n_rows)))


def sample_rows(n_rows: int, n: int, seed: int = DEFAULT_AUDIT_SEED) -> np.ndarray:
    """``min(n, n_rows)`` distinct row positions, ascending, drawn with ``seed``.

    >>> sample_rows(10, 4, seed=0).tolist() == sample_rows(10, 4, seed=0).tolist()
    True
    >>> sample_rows(3, 512).tolist()
    [0, 1, 2]
    """
    if n >= n_rows:
        return np.arange(n_rows, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n_rows, size=n, replace=False)).astype(np.int64)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average rank (Spearman's convention)."""
    _, inv, cnt = np.unique(x, return_inverse=True, return_counts=True)
    start = np.cumsum(cnt) - cnt
    return (start + (cnt - 1) / 2.0)[inv]


def agreement(low: np.ndarray, high: np.ndarray, k: int) -> dict:
    """How the low-precision scores ``low`` agree with the fp32 ones ``high`` (same rows), over the rows both scored
    finite (an fp32 rescoring that overflows too: its NaN was ranked as the largest value, and max |diff| was NaN);
    ``n_nonfinite_fp32`` counts the rows left out. Spearman is None where undefined (one row, a constant side)."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    ok = np.isfinite(low) & np.isfinite(high)
    lost = int((~ok).sum())
    low, high = low[ok], high[ok]
    d = np.abs(low - high)
    rl, rh = _ranks(low), _ranks(high)
    rho = float(np.corrcoef(rl, rh)[0, 1]) if low.size > 1 and rl.std() > 0 and rh.std() > 0 else float("nan")
    k = min(k, low.size)
    top = lambda x: set(np.argsort(-x, kind="stable")[:k].tolist())  # noqa: E731  (ties: the earlier row)
    return {"max_abs_diff": float(d.max()) if d.size else None, "mean_abs_diff": float(d.mean()) if d.size else None,
            "spearman": round(rho, 6) if rho == rho else None, "top_k": int(k),
            "top_k_overlap": len(top(low) & top(high)), "n_nonfinite_fp32": lost}


def fp32_copy(model) -> tuple[torch.nn.Module | None, str]:
    """An fp32 copy of ``model`` and where it lives, or (None, why not).

    Floating-point parameters and buffers are cast one by one into the copy (``deepcopy`` with them
    pre-filled), so the peak is the bf16 model + its fp32 copy, never a second bf16 copy.
    """
    if getattr(model, "hf_device_map", None) and len(set(map(str, model.hf_device_map.values()))) > 1:
        return None, "the model is spread over devices (--device-map)"
    p = next(model.parameters())
    need = sum(t.numel() for t in model.parameters()) * 4
    for dev in dict.fromkeys([p.device, torch.device("cpu")]):
        avail = available_memory(dev)
        if avail is not None and need > FIT_FRACTION * avail:
            continue
        memo = {}
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in memo:
                continue
            c = t.detach().to(dev, torch.float32 if t.is_floating_point() else t.dtype)
            memo[id(t)] = torch.nn.Parameter(c, requires_grad=False) if isinstance(t, torch.nn.Parameter) else c
        try:
            m32 = copy.deepcopy(model, memo)
        except torch.OutOfMemoryError:
            memo.clear()
            _free(dev)
            continue
        m32.config.dtype = torch.float32  # (config.torch_dtype: deprecated in transformers 5, logs a warning)
        return m32.eval(), str(dev)
    return None, f"no room for an fp32 copy ({need / 2**30:.1f} GiB)"


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def audit_bf16(model, scores: np.ndarray, rescore: Callable[[torch.nn.Module, np.ndarray], np.ndarray], *,
               n: int = DEFAULT_AUDIT_N, seed: int = DEFAULT_AUDIT_SEED, what: str = "ids",
               job_s: float | None = None) -> dict | None:
    """Rescore a seeded sample of a reduced-precision job's rows in fp32; returns the manifest entry.

    Args:
        model: the job's model, bf16 or fp16 (whether a job is audited is decided once, by its caller
            :func:`rmfast.scoring.pipeline.run_scan`: a reduced-precision model and ``n`` > 0).
        scores: (N,) the job's scores, in row order; the sample is drawn from the finite ones.
        rescore: ``rescore(fp32_model, rows) -> (len(rows),)`` fp32 scores of those row positions.
        n: the most rows to rescore (default 512, at least 1); the sample is
            :func:`audit_size` of the job's finite rows.
        seed: the sample's seed (default 0).
        what: what a row is, for the printed line ("ids" or "texts").
        job_s: the job's own scoring time, recorded so the line can say what the audit added.

    Returns:
        {"dtype", "n", "seed", "rows", "max_abs_diff", "mean_abs_diff", "spearman", "top_k", "top_k_overlap",
        "fp32_on", "wall_s"}, or {"skipped": why} when no fp32 copy fits.
    """
    dtype = next(model.parameters()).dtype
    if not np.isfinite(scores).any():  # no finite score: nothing to rank
        return None
    t0 = time.perf_counter()
    finite = np.flatnonzero(np.isfinite(scores))  # a NaN score (an overflow) has no ranking to audit
    rows = finite[sample_rows(finite.size, audit_size(finite.size, n), seed)]
    m32, where = fp32_copy(model)
    if m32 is None:
        return {"dtype": str(dtype).replace("torch.", ""), "n": 0, "seed": seed, "skipped": where}
    try:
        ref = np.asarray(rescore(m32, rows), dtype=np.float64)
    finally:
        del m32
        _free(next(model.parameters()).device)
    return {"dtype": str(dtype).replace("torch.", ""), "n": int(rows.size), "seed": seed, "rows": what,
            **agreement(np.asarray(scores)[rows], ref, top_k_for(rows.size)), "fp32_on": where,
            "wall_s": round(time.perf_counter() - t0, 3), "job_s": None if job_s is None else round(job_s, 3)}


def audit_line(a: dict | None) -> str | None:
    """The one line a scan prints about its audit (None when there was none).

    >>> audit_line({"dtype": "bfloat16", "n": 512, "seed": 0, "max_abs_diff": 0.047, "mean_abs_diff": 0.01,
    ...             "spearman": 0.9981, "top_k": 50, "top_k_overlap": 47, "fp32_on": "cpu", "wall_s": 3.12,
    ...             "job_s": 52.0})
    "bf16 audit: 512 ids rescored in fp32: Spearman 0.998, top-50 overlap 47/50, max |diff| 0.047, mean 0.01 (3.1 s, +6% on the scan's 52.0 s)"
    """
    if not a:
        return None
    tag = {"bfloat16": "bf16", "float16": "fp16"}.get(a.get("dtype"), a.get("dtype"))
    if a.get("skipped"):
        return f"{tag} audit skipped: {a['skipped']}"
    if a.get("max_abs_diff") is None and a.get("n_nonfinite_fp32"):  # nothing left to compare
        return (f"{tag} audit: {a['n']} {a.get('rows', 'ids')} rescored in fp32, and every one came out NaN or infinite "
                f"there too: nothing to compare ({a['wall_s']:.1f} s{_cost(a)})")
    rho = a.get("spearman")
    rho = "undefined (one row, or one score)" if rho is None or rho != rho else f"{rho:.3f}"
    lost = f"; {a['n_nonfinite_fp32']} NaN or infinite in fp32 too, left out" if a.get("n_nonfinite_fp32") else ""
    return (f"{tag} audit: {a['n']} {a.get('rows', 'ids')} rescored in fp32: Spearman {rho}, top-{a['top_k']} overlap "
            f"{a['top_k_overlap']}/{a['top_k']}, max |diff| {a['max_abs_diff']:.3g}, mean {a['mean_abs_diff']:.2g}{lost} "
            f"({a['wall_s']:.1f} s{_cost(a)})")


def _cost(a: dict) -> str:
    """What the audit added to the job, in words (", +6% on the scan's 52.0 s"; "" when the job's time is unknown).
    A scan of under 0.1 s (one forward pass: a template with no end of turn) gets that, not a percent ("+123000% on
    the scan's 0.0 s").

    >>> _cost({"wall_s": 1.2, "job_s": 0.001})
    '; the scan itself took under 0.1 s'
    """
    job = a.get("job_s")
    if not job:
        return ""
    if job < 0.1:
        return "; the scan itself took under 0.1 s"
    return f", +{100 * a['wall_s'] / job:.0f}% on the scan's {job:.1f} s"
