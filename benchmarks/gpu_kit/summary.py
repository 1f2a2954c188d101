"""Step 6, collect: the one-screen summary (summary.md): every step's status, the tests, the models' rows, the cost
model, the workloads' tables."""

from __future__ import annotations

from pathlib import Path

from .config import EXPORT


def summarize(out: Path, env: dict, steps: list[dict], tests: dict, models: list[dict], bench_rows: list[dict],
              costs: list[dict], dry: bool, ok: bool, partial: list[str], clock: Clock, left_out: list[str] = ()) -> str:
    from rmfast.bench.flops import format_cost_rows

    verdict = ("PASS" + (f" (partial: {', '.join(partial)}: see status)" if partial else "")) if ok else "FAIL"
    if left_out:
        verdict += f" (left out by --workloads: {', '.join(left_out)})"
    L = [f"# gpu-check{' (DRY RUN: CPU, tiny configs — no GPU numbers)' if dry else ''}: {verdict}", ""]
    dev = env.get("gpu") or f"CPU ({env.get('cpu_count')} cores)"
    L.append(f"{dev}; torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), triton {env.get('triton')}, "
             f"transformers {env.get('transformers')}, python {env.get('python')}; total {clock.elapsed():.0f} s")
    if env.get("matmul"):
        L.append(f"measured: {env['matmul']['dtype']} matmul {env['matmul']['n']}^3 {env['matmul']['tflops']} TFLOP/s; "
                 f"copy {env['copy']['tb_s_read_plus_write']} TB/s (read + write)")
    L.append("")
    c = tests.get("counts", {})
    L.append(f"tests ({tests.get('status', 'not run')}): {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
             f"{c.get('error', 0)} errors, {c.get('skipped', 0)} skipped" + (f" — {tests['note']}" if tests.get("note") else ""))
    for r in tests.get("bad", [])[:8]:
        L.append(f"  {r['outcome']}: {r['test']} {r['message'][:100]}")
    L.append("")
    # the whole vocabulary: measured (the rmfast-full row, `rmfast scan`'s own plan) where --full ran, else the
    # rmfast row's estimate (its set-up, the compile included, plus the vocabulary at its rate)
    L.append("| model | status | rmfast cand/s | × hf-cache | × naive | % GEMM peak | GEMM peak TFLOP/s | full vocab s | agree |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for m in models:
        rm = next((r for r in bench_rows if r["model"] == m.get("label") and r["method"] == "rmfast"), None)
        by = {r["method"]: r for r in bench_rows if r["model"] == m.get("label")}
        if rm is None:
            L.append(f"| {m['name']} | {m['status']} | | | | | | | |")
            continue
        agree = all(r.get("agree_ok") in (True, None) for r in by.values())
        fr = rm.get("frac_gemm_peak")
        pk = rm.get("gemm_peak_gflops")
        full = by.get("rmfast-full")
        fv = (f"{full['full_wall_s']:.1f} measured" if full and full.get("full_wall_s") not in (None, "")
              else f"{rm['est_full_vocab_s']:.1f} est.")
        L.append(f"| {m['name']} | {m['status']} | {rm['cand_per_s']:,.0f} | {by['hf-cache']['rmfast_speedup']:.2f} | "
                 f"{by['naive']['rmfast_speedup']:.1f} | {'–' if fr is None else f'{100 * fr:.1f}%'} | "
                 f"{'–' if pk is None else f'{pk / 1e3:.1f}'} | {fv} | {'yes' if agree else 'NO'} |")
    if costs:
        L += ["", "cost model at the measured GEMM peak (predicted vs measured; fraction = predicted / measured):", "",
              format_cost_rows([r for r in costs if r["method"] in ("naive", "hf-cache", "rmfast")])]
    L += ["", f"files: {out}/ ({', '.join(EXPORT)}; in the tarball also env.json, profile.txt, gpu-check.log and every step's log)"]
    return "\n".join(L)


def _pct(x) -> str:
    """A fraction as a percentage ('' when absent)."""
    try:
        return f"{100 * float(x):.1f}%"
    except (TypeError, ValueError):
        return ""


def summarize_workloads(out: Path, workloads: list[dict], bon_rows: list[dict], states_rows: list[dict],
                        serve_rows: list[dict] = ()) -> str:
    """The workloads' part of the summary: every step's status, the best-of-N, serve and states rows, the
    profile's top."""
    L = ["| step | status | wall s |", "|---|---|---|"]
    L += [f"| {w['step']} | {w['status']} | {w.get('wall_s', '')} |" for w in workloads]
    if bon_rows:
        L += ["", "best-of-N (rmfast RewardScorer vs HF padded batches):", "",
              "| run | dtype | prompt tokens | N x prompts | HF resp/s | rmfast resp/s | speed-up | FLOP ratio "
              "| speed-up / FLOP ratio (target >= 0.85) | rmfast of bf16 bound (target >= 60%) | batches (packed) "
              "| max abs diff |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        L += [f"| {r['run']} | {r['dtype']} | {r['prompt_tokens']} | {r['n_responses']} x {r['n_prompts']} | "
              f"{r['hf_responses_per_s']} | {r['rmfast_responses_per_s']} | {r['speedup']} | {r['flop_ratio']} | "
              f"{r.get('speedup_over_flop_ratio', '')} | {_pct(r.get('rmfast_gemm_fraction'))} | "
              f"{r.get('rmfast_batches', '')} ({r.get('rmfast_packed_batches', '')}) | "
              f"{float(r['max_abs_diff']):.2e} |" for r in bon_rows]
    if serve_rows:
        L += ["", "rmfast serve (one sample per request from concurrent clients) vs the same samples in-process and a "
              "per-request padded HF server:", "",
              "| dtype | groups x N | clients | serve resp/s | in-process resp/s | HF server resp/s | serve / in-process "
              "| serve / HF | FLOP ratio | serve of bound | p50 / p99 s | groups encoded once | waves (lingered) | max abs diff |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        L += [f"| {r['dtype']} | {r['groups']} x {r['n_responses']} | {r['clients']} | {r['serve_responses_per_s']} | "
              f"{r['inprocess_responses_per_s']} | {r['hf_server_responses_per_s']} | {r['serve_over_inprocess']} | "
              f"{r['serve_over_hf_server']} | {r['flop_ratio']} | {_pct(r.get('serve_gemm_fraction'))} | "
              f"{r['serve_p50_s']} / {r['serve_p99_s']} | {r['groups_encoded_once']} | {r.get('serve_waves', '')} "
              f"({r.get('serve_waves_lingered', '')}) | {float(r['max_abs_diff']):.2e} |"
              for r in serve_rows]
    if states_rows:
        L += ["", "states overhead (a scan keeping hidden states vs a plain one):", "",
              "| folder | mode | dtype | candidates | median s | x plain | bytes per candidate | MB/s written | disk limit MB/s "
              "| waited on writer s | disk kept up | same scores |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        L += [f"| {r.get('folder', '')} | {r['mode']} | {r['dtype']} | {r['n_candidates']} | {r['median_s']} | {r['ratio_to_plain']} | "
              f"{r['bytes_per_candidate']} | {r.get('write_mb_s', '')} | {r.get('disk_limit_mb_s', '')} | "
              f"{r.get('writer_wait_s', '')} | {r.get('disk_kept_up', '')} | {r['scores_identical']} |" for r in states_rows]
    prof = out / "profile.txt"
    if prof.exists():
        lines = prof.read_text().splitlines()
        L += ["", "```", *lines[:20], "```"]  # the header and the top kernels
    return "\n".join(L)
