"""One model configuration through every method: setup, rmfast (compiled and eager), the GEMM peak,
hf-cache, naive, agreement, the optional full-vocabulary scan, and the rows that record them."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..cpu import recorded
from ..dims import model_dims as config_dims
from .baselines import (HFCacheScorer, agreement, float64_scores, fp32_check, fp32_rounding_tol, naive_scorer,
                        set_attention)
from .flops import engine_gemm_shapes, flag_over_bound, flops_per_candidate, gemm_peak, model_dims
from .machine import (PeakMemory, batch_options, chunks, loadavg, log, pick_batch, say_clamped, sync, time_batches,
                      time_calls)
from .models import BenchModel


def candidate_ids(n_vocab: int, n: int, seed: int = 0) -> np.ndarray:
    """n ids spread over the whole vocabulary (seeded), in random order so any prefix is a fair sample."""
    rng = np.random.default_rng(seed)
    return rng.permutation(n_vocab)[: min(n, n_vocab)].astype(np.int64)


def device_defaults(device: torch.device) -> dict:
    """Sample sizes, batch-size options, repeats and fp32-check size for the device type."""
    if device.type == "cuda":
        return {"n_candidates": 65536, "n_naive": 4096, "naive_batches": (256, 1024), "hf_batches": (512, 2048),
                "repeats": 3, "check_n": 256, "truth_n": 4096}
    return {"n_candidates": 2048, "n_naive": 128, "naive_batches": (32, 64, 128), "hf_batches": (64, 128, 256),
            "repeats": 3, "check_n": 32, "truth_n": 256}


@dataclass
class BenchRun:
    """The state one model configuration's measurements share.

    ``ids`` (n,) are the timed candidates (naive times its first ``n_naive``). The rmfast step sets
    ``eng``, ``tpr`` (tokens a candidate row runs through the layers), ``whole`` (no per-row work:
    the whole vocabulary is timed, prompt pass included), ``compile_rm`` and ``compile_s``.
    """

    cfg: BenchModel
    lm: object
    args: object
    device: torch.device
    dflt: dict
    head: str
    tmpl: object
    dtype: torch.dtype
    n_vocab: int
    dims: dict
    mem: PeakMemory
    n: int
    n_naive: int
    reps: int
    ids: np.ndarray
    load_start: list[float] | None
    hf_attention: str = "sdpa"  # the baselines' attention implementation (set_attention)
    eng: object = None
    tpr: int = 0
    whole: bool = False
    compile_rm: bool = False
    compile_s: float | None = None
    decisions: dict | None = None  # the plan's decisions with their reasons (every row records them)

    @property
    def model(self):
        return self.lm.model


@dataclass
class Timed:
    """One method's measurement: scores of the last pass, seconds per pass, and what it ran with."""

    scores: np.ndarray
    times: list[float]
    batch_size: int
    setup_s: float = 0.0
    mem_mib: float = 0.0
    probe: dict | None = None
    decisions: dict | None = None  # the plan that ran it, where it is not the bench's (rmfast-eager's own)


def prepare(cfg: BenchModel, lm, args, device: torch.device, dflt: dict) -> BenchRun:
    """Head, template, dimensions and the candidate sample of one configuration."""
    from ..scoring.plan import default_head
    from ..template import build_template
    from ..scoring.candidates import vocab_size

    model, tok = lm.model, lm.tokenizer
    # the baselines' attention: transformers' default (sdpa), what a user runs; eager where the model refuses it
    attention, note = set_attention(model, getattr(args, "hf_attention", None) or "sdpa")
    if note:
        log(f"  note: {note}")
    head = default_head(model) if cfg.head == "auto" else cfg.head
    tmpl_str = cfg.template if cfg.template is not None else lm.default_template
    tmpl = build_template(tok, args.prompt, template=tmpl_str)
    dtype = next(model.parameters()).dtype
    n_vocab = vocab_size(model, tok)
    dims = model_dims(model, head)
    mem = PeakMemory(device)
    asked = args.n_candidates or dflt["n_candidates"]
    reps = args.repeats or dflt["repeats"]
    ids = candidate_ids(n_vocab, asked, seed=args.seed)
    n = ids.size  # at most the vocabulary: naive times its first n_naive of these (its rate was n_naive over ids.size)
    n_naive = min(args.n_naive or dflt["n_naive"], n)
    if n < asked or n_naive < (args.n_naive or 0):
        log(f"  note: this vocabulary has {n_vocab:,} ids: {n:,} candidates timed (asked {asked:,})"
            + (f", naive {n_naive:,} (asked {args.n_naive:,})" if args.n_naive and n_naive < args.n_naive else ""))
    return BenchRun(cfg, lm, args, device, dflt, head, tmpl, dtype, n_vocab, dims, mem, n, n_naive, reps, ids,
                    loadavg(), attention)


def _eager(model, tmpl, head):
    """The eager plan of the bench (rmfast-eager, and the prompt pass timed whole): its ``eng`` and ``decisions``."""
    from ..scoring.plan import plan_scoring

    return plan_scoring(model, tmpl, head=head, compile="off", job="bench", response_tokens=1)


def time_rmfast(b: BenchRun) -> tuple[Timed, Timed | None]:
    """rmfast (the compiled CPU layer where it applies) and rmfast-eager (the same engine, not compiled)."""
    from ..scoring.plan import plan_scoring

    device, args, model, tmpl, head = b.device, b.args, b.model, b.tmpl, b.head
    b.mem.reset()
    sync(device)
    t0 = time.perf_counter()
    # the bench's plan: compile auto times the compiled layer beside the eager one on every CPU (its job rule)
    plan = plan_scoring(model, tmpl, head=head, compile=args.compile, batch_size=args.batch_size or "auto",
                        job="bench", response_tokens=1)
    b.compile_rm, b.decisions = plan.compile, plan.decisions
    b.eng = eng = plan.eng
    sync(device)
    setup_rm = time.perf_counter() - t0
    b.tpr = eng.tokens_per_row(1)
    # No per-row work (logprob head, empty continuation): every candidate's score is one entry of the
    # prompt pass's log-softmax. Then the prompt pass IS the work: rmfast and hf-cache are timed over the
    # whole vocabulary, prompt pass included (setup_s = 0), and candidates/s is the full-scan rate.
    b.whole = b.tpr == 0
    if b.whole:
        b.ids = candidate_ids(b.n_vocab, b.n_vocab, seed=args.seed)  # same permutation: naive's ids are its first ones
        b.n = b.ids.size
    ids, n, reps = b.ids, b.n, b.reps
    rows = plan.rows_per_batch(1)  # a scan's batch; timed as equal batches of at most that many rows, so
    bs_rm = -(-n // -(-n // rows))  # no timed batch is padded (a scan pads only its last; --full times one)
    t_eg = s_eg = d_eg = None
    if b.whole:
        def run_rm():
            e = _eager(model, tmpl, head).eng
            return [e.score(torch.from_numpy(c)[:, None]) for c in chunks(ids, bs_rm)]

        run_rm()  # warm-up
        s_rm, t_rm = time_calls(run_rm, device, reps)
        setup_rm = 0.0
        b.compile_rm = False
    else:
        sync(device)
        t0 = time.perf_counter()
        eng.score(torch.from_numpy(ids[:bs_rm])[:, None])  # warm-up batch (+ the one-off compile)
        sync(device)
        first = time.perf_counter() - t0
        b.compile_rm = b.compile_rm and eng.compile  # False if torch.compile failed here (warned)
        s_rm, t_rm = time_batches(eng.score, ids, bs_rm, device, reps)
        if b.compile_rm:
            b.compile_s = max(0.0, first - min(t_rm) * bs_rm / n)  # warm-up batch minus a timed batch
            eager_plan = _eager(model, tmpl, head)
            eager, d_eg = eager_plan.eng, eager_plan.decisions  # its own kernels (elementwise) and attention form
            eager.score(torch.from_numpy(ids[:bs_rm])[:, None])
            s_eg, t_eg = time_batches(eager.score, ids, bs_rm, device, reps)
            del eager, eager_plan
    mem_rm = b.mem.read_mib()
    log(f"  rmfast    batch {bs_rm:5d}: {n / min(t_rm):10.1f} cand/s  (passes {', '.join(f'{t:.2f}' for t in t_rm)} s)"
         + (f"  [compiled; compile {b.compile_s:.1f} s]" if b.compile_rm else "")
         + ("  [no per-row work: whole vocabulary, prompt pass included]" if b.whole else ""))
    if t_eg is not None:
        log(f"  rmfast-eager batch {bs_rm:5d}: {n / min(t_eg):10.1f} cand/s")
    rm = Timed(s_rm, t_rm, bs_rm, setup_rm, mem_rm)
    return rm, (Timed(s_eg, t_eg, bs_rm, setup_rm, mem_rm, decisions=d_eg) if t_eg is not None else None)


def measure_peak(b: BenchRun, bs_rm: int) -> tuple[float, dict | None]:
    """FLOPs per candidate, and the GEMM peak at the rmfast batch's M (None: no per-row work or --no-peak).

    On CPU the peak is measured in the run's dtype and in the other of float32 / bfloat16 too, and the
    bound is the faster dtype's (``bound_dtype``): an engine in the slower dtype is judged against what
    the machine could do. The other dtype's full measurement is skipped where a quick probe at the
    model's projection shows it under half the run dtype's speed (it cannot be the bound; an emulated
    bf16 would take minutes to time at full size).
    """
    fpc = useful_flops(b)
    if b.tpr == 0 or b.args.no_peak:
        return fpc, None
    from ..cpu import measure_gemm, mlp_dims, probe_shape

    M = bs_rm * b.tpr
    kw = _peak_shapes(b)
    peak = gemm_peak(b.dims, M, b.dtype, b.device, **kw)
    run_dt = str(b.dtype).removeprefix("torch.")
    by = {run_dt: round(peak["gflops"], 1)}
    if b.device.type == "cpu":
        other = torch.bfloat16 if b.dtype == torch.float32 else torch.float32
        name = str(other).removeprefix("torch.")
        quick = measure_gemm(probe_shape(*(mlp_dims(b.model.config) or (576, 1536))), dtypes=(b.dtype, other))
        if quick[name] >= 0.5 * quick[run_dt]:
            by[name] = round(gemm_peak(b.dims, M, other, b.device, **kw)["gflops"], 1)
        else:
            peak["skipped"] = {name: f"{quick[name]} vs {quick[run_dt]} GFLOP/s ({run_dt}) at the probe shape: "
                                     "under half, not the bound"}
    bound = max(by, key=by.get)
    peak.update(by_dtype=by, bound_dtype=bound, bound_gflops=by[bound])
    log(f"  GEMM peak M={M}: " + ", ".join(f"{k} {v:.1f}" for k, v in by.items()) + " GFLOP/s"
        + "".join(f" ({k}: {v})" for k, v in peak.get("skipped", {}).items())
        + f" -> bound ({bound}) {by[bound] * 1e9 / fpc:.1f} cand/s")
    return fpc, peak


def useful_flops(b: BenchRun, fused_q: bool = False) -> float:
    """Projection FLOPs a candidate's score needs (:func:`rmfast.bench.flops.flops_per_candidate`): the score head
    reads the final position, so the last layer's q, o and MLP run at one position (rmfast's engine does that; the
    baselines run them at every position, their ``executed_flops_per_candidate``); the logprob head reads every
    row position. ``fused_q``: the last layer's queries at every row position too (one fused q|k|v GEMM)."""
    return flops_per_candidate(b.dims, b.tpr, n_out=1 if b.head == "score" and b.tpr else None, q=not fused_q)


def rmfast_flops(b: BenchRun) -> float:
    """Projection FLOPs rmfast's engine runs per candidate: :func:`useful_flops`, with its queries at every row
    position where it fuses q|k|v (its CPU default; tests/test_bench.py counts them)."""
    return useful_flops(b, fused_q=b.eng is not None and len(b.eng.layers[-1][0].w_qkv) == 1)


def _peak_shapes(b: BenchRun) -> dict:
    """:func:`gemm_peak`'s shapes as the engine runs them, and the LM head's chunk as it reads it."""
    from ..kernels.torch_twins import CHUNK

    return dict(shapes=engine_gemm_shapes(b.eng, b.dims), lm_chunk=CHUNK if b.device.type == "cpu" else 8192)


def second_window(b: BenchRun, peak: dict | None) -> None:
    """On CPU, the bound's dtype timed again once every method has run: the bound is the larger of the two windows
    (one ~0.25 s window on a busy machine read low, and fractions of it came out over 1). ``peak["windows"]``
    keeps both. On CUDA one window is steady, and the GPU check's budget has no room for a second."""
    if peak is None or b.device.type != "cpu":
        return
    dt = peak["bound_dtype"]
    second = gemm_peak(b.dims, peak["M"], getattr(torch, dt), b.device, **_peak_shapes(b))
    again = round(second["gflops"], 1)
    peak["windows"] = {"before": peak["bound_gflops"], "after": again}
    # each window's per-shape rates, so that the bound recomputes from the figures beside it
    peak["per_shape_windows"] = {"before": peak["per_shape_gflops"], "after": second["per_shape_gflops"]}
    if again > peak["bound_gflops"]:
        peak["by_dtype"][dt] = peak["bound_gflops"] = again
        if dt == str(b.dtype).removeprefix("torch."):
            peak["gflops"], peak["per_shape_gflops"] = again, second["per_shape_gflops"]
    log(f"  GEMM bound ({dt}) again after the methods: {again:.1f} GFLOP/s (before them {peak['windows']['before']:.1f}); "
        f"the bound is the larger")


def time_hf_cache(b: BenchRun) -> Timed:
    """hf-cache: the prompt's cache once (setup), then per batch a per-row copy of it."""
    device, args, model, tmpl, head, ids = b.device, b.args, b.model, b.tmpl, b.head, b.ids
    b.mem.reset()
    sync(device)
    t0 = time.perf_counter()
    hfc = HFCacheScorer(model, tmpl, head=head)
    sync(device)
    setup_hf = time.perf_counter() - t0
    if b.whole:
        bs_hf, probe_hf = b.n, None

        def run_hf():
            h = HFCacheScorer(model, tmpl, head=head)
            return [h.score(torch.from_numpy(ids)[:, None])]

        run_hf()  # warm-up
        s_hf, t_hf = time_calls(run_hf, device, b.reps)
        setup_hf = 0.0
    else:
        options = batch_options(args.hf_batch, b.dflt["hf_batches"])
        say_clamped("--hf-batch", args.hf_batch, ids.size)
        hf_score = hfc.score
        bs_hf, probe_hf = pick_batch(lambda bs: hf_score, ids, options, device)
        s_hf, t_hf = time_batches(hfc.score, ids, bs_hf, device, b.reps)
    mem_hf = b.mem.read_mib()
    log(f"  hf-cache  batch {bs_hf:5d}: {b.n / min(t_hf):10.1f} cand/s" + (f"  (probe {probe_hf})" if probe_hf else ""))
    del hfc
    return Timed(s_hf, t_hf, bs_hf, setup_hf, mem_hf, probe_hf)


def time_naive(b: BenchRun) -> Timed:
    """naive: full sequences on the first ``n_naive`` ids, at the best of the batch-size options."""
    device, args, model, tmpl, head, n_naive = b.device, b.args, b.model, b.tmpl, b.head, b.n_naive
    ids_nv = b.ids[:n_naive]
    b.mem.reset()
    opts = batch_options(args.naive_batch, b.dflt["naive_batches"])
    say_clamped("--naive-batch", args.naive_batch, ids_nv.size)
    # the slowest method (every candidate's whole sequence): said before it runs, it can take minutes on a CPU
    log(f"  naive     {n_naive} ids as whole sequences (the papers' pipeline): a batch size from {list(opts)}, then "
        f"{max(1, b.reps)} timed pass(es) ...")
    bs_nv, probe_nv = pick_batch(lambda bs: naive_scorer(model, tmpl, head, bs), ids_nv, opts, device)
    s_nv, t_nv = time_calls(lambda: [naive_scorer(model, tmpl, head, bs_nv)(torch.from_numpy(ids_nv)[:, None])],
                            device, b.reps)
    if head == "logprob":  # the cap hf_scores applies (same formula), so the table shows the real batch
        V = config_dims(model.config).vocab
        cap = max(1, int(5e7 // ((1 + len(tmpl.continuation_ids) + 1) * V)))
        say_clamped("--naive-batch", args.naive_batch, ids_nv.size, cap, "the logprob head's logits stay under 5e7 "
                    "floats a batch, as hf_scores keeps them")
        bs_nv = min(bs_nv, cap)
    mem_nv = b.mem.read_mib()
    log(f"  naive     batch {bs_nv:5d}: {n_naive / min(t_nv):10.1f} cand/s" + (f"  (probe {probe_nv})" if probe_nv else ""))
    return Timed(s_nv, t_nv, bs_nv, 0.0, mem_nv, probe_nv)


def check_agreement(b: BenchRun, rm: Timed, eg: Timed | None, hf: Timed, nv: Timed) -> dict:
    """Agreement with rmfast on the timed candidates (benchmark dtype), then exactness in fp32.

    In the benchmark dtype a baseline agrees when ρ(rmfast, baseline) >= ``min_rho`` = min(0.99, ρ(naive,
    hf-cache) - 0.01), or, where that fails, when rmfast ranks the first ``truth_n`` timed ids at least
    as well as the baseline does against the fp32 truth (ρ to truth no more than 0.01 below the
    baseline's): random-init models (``--random-init``) have score spreads close to bf16's own rounding
    noise, where two correct bf16 paths rank differently but equally well. The fp32 truth is the fp32
    engine, checked elementwise against both plain-HF paths on the first ``check_n`` ids in the same cast.
    With the benchmark dtype float32 the rank rule gives way to elementwise agreement within the
    derived fp32 rounding bound (:func:`_fp32_agreement`): near-tied scores swap ranks by rounding.

    Returns {"hf", "nv", "eg", "floor", "min_rho", "exact"}; each method's ``ok`` needs both checks.
    """
    n_naive = b.n_naive
    agr_hf = agreement(rm.scores, hf.scores)
    agr_nv = agreement(rm.scores[:n_naive], nv.scores)
    agr_eg = agreement(rm.scores, eg.scores) if eg is not None else None
    floor = agreement(hf.scores[:n_naive], nv.scores)  # two plain-HF paths: the dtype's own noise floor
    min_rho = min(0.99, floor["spearman"] - 0.01)
    for a in (agr_hf, agr_nv, agr_eg):
        if a is not None:
            a["ok"] = a["spearman"] >= min_rho
    # ... and exactness in fp32 on the first check_n of them (same weights, parameters cast up and back)
    check_n = min(n_naive, b.dflt["check_n"] if b.args.check_n is None else b.args.check_n)
    exact = None
    if check_n > 0:
        truth_n = min(b.n, b.dflt["truth_n"]) if b.dtype != torch.float32 else 0
        exact, truth = fp32_check(b.model, b.tmpl, b.head, b.ids[:check_n], b.device, b.dtype, compile=b.compile_rm,
                                  truth_ids=b.ids[:truth_n])
        if truth is not None:
            for a, other in ((agr_hf, hf), (agr_nv, nv), (agr_eg, eg)):
                if a is None:
                    continue
                k = min(truth.size, other.scores.size)
                a["truth_n"] = int(k)
                a["truth_spearman"] = agreement(truth[:k], other.scores[:k])["spearman"]
                a["rmfast_truth_spearman"] = agreement(truth[:k], rm.scores[:k])["spearman"]
                a["ok"] = a["ok"] or a["rmfast_truth_spearman"] >= a["truth_spearman"] - 0.01
        if b.dtype == torch.float32:
            _fp32_agreement(b, check_n, rm, ((agr_hf, hf), (agr_nv, nv), (agr_eg, eg)))
        agr_hf["ok"] = agr_hf["ok"] and exact["hf-cache_ok"]
        agr_nv["ok"] = agr_nv["ok"] and exact["naive_ok"]
        if agr_eg is not None:
            agr_eg["ok"] = agr_eg["ok"] and exact["rmfast-eager_ok"]
        log(f"  fp32 check on {check_n} ids: max |rmfast - hf-cache| {exact['hf-cache_max_abs_diff']:.2e}, "
             f"max |rmfast - naive| {exact['naive_max_abs_diff']:.2e}"
            + (f"; ρ to fp32 truth on {truth.size} ids: rmfast {agr_hf['rmfast_truth_spearman']:.4f}, "
               f"hf-cache {agr_hf['truth_spearman']:.4f}" if truth is not None else ""))
    return {"hf": agr_hf, "nv": agr_nv, "eg": agr_eg, "floor": floor, "min_rho": min_rho, "exact": exact}


def _fp32_agreement(b: BenchRun, check_n: int, rm: Timed, pairs) -> None:
    """fp32 is the exact mode: a baseline agrees when its timed scores equal rmfast's to rounding on
    the first ``check_n`` ids (:func:`fp32_rounding_tol`, measured against a float64 evaluation), not
    by rank: where scores tie to within rounding, two correct fp32 paths order them differently."""
    try:
        ref64 = float64_scores(b.model, b.tmpl, b.head, b.ids[:check_n])
    except torch.OutOfMemoryError:
        log("  fp32 agreement: no room for the float64 reference; judged by rank agreement")
        return
    tol = fp32_rounding_tol(rm.scores[:check_n], ref64)
    for a, other in pairs:
        if a is not None:
            k = min(check_n, other.scores.size)
            d = float(np.abs(rm.scores[:k].astype(np.float64) - other.scores[:k]).max())
            a.update(rounding_n=int(k), rounding_max_abs_diff=d, rounding_tol=tol, ok=d <= tol)
    log(f"  fp32 agreement on {check_n} ids: within rounding 2E = {tol:.2e} (E measured against float64)")


def full_scan(b: BenchRun) -> dict | None:
    """``--full``: the full-vocabulary rmfast scan, as ``rmfast scan`` runs it (None without ``--full``)."""
    if not b.args.full:
        return None
    from ..scoring.pipeline import scan

    args = b.args
    b.mem.reset()
    res = scan(b.model, b.lm.tokenizer, args.prompt, head=b.head, template=b.tmpl, engine="fast", progress=False,
               batch_size=args.batch_size or "auto", compile=getattr(args, "full_compile", None) or args.compile)
    full = {"n_candidates": int(res.manifest["n_candidates"]), "wall_s": res.manifest["wall_s"],
            "scan_s": res.manifest["scan_s"], "candidates_per_s": res.manifest["candidates_per_s"],
            "batch_size": res.manifest["batch_size"], "peak_mem_mib": round(b.mem.read_mib(), 1),
            **{k: res.manifest.get(k) for k in ("compiled", "decisions", "first_batch_s", "setup_s", "plan_s",
                                                 "labels_wait_s")}}
    log(f"  rmfast full vocabulary ({full['n_candidates']} ids): {full['wall_s']:.2f} s wall (set-up {full['setup_s']} s, "
        f"of it plan {full['plan_s']} s, scan {full['scan_s']} s, first batch {full['first_batch_s']} s, waited {full['labels_wait_s']} s for the "
        f"pieces/texts), {full['candidates_per_s']} cand/s ({'compiled' if full['compiled'] else 'eager'})")
    return full


def common_fields(b: BenchRun, fpc: float, peak: dict | None) -> dict:
    """The columns every row of one configuration shares."""
    tmpl, tpr, device = b.tmpl, b.tpr, b.device
    return {
        "model": b.cfg.name, "model_spec": b.cfg.spec, "head": b.head, "template_kind": tmpl.kind,
        "prefix_tokens": len(tmpl.prefix_ids), "suffix_tokens": len(tmpl.suffix_ids), "tokens_per_candidate": tpr,
        "vocab": b.n_vocab, "device": str(device), "dtype": str(b.dtype).replace("torch.", ""),
        "gemm_params": b.dims["gemm_params"], "lm_head_params": b.dims["lm_head_params"],
        "flops_per_candidate": fpc if tpr > 0 else None,
        "gemm_peak_gflops": round(peak["gflops"], 1) if peak else None,
        "gemm_peak_float32_gflops": peak["by_dtype"].get("float32") if peak else None,
        "gemm_peak_bfloat16_gflops": peak["by_dtype"].get("bfloat16") if peak else None,
        "bound_dtype": peak["bound_dtype"] if peak else None,
        "bound_gflops": peak["bound_gflops"] if peak else None,
        "gemm_peak_M": peak["M"] if peak else None,
        "peak_bound_cand_per_s": round(peak["bound_gflops"] * 1e9 / fpc, 1) if peak else None,
        "dtype_source": (recorded(b.model) or {}).get("source", "explicit"),
        "hf_attention": b.hf_attention,  # the baselines' (naive, hf-cache); rmfast's engine has its own
        "mem_how": b.mem.how, "loadavg_start": b.load_start, "loadavg_end": loadavg(),
        "whole_vocab_timed": b.whole,
        "rmfast_compiled": bool(b.compile_rm),
        "compile_s": round(b.compile_s, 2) if b.compile_s is not None else None,
        "decisions": b.decisions,
    }


def method_rows(b: BenchRun, timed: dict[str, Timed], agr: dict, fpc: float, peak: dict | None,
                full: dict | None) -> list[dict]:
    """One row per method (naive, hf-cache, [rmfast-eager], rmfast), then the full scan's if it ran."""
    common = common_fields(b, fpc, peak)
    tpr, exact, n_vocab = b.tpr, agr["exact"], b.n_vocab
    rm, eg = timed["rmfast"], timed.get("rmfast-eager")
    cand_rm = b.n / min(rm.times)
    P, S = len(b.tmpl.prefix_ids), len(b.tmpl.suffix_ids)
    # (method, timed, candidates, setup_s, agreement, tokens executed per candidate, projection FLOPs executed per
    # candidate: the baselines run every position through every layer, rmfast the last layer where the head reads)
    methods = [("naive", timed["naive"], b.n_naive, 0.0, agr["nv"], P + 1 + S, flops_per_candidate(b.dims, P + 1 + S)),
               ("hf-cache", timed["hf-cache"], b.n, timed["hf-cache"].setup_s, agr["hf"], tpr,
                flops_per_candidate(b.dims, tpr))]
    if eg is not None:
        methods.append(("rmfast-eager", eg, b.n, rm.setup_s, agr["eg"], tpr, rmfast_flops(b)))
    # rmfast's one-off compile is part of its cost for one scan: est_full_vocab_s includes it
    methods.append(("rmfast", rm, b.n, rm.setup_s + (b.compile_s or 0.0), None, tpr, rmfast_flops(b)))
    rows = []
    for method, t, cnt, setup, a, executed, ex_flops in methods:
        cps = cnt / min(t.times)
        row = dict(common)
        row.update({
            "method": method, "n_timed": cnt, "batch_size": t.batch_size, "batch_probe": t.probe,
            "tokens_executed_per_candidate": executed, "repeats": len(t.times),
            "executed_flops_per_candidate": ex_flops if tpr > 0 else None,
            "pass_s": [round(x, 4) for x in t.times], "cand_per_s": round(cps, 2),
            "cand_per_s_median": round(cnt / float(np.median(t.times)), 2),
            "rmfast_speedup": round(cand_rm / cps, 2),
            "useful_gflops": round(fpc * cps / 1e9, 2) if tpr > 0 else None,
            "frac_gemm_peak": round(fpc * cps / 1e9 / peak["bound_gflops"], 4) if peak else None,
            "setup_s": round(setup, 4),
            "est_full_vocab_s": round(setup + n_vocab / cps, 2),
            "peak_mem_mib": round(t.mem_mib, 1),
            "agree_spearman": a["spearman"] if a else None,
            "agree_max_abs_diff": a["max_abs_diff"] if a else None,
            "agree_max_diff_over_std": a["max_diff_over_std"] if a else None,
            "agree_ok": a["ok"] if a else None,
            "truth_spearman": a.get("truth_spearman") if a else None,
            "rmfast_truth_spearman": a.get("rmfast_truth_spearman") if a else None,
            "fp32_max_abs_diff": (exact[f"{method}_max_abs_diff"] if exact and a else None),
        })
        if t.decisions is not None:
            row["decisions"] = t.decisions
        rows.append(row)
    if full:
        row = dict(common)
        row.update({"method": "rmfast-full", "n_timed": full["n_candidates"], "batch_size": full["batch_size"],
                    "cand_per_s": full["candidates_per_s"], "full_wall_s": full["wall_s"], "full_scan_s": full["scan_s"],
                    "peak_mem_mib": full["peak_mem_mib"], "setup_s": full["setup_s"],
                    "decisions": full["decisions"] or row["decisions"],  # the scan's own plan (eager where auto)
                    "useful_gflops": round(fpc * full["candidates_per_s"] / 1e9, 2) if tpr > 0 else None,
                    # the whole scan's rate, padding and host work included, beside the timed batches' (issue 54)
                    "frac_gemm_peak": round(fpc * full["candidates_per_s"] / 1e9 / peak["bound_gflops"], 4)
                    if peak and tpr > 0 else None})
        rows.append(row)
    flag_over_bound(rows, {r["method"]: r.get("frac_gemm_peak") for r in rows}, b.cfg.name, indent="  ")
    return rows


def bench_model(cfg: BenchModel, lm, args, device: torch.device, dflt: dict) -> tuple[list[dict], dict]:
    """All methods on one model configuration; returns (rows, extras)."""
    b = prepare(cfg, lm, args, device, dflt)
    rm, eg = time_rmfast(b)
    fpc, peak = measure_peak(b, rm.batch_size)
    hf = time_hf_cache(b)
    nv = time_naive(b)
    second_window(b, peak)
    agr = check_agreement(b, rm, eg, hf, nv)
    full = full_scan(b)
    timed = {"naive": nv, "hf-cache": hf, "rmfast": rm}
    if eg is not None:
        timed["rmfast-eager"] = eg
    rows = method_rows(b, timed, agr, fpc, peak, full)
    extras = {"model": cfg.name, "note": cfg.note, "source": lm.source, "template": b.tmpl.manifest(),
              "dims": {k: v for k, v in b.dims.items() if k != "layer_shapes"}, "gemm_peak": peak,
              "agreement": {"hf-cache_vs_rmfast": agr["hf"], "naive_vs_rmfast": agr["nv"],
                            "naive_vs_hf-cache_floor": agr["floor"], "rmfast-eager_vs_rmfast": agr["eg"],
                            "min_spearman": agr["min_rho"], "fp32_check": agr["exact"]}, "full": full}
    if args.profile:
        extras["profile"] = profile_engine(b.eng, b.ids, rm.batch_size, device, n_batches=args.profile)
    b.eng = None
    return rows, extras


def profile_engine(eng, ids: np.ndarray, bs: int, device: torch.device, n_batches: int = 3, top: int = 15) -> dict:
    """torch.profiler over a few engine batches: the top ops by self time.

    Without per-row work (tokens_per_row(1) == 0) the prompt pass is the work: each "batch" is then
    a fresh Engine (prompt pass + log-softmax over the vocabulary) scoring ``bs`` ids.
    """
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batches = [torch.from_numpy(c)[:, None] for c in chunks(np.resize(ids, bs * n_batches), bs)][:n_batches]
    whole = eng.tokens_per_row(1) == 0

    def step(b):
        e = _eager(eng.model, eng.template, eng.head).eng if whole else eng
        return e.score(b)

    step(batches[0])
    with profile(activities=acts) as prof:
        for b in batches:
            step(b)
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    ka = prof.key_averages()
    total = sum(getattr(e, key, 0) for e in ka) or 1
    rows = []
    for e in sorted(ka, key=lambda e: getattr(e, key), reverse=True)[:top]:
        rows.append({"op": e.key, "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 2),
                     "self_pct": round(100 * getattr(e, key) / total, 1)})
    return {"sort": key, "batch_size": bs, "n_batches": n_batches, "whole_vocab": whole, "top": rows,
            "table": ka.table(sort_by=key, row_limit=top)}
