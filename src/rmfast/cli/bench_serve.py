"""``rmfast bench --workload serve`` (:mod:`rmfast.bench.serve`): its options read, the rows written."""

from __future__ import annotations

from functools import partial

from ..errors import UserError
from . import common

SERVE_MODEL = "smollm2-135m-instruct"  # with random_head_seed=0 (bench.models.BENCH_MODELS)


def run_serve_cli(args) -> int:
    """The serve workload on each model; exit 1 where rmfast serve's fp32 scores differ from the HF server's."""
    from ..bench import resolve_models
    from ..bench.models import workload_dtype
    from ..bench.serve import ServeBenchConfig, config_record, run_serve_bench, write_serve_bench
    from ..loading.loader import resolve_device
    from .bench_common import model_configs, random_init_configs, ran, write_and_check

    many = (getattr(args, "replicas", None) or 1) > 1  # replicas run on Ray Serve
    common.require_serve(f"--workload serve{' --replicas' if many else ''}", many, ("fastapi", "httpx", "uvicorn"))
    one = {}
    for k, d in (("prompt_tokens_list", 16 if args.tiny else 512), ("n_list", 4 if args.tiny else 16)):
        v = getattr(args, k)
        vals = [int(x) for x in v.split(",")] if v else [d]
        if len(vals) != 1:
            raise UserError(f"--{k.replace('_', '-')}: the serve workload takes one value")
        one[k] = vals[0]
    tiny = args.tiny and not args.random_init
    device = resolve_device(args.device)
    base = ServeBenchConfig(
        prompt_tokens=(one["prompt_tokens_list"],), n=(one["n_list"],), groups=args.prompts or (2 if args.tiny else 8),
        clients=args.clients or 16, min_len=args.min_len or (4 if args.tiny else 20),
        max_len=args.max_len or (24 if args.tiny else 200), dtype=workload_dtype(args.dtype, str(device), "float32"),
        device=str(device), threads=args.threads, seed=args.seed, layers=args.layers, tiny=args.tiny,
        init_seed=args.init_seed, allow_pickle=args.allow_pickle, peak=not args.no_peak,
        hf_attention=args.hf_attention or "sdpa")
    cfgs = random_init_configs(base, args, tiny)
    if cfgs is None:
        cfgs = model_configs(base, resolve_models(args.models or SERVE_MODEL))
    if args.replicas:
        from ..bench.serve_ray import run_serve_ray_bench

        rows = [r for cfg in cfgs for r in run_serve_ray_bench(cfg, args.replicas)]
        return write_and_check(rows, partial(write_serve_bench, stem="serve_ray"), args, ran(config_record, base, cfgs),
                               base.device, "rmfast serve --ray's replicas and one process")
    rows = [r for cfg in cfgs for r in run_serve_bench(cfg)]
    return write_and_check(rows, write_serve_bench, args, ran(config_record, base, cfgs), base.device,
                           "rmfast serve and the HF server")
