"""``rmfast serve MODEL --ray [ADDRESS] --replicas N``: the reward server on Ray Serve (:mod:`rmfast.serve.ray_app`;
docs/scale_out.md): started, one line once every replica has loaded, then until SIGTERM / Ctrl-C."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from functools import partial

from ..errors import UserError


def _connect(address: str) -> None:
    import ray

    try:
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # Serve's own progress lines: ours say it
    except (ConnectionError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise UserError(f"--ray {address}: no Ray cluster to join there ({first}); give auto, ray://HOST:10001, "
                        "or --ray alone for a local one") from None


def serve_address(opts) -> tuple[str, str]:
    """(the address Serve's HTTP proxy listens at, a note): --host/--port where this command started Serve; the
    proxy's own where a Serve already ran on the cluster (Ray keeps its HTTP options then, and ignores ours)."""
    host, port = opts.host, int(opts.port)
    try:
        from ray.serve.context import _get_global_client  # no public API reads the running proxy's options

        cfg = _get_global_client().http_config
        host, port = cfg.host, int(cfg.port)
    except Exception:  # noqa: BLE001 - another Ray's internals: say what was asked for
        pass
    note = "" if (host, port) == (opts.host, int(opts.port)) else (
        f"; the cluster's Serve was running already: its proxy's address, not --host {opts.host} --port {opts.port}")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}", note


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def _stop(serve, *, local: bool, name: str) -> None:
    """Serve shut down (its replicas finish what they hold), waited for 60 s at most (a Ray whose own processes took
    the signal too cannot answer), then Ray (a local one: its processes ended)."""
    import ray

    def stop():
        try:
            serve.shutdown() if local else serve.delete(name)
        except Exception:  # noqa: BLE001 - gone with the cluster already
            pass

    t = threading.Thread(target=stop, daemon=True)
    t.start()
    t.join(timeout=60)
    ray.shutdown()


def run_ray(args, opts, key, make_core) -> int:
    """Deploy, say one line, serve until a signal, then let Ray Serve drain the requests in flight; 0.
    ``make_core(args, opts)``: the model loaded as a scoring core (:func:`rmfast.cli.serve.make_core`), in each replica."""
    try:
        import ray  # noqa: F401
        from ray import serve
    except ImportError:
        from ..serve.ray_app import NEEDS_RAY

        raise UserError(f"rmfast serve --ray {NEEDS_RAY}") from None
    from ..serve.ray_app import APP_NAME, build, deploy, resources, routing_for
    from ..serve.server import ROUTES, serve_config, start_notes

    if args.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device {args.device} with --ray: Ray gives each replica its own GPU; give auto, cuda or cpu")
    _connect(args.ray)
    try:
        actor = resources(ray.cluster_resources(), args.replicas)
        if args.device == "cpu":
            actor.pop("num_gpus", None)
        serve.start(http_options={"host": opts.host, "port": int(opts.port)})
        app = build(partial(make_core, args, opts), opts, serve_config(opts, name=args.model, key=key),
                    replicas=args.replicas, actor_options=actor)
        where = f"{actor['num_gpus']} GPU" if actor.get("num_gpus") else f"{actor['num_cpus']} CPU(s)"
        print(f"rmfast serve: loading {args.model} on {args.replicas} Ray Serve replica(s), {where} each ...",
              file=sys.stderr, flush=True)
        deploy(app)
        url, note = serve_address(opts)
        routing, why = routing_for("affinity", ray.__version__)  # build's own decision, said
        if routing != "affinity":
            print(f"rmfast serve: {why}", file=sys.stderr, flush=True)
        router = "prompt-affinity routing" if routing == "affinity" else "Ray's own routing"
        print(f"rmfast serve: {args.model} on Ray Serve, {args.replicas} replica(s), {url} "
              f"({'API key required' if key else 'no API key'}; {router}{note}); routes: {', '.join(ROUTES)}",
              file=sys.stderr, flush=True)
        for line in start_notes(args.random_head_seed, opts, None):
            print(f"rmfast serve: note: {line}", file=sys.stderr, flush=True)
        _wait_for_signal()
        print("rmfast serve: stopping (Ray Serve finishes the requests in flight)", file=sys.stderr, flush=True)
    finally:
        _stop(serve, local=args.ray == "local", name=APP_NAME)
    return 0
