"""What ``rmfast bench`` writes: the CSV and JSON of every row, the bar chart, the Markdown table."""

from __future__ import annotations

import csv
import json
import os
import textwrap
from pathlib import Path

from .machine import log, machine_info

from .models import DEFAULT_OUT  # noqa: E402,F401  (its one definition)
METHODS = ("naive", "hf-cache", "rmfast-eager", "rmfast")


CSV_FIELDS = [
    "model", "method", "head", "device", "dtype", "n_timed", "batch_size", "tokens_per_candidate",
    "tokens_executed_per_candidate", "flops_per_candidate", "executed_flops_per_candidate", "cand_per_s", "cand_per_s_median", "rmfast_speedup",
    "useful_gflops", "gemm_peak_gflops", "gemm_peak_float32_gflops", "gemm_peak_bfloat16_gflops", "bound_dtype",
    "bound_gflops", "frac_gemm_peak", "bound_note", "peak_bound_cand_per_s", "setup_s", "est_full_vocab_s",
    "full_wall_s", "peak_mem_mib", "agree_spearman", "agree_max_abs_diff", "fp32_max_abs_diff", "agree_ok",
    "truth_spearman", "rmfast_truth_spearman",
    "prefix_tokens",
    "suffix_tokens", "vocab", "hf_attention", "gemm_params", "lm_head_params", "gemm_peak_M", "repeats", "pass_s", "loadavg_start",
    "loadavg_end", "cpu_model", "cpu_id", "cpu_kind", "cpu_flags", "isa_env", "dtype_source", "cpu_count", "torch_threads", "gpu", "platform", "torch", "transformers", "rmfast",
    "rmfast_commit", "timestamp", "decisions",
]


def write_outputs(rows: list[dict], meta: dict, out_dir: Path) -> dict:
    """Rows (with the machine and versions) as CSV and JSON, timestamped and as ``bench_latest``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = meta["timestamp"].replace(":", "").replace("-", "")
    flat = []
    for r in rows:
        f = dict(r)
        f.update({k: meta["machine"].get(k) for k in ("cpu_model", "cpu_id", "cpu_kind", "cpu_flags", "isa_env", "cpu_count", "torch_threads",
                                                      "gpu", "platform")})
        f.update({k: meta["versions"].get(k) for k in ("torch", "transformers", "rmfast", "rmfast_commit")})
        f["timestamp"] = meta["timestamp"]
        flat.append(f)
    paths = {}
    for name in (f"bench_{stamp}", "bench_latest"):
        p = out_dir / f"{name}.csv"
        with open(p, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for f in flat:
                w.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in f.items()})
        j = out_dir / f"{name}.json"
        j.write_text(json.dumps({**meta, "rows": flat}, indent=1, default=str))
        paths[name] = (p, j)
    return paths


def append_csv(rows: list[dict], path: str | Path) -> Path:
    """Append ``rows`` (dicts with the same keys) to the CSV at ``path``, its header written when the file is new: a
    benchmark script's ``--out`` (each row names its machine, versions and config)."""
    path = Path(path)
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    return path


def write_workload_rows(rows: list[dict], out: str | Path, config: dict, *, workload: str, stem: str,
                        device: str = "cpu") -> tuple[Path, Path]:
    """A workload's rows (``rmfast bench --workload best-of-n|states``) to ``<out>/<stem>_<timestamp>.csv``
    and ``.json`` (with the machine, versions and config) and the same as ``<stem>_latest``; the timestamped
    paths. Lists in a CSV cell are JSON."""
    import time

    from ..loading.loader import resolve_device
    from ..cpu import versions

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workload": workload,
            "machine": machine_info(resolve_device(device)), "versions": versions(), "config": config}
    fields = list(dict.fromkeys(k for r in rows for k in r))
    for name in (f"{stem}_{stamp}", f"{stem}_latest"):
        with open(out / f"{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()} for r in rows)
        (out / f"{name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str))
    log(f"wrote {out}/{stem}_{stamp}.csv and .json (and {stem}_latest)")
    return out / f"{stem}_{stamp}.csv", out / f"{stem}_{stamp}.json"


def plot(rows: list[dict], path: Path, title: str) -> Path | None:
    """Bar chart of candidates/s per method per model (log scale) with the GEMM-peak bound."""
    from ..analysis.data.deps import plots_available

    if not plots_available("the bench's plot"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in rows))
    colors = {"naive": "#9e9e9e", "hf-cache": "#4c72b0", "rmfast-eager": "#f0b27a", "rmfast": "#dd8452"}
    fig, ax = plt.subplots(figsize=(2.2 + 3.6 * len(models), 5.2))
    width = 0.2
    ymax = 1.0
    for i, m in enumerate(models):
        by = {r["method"]: r for r in rows if r["model"] == m}
        for j, meth in enumerate(METHODS):
            r = by.get(meth)
            if not r:
                continue
            x = i + (j - 1.5) * width
            v = r["cand_per_s"]
            ymax = max(ymax, v)
            ax.bar(x, v, width * 0.92, color=colors[meth], label=meth if i == 0 else None)
            lab = f"{v:,.0f}" if v >= 10 else f"{v:.1f}"
            if meth != "rmfast":
                x_ = r["rmfast_speedup"]
                lab += f"\n(×{x_:,.0f})" if x_ >= 100 else f"\n(×{x_:.1f})"
            ax.text(x, v * 1.08, lab, ha="center", va="bottom", fontsize=8)
        pk = by.get("rmfast", {}).get("peak_bound_cand_per_s")
        if pk:
            ymax = max(ymax, pk)
            ax.hlines(pk, i - 2.1 * width, i + 2.1 * width, colors="crimson", linestyles="--",
                      label="GEMM-peak bound" if not any(t.get_label() == "GEMM-peak bound" for t in ax.collections) else None)
            ax.text(i + 2.1 * width, pk, f" peak\n {pk:,.0f}", color="crimson", fontsize=8, va="center", ha="left")
    ax.set_yscale("log")
    ax.set_ylim(top=ymax * 12)
    ticks = []
    for m in models:
        r = next(r for r in rows if r["model"] == m)
        sub = ("whole vocab, no per-row work" if r.get("whole_vocab_timed")
               else f"{r['head']} head, {r['tokens_per_candidate']} tok/cand")
        ticks.append(f"{m}\n{sub}")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(ticks, fontsize=9)
    ax.set_xlim(-0.6, len(models) - 0.2)
    ax.set_ylabel("candidates / s (log scale; higher is better)")
    # the note below the axes, never over the legend; the title wrapped to the figure's width (issue 37)
    ax.set_xlabel("(×N): rmfast is N× faster", fontsize=8, loc="right")
    ax.set_title(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 14))), fontsize=9)
    ax.grid(axis="y", which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, loc="upper left", fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the measured rows."""
    head = ("| model | method | batch | cand/s | rmfast × | useful GFLOP/s | % GEMM peak | peak mem MiB | "
            "est. full vocab | agrees with rmfast: bf16 ρ, fp32 max abs diff |")
    out = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        if r["method"] == "rmfast-full":
            ug = f"{r['useful_gflops']:,.1f}" if r.get("useful_gflops") is not None else "–"
            out.append(f"| {r['model']} | rmfast full vocab ({r['n_timed']:,}) | {r['batch_size']} | "
                       f"{r['cand_per_s']:,.1f} | | {ug} | | {r['peak_mem_mib']:,.0f} | "
                       f"{r['full_wall_s']:.1f} s wall ({r['full_scan_s']:.1f} s scoring) | |")
            continue
        fr = f"{100 * r['frac_gemm_peak']:.1f}%" if r.get("frac_gemm_peak") is not None else "–"
        ug = f"{r['useful_gflops']:,.1f}" if r.get("useful_gflops") is not None else "–"
        est = r["est_full_vocab_s"]
        est_s = f"{est / 3600:.1f} h" if est > 7200 else (f"{est / 60:.1f} min" if est > 120 else f"{est:.1f} s")
        ag = "(reference)" if r.get("agree_ok") is None else (
            f"{'yes' if r['agree_ok'] else 'NO'}: {r['agree_spearman']:.4f}"
            + (f" (ρ to fp32 truth: rmfast {r['rmfast_truth_spearman']:.4f}, this {r['truth_spearman']:.4f})"
               if r.get("truth_spearman") is not None and r["agree_spearman"] < 0.99 else "")
            + ", " + (f"{r['fp32_max_abs_diff']:.1e}" if r.get("fp32_max_abs_diff") is not None else "–"))
        out.append(f"| {r['model']} | {r['method']} | {r['batch_size']} | {r['cand_per_s']:,.1f} | "
                   f"{r['rmfast_speedup']:,.1f} | {ug} | {fr} | {r['peak_mem_mib']:,.0f} | {est_s} | {ag} |")
    return "\n".join(out)
