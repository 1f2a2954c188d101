"""``rmfast bench``: rmfast against the plain-HF baselines and the GEMM peak, in one process (:mod:`rmfast.bench`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..bench.models import BENCH_MODELS, DEFAULT_MODELS, DEFAULT_OUT, DEFAULT_PROMPT, random_init_names
from ..errors import UserError
from ..io import check_output, write_json
from . import common
from .bench_common import model_configs, random_init_configs, ran, say_busy, write_and_check
from .common import fraction, int_list, nonneg_int, positive_int, thread_count

BEST_OF_N_MODEL = "smollm2-135m-instruct"  # with random_head_seed=0 (bench.models.BENCH_MODELS)
TINY_BEST_OF_N = "--random-init llama-3.2-1b --tiny"
WORKLOADS = ("scan", "best-of-n", "states", "serve")


#: Options of one workload only (dest names).
SCAN_ONLY = ("n_naive", "naive_batch", "check_n", "full", "full_compile", "profile", "compile", "no_plot", "cost_model",
             "gemm_frac", "prompt_tokens")
BEST_OF_N_ONLY = ("prompt_tokens_list", "n_list", "prompts", "min_len", "max_len")
STATES_ONLY = ("states_modes",)
SERVE_ONLY = ("clients", "replicas")
#: Options of some workloads only -> those workloads; given with another they are a one-line error (exit 2).
WORKLOAD_OPTIONS = {**{k: ("scan",) for k in SCAN_ONLY}, **{k: ("best-of-n", "serve") for k in BEST_OF_N_ONLY},
                    **{k: ("states",) for k in STATES_ONLY}, **{k: ("serve",) for k in SERVE_ONLY},
                    "hf_attention": ("scan", "best-of-n", "serve"),
                    **{k: ("scan", "states") for k in ("n_candidates", "batch_size", "prompt")},
                    **{k: ("scan", "best-of-n") for k in ("hf_batch",)},
                    **{k: ("scan", "best-of-n", "serve") for k in ("seed", "no_peak")}}
#: Options that act only beside another (dest -> the options that give them a meaning); given alone they were
#: ignored, and recorded in the config as if they had applied: one line, exit 2.
NEEDS = {"layers": ("random_init", "tiny"), "init_seed": ("random_init", "tiny"), "gemm_frac": ("cost_model",),
         "prompt_tokens": ("cost_model",), "full_compile": ("full",)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="scan", choices=WORKLOADS,
                   help="scan: one prompt, a token scan of one-token candidates (default); best-of-n: N responses "
                        "of mixed lengths per prompt, RewardScorer vs HF AutoModelForSequenceClassification on "
                        "right-padded full conversations (rmfast.bench.best_of_n); states: the extra time of a scan "
                        "with --states last / all over a plain one (rmfast.bench.states_overhead); serve: one sample per "
                        "request from concurrent clients to rmfast serve, the same samples in-process, and a "
                        "per-request padded HF server like OpenRLHF's serve_rm (rmfast.bench.serve)")
    p.add_argument("--models", default=None,
                   help=f"comma-separated configurations (default {DEFAULT_MODELS}; best-of-n, states: {BEST_OF_N_MODEL}); "
                        f"known: {', '.join(BENCH_MODELS)}; any other loadable spec is benchmarked with its default "
                        "head and template (best-of-n: score-head reward models only)")
    p.add_argument("--random-init", default=None, metavar="ALIAS[,ALIAS]",
                   help="instead of --models: known reward models (aliases of `rmfast models`) or base architectures, "
                        "at their published configuration with random weights, built on the device (no download; "
                        "custom heads as a plain score head); default none. Known: "
                        f"{', '.join(random_init_names())}")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="--random-init: decoder layers, the first N of the real config (default: all the model's)")
    p.add_argument("--tiny", action="store_true",
                   help="--random-init: each config at a CPU-test size (hidden 64, vocab 1,024), its features kept; "
                        f"best-of-n, states without --random-init: {TINY_BEST_OF_N} so, with short prompts and "
                        "responses (best-of-n) or 256 candidates (states): a seconds-long smoke run")
    p.add_argument("--init-seed", type=nonneg_int, default=0, help="--random-init: weight seed (default 0)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the user turn (default {DEFAULT_PROMPT!r})")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda (default auto)")
    p.add_argument("--dtype", default=None,
                   help="auto|bfloat16|float16|float32 (default auto: what `rmfast scan` takes on this machine; on CPU "
                        "bf16 only where it multiplies clearly faster than fp32; best-of-n, states: auto on CUDA, on CPU "
                        "float32 (best-of-n) and bfloat16 (states))")
    p.add_argument("--n-candidates", type=positive_int, default=None,
                   help="ids timed for rmfast and hf-cache (default 2048 on CPU, 65536 on CUDA); states: ids per "
                        "scan, the first of the vocabulary (default 4096; --tiny: 256)")
    p.add_argument("--n-naive", type=positive_int, default=None,
                   help="ids timed for naive, the first of the same sample (default 128 on CPU, 4096 on CUDA)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="rmfast rows per batch (default: scan's auto)")
    p.add_argument("--hf-batch", type=int_list, default=None,
                   help="hf-cache batch, or a comma list to probe (default: best of 64,128,256; CUDA 512,2048); "
                        "best-of-n: rows per padded HF batch, each of a comma list timed and the fastest counted "
                        "(default 1,16,64)")
    p.add_argument("--hf-attention", choices=["sdpa", "eager"], default=None,
                   help="the HF baselines' attention (scan, best-of-n, serve): sdpa (transformers' default, what "
                        "users get; eager where a model refuses it, e.g. Gemma 2, said and recorded) or eager "
                        "(default sdpa)")
    p.add_argument("--naive-batch", type=int_list, default=None,
                   help="naive batch, or a comma list to probe (default: best of 32,64,128; CUDA 256,1024)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed passes per method; the best counts (default 3; best-of-n: 1; states: rounds of plain + "
                        "every mode, the median counts, default 5)")
    p.add_argument("--check-n", type=nonneg_int, default=None,
                   help="ids for the fp32 exactness check of all three methods (default 32 on CPU, 256 on CUDA; 0 skips)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="candidate sample seed; best-of-n: texts and lengths (default 0)")
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch CPU threads, at most 4 x the CPUs (default: torch's)")
    p.add_argument("--full", action="store_true", help="also time the full-vocabulary rmfast scan per model")
    p.add_argument("--profile", type=nonneg_int, nargs="?", const=3, default=0, metavar="N",
                   help="torch.profiler over N rmfast batches per model; top ops by self time (default N=3)")
    p.add_argument("--no-peak", action="store_true", help="skip the GEMM-peak measurement (best-of-n: no GEMM fractions)")
    p.add_argument("--compile", default="on", choices=["on", "off", "auto"],
                   help="rmfast on CPU: the compiled decoder layer, timed beside the eager engine (default on; "
                        "off: eager only; the full scan follows scan's rule for auto)")
    p.add_argument("--full-compile", choices=["on", "off", "auto"], help="the --full scan's compile (default --compile's)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--cost-model", action="store_true",
                   help="print the GPU cost model (8B Llama-3 RM, 27B Gemma-2 RM on one H100), write it to "
                        "<--out>/cost_model.json, and exit; loads no model")
    p.add_argument("--gemm-frac", type=fraction, default=0.6, help="cost model: fraction of bf16 dense peak (default 0.6)")
    p.add_argument("--prompt-tokens", type=positive_int, default=50, help="cost model: prompt tokens (default 50)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="load pickled weights (pytorch_model.bin) when a folder has no safetensors; unpickling can "
                        "run code (default off: refused)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT}/)")
    _workload_groups(p)


def _workload_groups(p: argparse.ArgumentParser) -> None:
    """The options of the best-of-n, serve and states workloads, each in its group."""
    g = p.add_argument_group("best-of-n workload (--workload best-of-n only)")
    g.add_argument("--prompt-tokens-list", type=int_list, default=None, metavar="P[,P]",
                   help="prompt lengths in tokens (default 64,512,2048; --tiny: 16,64)")
    g.add_argument("--n-list", type=int_list, default=None, metavar="N[,N]",
                   help="responses per prompt (default 4,16,64; --tiny: 2,4)")
    g.add_argument("--prompts", type=positive_int, default=None,
                   help="conversations per configuration, each with N responses (default 1)")
    g.add_argument("--min-len", type=positive_int, default=None, help="shortest response in tokens (default 20; --tiny: 4)")
    g.add_argument("--max-len", type=positive_int, default=None, help="longest response in tokens (default 200; --tiny: 24)")
    g = p.add_argument_group("serve workload (--workload serve; also --prompt-tokens-list P, --n-list N, --prompts G "
                             "groups, --min-len, --max-len, one value each)")
    g.add_argument("--clients", type=positive_int, default=None,
                   help="concurrent clients, each sending one sample per request (default 16)")
    g.add_argument("--replicas", type=positive_int, default=None,
                   help="the load against rmfast serve --ray with this many CPU replicas on a local Ray, with the "
                        "prompt-affinity router and with Ray's default one (rmfast.bench.serve_ray; needs the "
                        "serve-ray extra; default: the three single-process servers)")
    g = p.add_argument_group("states workload (--workload states only)")
    g.add_argument("--states-modes", default=None, metavar="MODE[,MODE]",
                   help="the --states of each mode timed beside the plain scan: last_prenorm, all, last_normed or a "
                        "layer index; MODE/sync: written in the scan's thread, the reference (default last_prenorm,all)")



def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark rmfast vs plain-HF baselines and the GEMM peak")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv=None) -> int:
    """Entry point for ``python benchmarks/bench_scan.py``."""
    ap = argparse.ArgumentParser(prog="bench_scan.py", description="rmfast vs plain-HF baselines and the GEMM peak")
    add_arguments(ap)
    args = ap.parse_args(argv)
    return common.run_command(run, args)


def run(args) -> int:
    import torch
    
    from ..bench import (bench_model, device_defaults, loadavg, log, random_init_bench_models, random_init_model,
                         resolve_models, write_outputs)
    from ..bench.machine import busy_note
    from ..bench.memory_check import check_batches
    from ..cpu import say_choice
    from ..loading.loader import load, resolve_device

    check_output(args.out, folder=True)  # before any measurement; bench adds its files to the folder
    _check_workload(args)
    # a busy machine at the start: said with the figures, after the work (the rows keep the load averages)
    args.busy_note = None if args.cost_model else busy_note()
    if args.workload == "best-of-n":
        return run_best_of_n_cli(args)
    if args.workload == "states":
        return run_states_cli(args)
    if args.workload == "serve":
        from .bench_serve import run_serve_cli

        return run_serve_cli(args)
    args.models = args.models or DEFAULT_MODELS
    args.dtype = args.dtype or "auto"
    if args.cost_model:
        return _cost_model(args)

    device = resolve_device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    dflt = device_defaults(device)
    out_dir = Path(args.out)
    meta = _run_meta(args, device, dflt)
    if args.random_init:
        try:
            models = random_init_bench_models(args.random_init, layers=args.layers, tiny=args.tiny)
        except ValueError as e:
            raise UserError(str(e)) from None
    else:
        models = _installed(resolve_models(args.models), args.models == DEFAULT_MODELS)
    if not models:
        raise UserError("--models is empty")
    rows, extras = [], []
    t_all = time.perf_counter()
    loaded: dict[tuple, object] = {}
    for cfg in models:
        key = (cfg.spec, cfg.random_head_seed)
        if key not in loaded:
            loaded.clear()  # one model in memory at a time
            if device.type == "cuda":
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            if args.random_init:
                loaded[key] = random_init_model(cfg.spec.removeprefix("random-init:"), device=device, dtype=args.dtype,
                                                layers=args.layers, tiny=args.tiny, seed=args.init_seed)
            else:
                loaded[key] = load(cfg.spec, dtype=args.dtype, device=str(device), random_head_seed=cfg.random_head_seed,
                                   allow_pickle=args.allow_pickle)
            log(f"{cfg.spec}: {'built' if args.random_init else 'loaded'} in {time.perf_counter() - t0:.1f} s")
            say_choice(loaded[key].model)  # --dtype auto on CPU: what it took and why
        check_batches(cfg, loaded[key], args, device, dflt)  # before any timing: a batch that cannot fit
        log(f"[{cfg.name}] load average {loadavg()}")
        r, e = bench_model(cfg, loaded[key], args, device, dflt)
        rows += r
        extras.append(e)
    meta["machine"]["loadavg_end"] = loadavg()
    meta["total_s"] = round(time.perf_counter() - t_all, 1)
    meta["models"] = extras
    meta["config"]["models"] = ",".join(cfg.name for cfg in models)  # what ran (--random-init, --tiny: not the default list)
    paths = write_outputs(rows, meta, out_dir)
    _print_report(rows, extras, meta, paths, out_dir, args.no_plot)
    say_busy(args)
    bad = [f"{r['model']}/{r['method']}" for r in rows if r.get("agree_ok") is False]
    if bad:
        print(f"rmfast bench: scores disagree with rmfast for {', '.join(bad)} (see agreement in the JSON)", file=sys.stderr)
        return 1
    return 0


def _installed(models: list, default: bool) -> list:
    """The models whose embedded package is installed, checked before any is measured: a default one missing is left
    out with one note; one asked for by name is the load's own error, now (it came after the models before it ran)."""
    from ..loading.sources import embedded_missing

    kept = []
    for m in models:
        err = embedded_missing(m.spec)
        if err is None:
            kept.append(m)
        elif default:
            print(f"rmfast: note: {m.name} left out of the default models: {err.cli_message()}", file=sys.stderr)
        else:
            raise err
    return kept


def _cost_model(args) -> int:
    """``--cost-model``: the GPU cost model's table, printed and written (no measurement)."""
    from ..bench import COST_MODELS, H100_SXM, format_cost_model, gpu_cost_model

    cm = [gpu_cost_model(c, prompt_tokens=args.prompt_tokens, gemm_frac=args.gemm_frac) for c in COST_MODELS.values()]
    print(f"GPU cost model: {H100_SXM['name']}, {H100_SXM['bf16_dense_tflops']} TFLOP/s bf16 dense at "
          f"{args.gemm_frac:.0%}, {H100_SXM['hbm_tb_s']} TB/s HBM at 80%, {args.prompt_tokens}-token prompt")
    print(format_cost_model(cm))
    write_json(Path(args.out) / "cost_model.json", cm)
    return 0


def _run_meta(args, device, dflt) -> dict:
    """The run's header: time, machine, versions, options, device defaults and the formulas of the columns."""
    from ..bench import machine_info, versions

    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(device),
        "versions": versions(),
        "config": {k: v for k, v in vars(args).items() if k != "func"},
        "defaults": {k: list(v) if isinstance(v, tuple) else v for k, v in dflt.items()},
        "formulas": {
            "flops_per_candidate": "2 * ((gemm_params [+ V*D for logprob]) * tokens_per_candidate - (tokens_per_candidate - 1)"
                                   " * last layer's q, o and MLP params [score head only: it reads one position])",
            "executed_flops_per_candidate": "what the method runs: rmfast flops_per_candidate; hf-cache 2 * gemm_params * "
                                            "tokens_per_candidate (every position); naive the same over "
                                            "tokens_executed_per_candidate",
            "tokens_per_candidate": "score: 1 + len(suffix_ids); logprob: len(continuation_ids) (one-token responses)",
            "useful_gflops": "flops_per_candidate * cand_per_s / 1e9",
            "peak_bound_cand_per_s": "bound_gflops * 1e9 / flops_per_candidate",
            "bound_gflops": "the GEMM peak of the faster of float32 / bfloat16 on CPU (bound_dtype), of the run's dtype on CUDA",
            "frac_gemm_peak": "useful_gflops / bound_gflops",
            "cand_per_s": "n_timed / best pass time (warm-up excluded; setup_s = prompt pass, reported apart)",
        },
    }


def _print_report(rows, extras, meta, paths, out_dir: Path, no_plot: bool) -> None:
    """The table (and any profiles), the load average and the files written; the PNG unless ``no_plot``."""
    from ..bench import format_table, plot

    title = (f"rmfast bench — {meta['machine']['gpu'] or meta['machine']['cpu_model'] + ' [' + meta['machine']['cpu_kind'] + ']'}, "
             f"{meta['machine']['torch_threads']} threads, {rows[0]['dtype']}; load avg {meta['machine']['loadavg_start']}")
    png = None if no_plot else plot(rows, out_dir / "bench_latest.png", title)
    print(format_table(rows))
    for e in extras:
        if e.get("profile"):
            print(f"\nprofile [{e['model']}], {e['profile']['n_batches']} batches of {e['profile']['batch_size']}:")
            print(e["profile"]["table"])
    print(f"\nload average {meta['machine']['loadavg_start']} -> {meta['machine']['loadavg_end']}; total {meta['total_s']} s")
    print(f"wrote {paths['bench_latest'][0]}, {paths['bench_latest'][1]}" + (f", {png}" if png else ""))


def _check_workload(args) -> None:
    """An option of other workloads given (a value other than its default): one line, exit 2."""
    ap = argparse.ArgumentParser(add_help=False)
    add_arguments(ap)
    dflt = vars(ap.parse_args([]))
    given = [k for k, ws in WORKLOAD_OPTIONS.items() if args.workload not in ws and getattr(args, k, None) != dflt[k]]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        what = "not an option" if len(given) == 1 else "not options"
        owners = sorted({", ".join(WORKLOAD_OPTIONS[k]) for k in given})
        only = (f"only of --workload {owners[0]}" if len(owners) == 1 else
                "; ".join(f"--{k.replace('_', '-')}: --workload {', '.join(WORKLOAD_OPTIONS[k])}" for k in given))
        raise UserError(f"{flags}: {what} of --workload {args.workload} ({only})")
    flag = lambda k: "--" + k.replace("_", "-")  # noqa: E731
    alone = [k for k, needs in NEEDS.items()
             if getattr(args, k, None) != dflt[k] and not any(getattr(args, n, None) for n in needs)]
    if alone:
        k = alone[0]
        raise UserError(f"{flag(k)} acts only with {' or '.join(map(flag, NEEDS[k]))}, not given: it would be ignored; "
                        f"drop it or add {flag(NEEDS[k][0])}")




def run_best_of_n_cli(args) -> int:
    """``--workload best-of-n``: each model through :func:`rmfast.bench.best_of_n.run_best_of_n`, one CSV/JSON."""
    from ..bench import resolve_models
    from ..loading.loader import resolve_device
    from ..bench.best_of_n import BestOfNConfig, config_record, run_best_of_n, write_best_of_n
    from ..bench.models import workload_dtype

    hf = tuple(int(x) for x in args.hf_batch.split(",")) if args.hf_batch else BestOfNConfig.hf_batch
    tiny = args.tiny and not args.random_init  # --tiny alone: a small random Llama
    if tiny and args.models:
        raise UserError(f"--tiny with --workload best-of-n means {TINY_BEST_OF_N}; drop --models or --tiny")
    short = args.tiny  # a tiny model: short texts by default (a seconds-long run)
    device = resolve_device(args.device)
    ints = lambda text, d: tuple(int(x) for x in text.split(",")) if text else d  # noqa: E731
    base = BestOfNConfig(
        prompt_tokens=ints(args.prompt_tokens_list, (16, 64) if short else BestOfNConfig.prompt_tokens),
        n=ints(args.n_list, (2, 4) if short else BestOfNConfig.n), prompts=args.prompts or 1,
        min_len=args.min_len or (4 if short else 20), max_len=args.max_len or (24 if short else 200), hf_batch=hf,
        repeats=args.repeats or 1, dtype=workload_dtype(args.dtype, str(device), "float32"), device=str(device),
        threads=args.threads, seed=args.seed, layers=args.layers, tiny=args.tiny, init_seed=args.init_seed,
        allow_pickle=args.allow_pickle, peak=not args.no_peak, hf_attention=args.hf_attention or "sdpa")
    cfgs = random_init_configs(base, args, tiny)
    if cfgs is None:
        models = resolve_models(args.models or BEST_OF_N_MODEL)
        bad = [m.name for m in models if m.head not in ("score", "auto")]
        if bad:
            raise UserError(f"--workload best-of-n compares score heads: {', '.join(bad)} "
                            f"{'uses' if len(bad) == 1 else 'use'} a logprob head")
        cfgs = model_configs(base, models)
    if not cfgs:
        raise UserError("--models is empty")
    rows = [r for cfg in cfgs for r in run_best_of_n(cfg)]
    return write_and_check(rows, write_best_of_n, args, ran(config_record, base, cfgs), base.device,
                           "rmfast and HF scores")


def run_states_cli(args) -> int:
    """``--workload states``: each model through :func:`rmfast.bench.states_overhead.run_states_overhead`, one
    CSV/JSON; exit 1 where a scan with states scored differently from the plain one."""
    from dataclasses import replace

    from ..bench import resolve_models
    from ..loading.loader import resolve_device
    from ..bench.models import workload_dtype
    from ..bench.states_overhead import (StatesOverheadConfig, config_record, format_states_table, run_states_overhead,
                                         write_states_overhead)

    tiny = args.tiny and not args.random_init  # --tiny alone: a small random Llama
    if tiny and args.models:
        raise UserError(f"--tiny with --workload states means {TINY_BEST_OF_N}; drop --models or --tiny")
    modes = tuple(m.strip() for m in (args.states_modes or "last_prenorm,all").split(",") if m.strip())
    device = resolve_device(args.device)
    base = StatesOverheadConfig(
        n=args.n_candidates or (256 if args.tiny else StatesOverheadConfig.n), repeats=args.repeats or 5, modes=modes,
        dtype=workload_dtype(args.dtype, str(device), "bfloat16"), device=str(device), threads=args.threads,
        batch_size=args.batch_size or "auto", prompt=args.prompt, layers=args.layers, tiny=args.tiny,
        init_seed=args.init_seed, allow_pickle=args.allow_pickle)
    base.check()  # before any model is loaded
    cfgs = random_init_configs(base, args, tiny)
    if cfgs is None:
        cfgs = [replace(base, model=m.spec, name=m.name, head=m.head,
                        random_head_seed=m.random_head_seed, template=m.template)
                for m in resolve_models(args.models or BEST_OF_N_MODEL)]
    if not cfgs:
        raise UserError("--models is empty")
    rows = []
    for cfg in cfgs:
        rows += run_states_overhead(cfg)
    write_states_overhead(rows, args.out, {**ran(config_record, base, cfgs), "cli": {k: v for k, v in vars(args).items()
                                                                                    if k != "func"}}, device=base.device)
    print(format_states_table(rows))
    say_busy(args)
    bad = [f"{r['model']}/{r['mode']}" for r in rows if not r["scores_identical"]]
    if bad:
        print(f"rmfast bench: scores of {', '.join(bad)} differ from the plain scan's (scores_identical in the rows)",
              file=sys.stderr)
        return 1
    return 0
