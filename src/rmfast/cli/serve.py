"""``rmfast serve MODEL``: the reward server (:mod:`rmfast.serve`; docs/serving.md)."""

from __future__ import annotations

import sys

from ..errors import UserError
from ..serve.body_cap import DEFAULT_MB
from . import common


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a reward model over HTTP (OpenRLHF, verl/vLLM, slime and rmfast routes)",
                       description="Serve a reward model over HTTP for RL frameworks that send one sample per "
                                   "request: each group's prompt is encoded once across requests, and a sample's "
                                   "score is the same bits whatever it was batched with (docs/serving.md). Needs "
                                   "the serve extra (pip install 'rmfast[serve]').")
    common.add_model_args(p)
    p.add_argument("--random-head-seed", type=common.nonneg_int, default=None,
                   help="load a causal LM with a seeded random one-output score head (a test server; no reward)")
    p.add_argument("--template", default=None,
                   help="chat template or plain format for /v1/score, /v1/rerank and the split rule (default: the "
                        "model's chat template)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key-file", default=None,
                   help=f"a file whose first line is the API key (default: ${'RMFAST_API_KEY'}, else none); clients "
                        "send 'Authorization: Bearer <key>'")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-local --host without an API key (default: refused)")
    p.add_argument("--max-queue", type=common.positive_int, default=4096,
                   help="samples that may wait; more get 429 with Retry-After (default 4096)")
    p.add_argument("--max-request-tokens", type=common.positive_int, default=None,
                   help="longest sample in tokens; longer get 413 (default: the model's positions)")
    p.add_argument("--max-body-mb", type=common.positive_int, default=DEFAULT_MB,
                   help=f"largest request body in MiB; larger get 413 of type body_too_large, unparsed (default "
                        f"{DEFAULT_MB})")
    p.add_argument("--timeout-s", type=float, default=180.0,
                   help="a request not answered within this many seconds gets 504 (default 180, OpenRLHF's)")
    p.add_argument("--wave-tokens", type=common.positive_int, default=32768,
                   help="a wave's token budget: it starts once this many tokens wait ... (default 32768)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="... or once its oldest sample has waited this long (default 5)")
    p.add_argument("--cache-mb", type=common.positive_int, default=1024,
                   help="prompt encodings kept between waves, in MiB (default 1024)")
    p.add_argument("--rerender", action="store_true",
                   help="/get_reward: render a query that splits into turns of a known chat template (ChatML, "
                        "Llama 3, Gemma, Phi-3, DeepSeek) again with the RM's own (default off: scored as sent, as "
                        "OpenRLHF does)")
    p.add_argument("--gemm-rows", default="auto", choices=["auto", "pad", "chunk"],
                   help="how the GEMMs keep a row's bits batch-independent: auto (a probe at start picks pad where "
                        "this machine's kernels allow, else chunk), pad or chunk (default auto)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="serve on Ray Serve: --replicas replicas (one per GPU; CPU replicas where there is none) "
                        "behind one address, each group's samples on the replica holding its prompt; ADDRESS: a "
                        "running Ray cluster (auto, ray://host:10001), default a local one (docs/scale_out.md; "
                        "needs pip install 'rmfast[serve-ray]')")
    p.add_argument("--replicas", type=common.positive_int, default=1,
                   help="with --ray: scorer replicas (default 1)")
    common.add_plan_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    ray = bool(getattr(args, "ray", False))
    common.require_serve(f"rmfast serve{' --ray' if ray else ''}", ray)
    from ..serve.server import ROUTES, ServeOptions, api_key, check, make_app, revision_of, run_server, start_notes

    opts = ServeOptions(host=args.host, port=args.port, api_key_file=args.api_key_file, insecure=args.insecure,
                        max_queue=args.max_queue, max_request_tokens=args.max_request_tokens, timeout_s=args.timeout_s,
                        wave_tokens=args.wave_tokens, max_wait_ms=args.max_wait_ms, cache_mb=args.cache_mb,
                        rerender=args.rerender, gemm_rows=args.gemm_rows, max_body_mb=args.max_body_mb)
    check(opts, bind=args.ray is None)  # Ray Serve's proxy listens there itself
    key = api_key(opts)
    if args.ray is not None:
        from .serve_ray import run_ray

        return run_ray(args, opts, key, make_core)
    if args.replicas != 1:
        raise UserError("--replicas: one process drives one device; give --ray for replicas behind one address")
    print(f"rmfast serve: loading {args.model} ...", file=sys.stderr, flush=True)
    core = make_core(args, opts)
    app, sched = make_app(core, opts, name=args.model, revision=revision_of(core.model_info), key=key)
    p = next(core.model.parameters())
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    limit = opts.max_request_tokens or core.limit
    banner = (f"rmfast serve: {args.model} on {p.device}, {str(p.dtype).replace('torch.', '')} "
              f"({core.decisions.get('dtype', {}).get('reason', 'asked for').split(':')[0]}), "
              f"http://{host}:{opts.port} ({'API key required' if key else 'no API key'}; gemm rows "
              f"{core.decisions['gemm_rows']['value']}; /get_reward queries {'rendered again' if opts.rerender else 'as sent'}"
              f"; at most {opts.max_queue} samples waiting, {limit if limit else 'any number of'} tokens a sample, "
              f"{opts.timeout_s:g} s a request); routes: {', '.join(ROUTES)}")
    for line in start_notes(args.random_head_seed, opts, core.limit):
        print(f"rmfast serve: note: {line}", file=sys.stderr, flush=True)
    rc = run_server(app, sched, opts, banner)
    ignore_after_drain()
    return rc


def ignore_after_drain() -> None:
    """The command, drained, is exiting: a second signal in the interpreter's teardown (a second or two) is ignored, as
    it was in the server's (it had killed the process by the signal); its exit status is the drain's."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def make_core(args, opts):
    """The model named by the arguments, loaded, as the server's scoring core (here, or in each Ray replica)."""
    from ..scoring.options import ScoringOptions
    from ..serve.core import ServeCore

    lm = common.load_model(args, random_head_seed=args.random_head_seed)
    template = common.template_arg(args, lm)
    info = getattr(lm, "source", None) or {}
    return ServeCore(lm.model, lm.tokenizer, ScoringOptions.from_args(args), template=template,
                     cache_bytes=opts.cache_mb << 20, gemm_rows=opts.gemm_rows, name=args.model,
                     model_info=info if isinstance(info, dict) else {})
