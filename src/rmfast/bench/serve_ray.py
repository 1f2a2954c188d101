"""``rmfast bench --workload serve --replicas N``: the serve workload's load (:mod:`rmfast.bench.serve`: G groups x N
responses, one sample per request, from concurrent clients in random order) sent to ``rmfast serve --ray``'s
application (:mod:`rmfast.serve.ray_app`) on a local Ray with N replicas, twice on the same samples:

- ``affinity``: the prompt-affinity router (:mod:`rmfast.serve.router`): a group's samples on one replica;
- ``default``: Ray Serve's own router (power of two choices): a group's samples wherever the queues are short, its
  prompt encoded again on every replica it reaches.

A row per routing: responses/s, p50/p99 latency, the prompt encodings and the prompt tokens saved (the replicas'
counters), the router's choices, and max |diff| against the same samples scored in this process by one
:class:`rmfast.serve.core.ServeCore` (the single-process server's bits: 0 where the replicas give the same bits).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from ..errors import UserError
from .best_of_n import MACHINE_FIELDS, VERSION_FIELDS, load_model
from .machine import loadavg, log, machine_info
from ..serve.router import ACTIVE_S
from .serve import ServeBenchConfig, _load, _samples

ROUTINGS = ("affinity", "default")


def make_core(cfg: ServeBenchConfig):
    """The bench model as a scoring core (in each replica, and in this process for the reference scores)."""
    from ..scoring.options import ScoringOptions
    from ..serve.core import ServeCore

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    lm, name, template = load_model(cfg)
    dtype = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
    return ServeCore(lm.model, lm.tokenizer, ScoringOptions(dtype=dtype), template=template, name=name)


def _reference(core, samples: list[dict]) -> np.ndarray:
    """The samples' scores in this process (tokenized as ``/get_reward`` does), in their order ``k``: one call (a
    sample's score is the same bits in any wave, :mod:`rmfast.serve.core`)."""
    tok = core.tokenizer
    got = core.score([core.sample(tok([s["text"]], add_special_tokens=False)["input_ids"][0],
                                  tok([s["prompt"]], add_special_tokens=False)["input_ids"][0]) for s in samples])
    out = np.zeros(len(samples), dtype=np.float32)
    out[[s["k"] for s in samples]] = got
    return out


def _run_one(routing: str, cfg: ServeBenchConfig, replicas: int, url: str, samples, warm) -> dict:
    """One deployment with ``routing``, warmed, then the timed load; the metrics' differences."""
    import httpx
    from ray import serve

    from ..serve.metrics import parse
    from ..serve.ray_app import APP_NAME, build, deploy
    from ..serve.server import ServeOptions, serve_config

    opts = ServeOptions(max_queue=10**6)
    deploy(build(partial(make_core, cfg), opts, serve_config(opts, name=cfg.name or "model"), replicas=replicas,
                 actor_options={"num_cpus": 1}, routing=routing))
    try:
        asyncio.run(_load(url, warm, 2))  # first-call costs, on prompts of their own
        time.sleep(ACTIVE_S)  # the warm-up's keys leave the router's active set, as a past RL step's would
        before, load = parse(httpx.get(f"{url}/metrics", timeout=60).text), loadavg()
        t, lat, got = asyncio.run(_load(url, samples, cfg.clients))
        after = parse(httpx.get(f"{url}/metrics", timeout=60).text)
    finally:
        serve.delete(APP_NAME)
    return {"t": t, "lat": lat, "got": got, "d": {k: after.get(k, 0) - before.get(k, 0) for k in after}, "load": load}


def run_serve_ray_bench(cfg: ServeBenchConfig, replicas: int) -> list[dict]:
    """The module doc's two runs; a row each."""
    try:
        import ray
        from ray import serve
    except ImportError:
        from ..serve.ray_app import NEEDS_RAY

        raise UserError(f"--workload serve --replicas {NEEDS_RAY}") from None
    from ..cpu import versions
    from ..serve.ray_app import routing_for
    from ..serve.server import free_port

    cfg.check()
    core = make_core(cfg)
    name = cfg.name or core.name
    rng = random.Random(cfg.seed)
    _, _, samples = _samples(core.tokenizer, core.template, cfg, rng)
    _, _, warm = _samples(core.tokenizer, core.template, replace(cfg, groups=2 * replicas, n=(1,)), random.Random(-1))
    ref = _reference(core, samples)
    p = next(core.model.parameters())
    info, ver, runs = machine_info(p.device), versions(), {}
    ray.init(num_cpus=max(replicas, 2), include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for routing in ROUTINGS:
            runs[routing] = _run_one(routing, cfg, replicas, f"http://127.0.0.1:{port}", samples, warm)
    finally:
        serve.shutdown()
        ray.shutdown()
    rows, n = [], len(samples)
    for routing, r in runs.items():
        d, got = r["d"], np.array([r["got"][k] for k in range(n)], dtype=np.float32)
        row = {"model": name, "routing": routing_for(routing, ray.__version__)[0], "routing_asked": routing,
               "ray": ray.__version__, "replicas": replicas, "groups": cfg.groups, "n_responses": cfg.n[0],
               "clients": cfg.clients, "prompt_tokens_target": cfg.prompt_tokens[0], "min_len": cfg.min_len,
               "max_len": cfg.max_len, "serve_responses_per_s": round(n / r["t"], 2),
               "serve_p50_s": round(float(np.percentile(r["lat"], 50)), 4),
               "serve_p99_s": round(float(np.percentile(r["lat"], 99)), 4),
               "prompt_encodings": int(d["rmfast_prompt_encodings_total"]),
               "prompt_encodings_per_group": round(d["rmfast_prompt_encodings_total"] / cfg.groups, 3),
               "prompt_tokens_encoded": int(d["rmfast_prompt_tokens_encoded_total"]),
               "prompt_tokens_saved": int(d["rmfast_prompt_tokens_saved_total"]),
               "serve_waves": int(d["rmfast_waves_total"]),
               "routed_affinity": int(d.get('rmfast_routed_total{choice="affinity"}', 0)),
               "routed_fallback": int(d.get('rmfast_routed_total{choice="fallback"}', 0)),
               "replica_samples": sorted((int(v) for k, v in d.items() if k.startswith("rmfast_replica_samples_total{")),
                                         reverse=True),
               "max_abs_diff": float(np.abs(got - ref).max()), "bits_equal": bool(np.array_equal(got, ref)),
               "score_std": float(np.std(ref)), "dtype": str(p.dtype).removeprefix("torch."), "device": str(p.device),
               "replica_cpus": 1, "loadavg": r["load"],
               **{k: info.get(k) for k in MACHINE_FIELDS}, **{k: ver.get(k) for k in VERSION_FIELDS}}
        log(f"{name} x{replicas} replicas, {routing} routing: {row['serve_responses_per_s']}/s, prompt encodings "
            f"{row['prompt_encodings']} for {cfg.groups} groups, prompt tokens saved {row['prompt_tokens_saved']}, "
            f"max|diff| vs one process {row['max_abs_diff']:.2e}")
        rows.append(row)
    return rows
