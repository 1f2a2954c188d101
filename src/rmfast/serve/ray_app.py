"""``rmfast serve MODEL --ray``: the same app and routes on Ray Serve, many replicas behind one HTTP address, each
group's samples on the replica that holds its prompt's encoding (docs/scale_out.md).

Two deployments:

- **Scorer** (:class:`ScorerReplica`), one replica per GPU (``num_gpus=1``; CPU replicas where the cluster has no
  GPU): one model, one :class:`rmfast.serve.core.ServeCore` and one :class:`rmfast.serve.scheduler.Scheduler`, so the
  waves and the prompt cache work per replica as in the single-process server. Each answer carries the replica's
  counters (its prompt encodings and hits), so the ingress knows them without asking.
- **Ingress** (:class:`IngressReplica`), light: the FastAPI app of :mod:`rmfast.serve.app`, the only definition of
  the routes, built with a :class:`Front` in place of the core (the tokenizer and the split rule, described by a
  scorer replica) and a :class:`RayDispatch` in place of the scheduler: a request's samples, grouped by their
  prompt part, go to the scorer with their routing key (:func:`rmfast.serve.router.route_key`), routed by
  :class:`rmfast.serve.ray_router.PromptAffinityRouter`.

Faults: a scoring call whose replica dies is sent again (the router then picks among the live replicas; a score is
the same bits on any replica, so a retried sample is answered once, with the same number) and Ray starts a new
replica. A replica that cannot load the model fails the deployment at once (``max_constructor_retry_count=1``) and
:func:`deploy` raises one line naming why (:func:`deploy_error_line`).

Everything Ray is imported inside the functions: the module imports without Ray (the serve-ray extra).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import re
import time

import numpy as np

from ..errors import UserError
from .app import ServeConfig, build_app
from .core import CoreStats, ServeCore
from .router import ROUTE_KWARG, route_key, routed
from .scheduler import QueueFull
from .server import ServeOptions, make_scheduler, revision_of

#: the first words of a replica's load failure, found again in Ray's deploy error (:func:`deploy_error_line`)
LOAD_FAILED = "rmfast replica cannot load the model: "
NEEDS_RAY = "needs Ray Serve: pip install 'rmfast[serve-ray]'"
APP_NAME = "rmfast"


def _first_line(e: BaseException | str) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def deploy_error_line(message: str) -> str:
    """Ray's deploy error (a traceback of the replica's constructor inside its message) as one line: the replica's
    own line where it said one (:data:`LOAD_FAILED`), else the last line of the text.

    >>> deploy_error_line("Deploying failed\\nTraceback ...\\nRuntimeError: " + LOAD_FAILED + "no such model: x\\n")
    'rmfast replica cannot load the model: no such model: x'
    >>> deploy_error_line("Deploying failed\\n  File 'a.py'\\nValueError: bad\\n")
    'a replica failed to start: ValueError: bad'
    """
    m = re.search(re.escape(LOAD_FAILED) + r"([^\n]*)", message)
    if m:
        return LOAD_FAILED + m.group(1).strip().strip("'\"")
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return f"a replica failed to start: {lines[-1][:300] if lines else 'no reason given'}"


def _replica_id() -> str:
    from ray import serve

    return serve.get_replica_context().replica_id.to_full_id_str()


class ScorerReplica:
    """One scorer replica (module doc). ``make_core``: a function of no arguments that loads the model on this
    replica's device and returns its :class:`rmfast.serve.core.ServeCore` (the CLI's, the bench's, a test's)."""

    def __init__(self, make_core, opts: ServeOptions):
        try:
            self.core = make_core()
        except UserError as e:  # its CLI form: the deploy error becomes a UserError again, which names each reader's options
            raise RuntimeError(LOAD_FAILED + _first_line(e.cli_message())) from None
        except Exception as e:  # a load error is the replica's end: one line, no retry (max_constructor_retry_count)
            raise RuntimeError(f"{LOAD_FAILED}{type(e).__name__}: {_first_line(e)}") from None
        self.sched = make_scheduler(self.core, opts)
        self.replica = _replica_id()
        self._started: asyncio.Task | None = None

    async def score(self, samples: list, route: str | None = None) -> dict:
        """The samples' scores with this replica's counters, or ``{"full": ...}`` where its queue is full."""
        if self._started is None:
            self._started = asyncio.ensure_future(self.sched.start())
        await self._started
        try:
            scores = await self.sched.score(samples)
        except QueueFull as e:
            return {"full": (self.sched.n_waiting, self.sched.max_queue, e.retry_after)}
        return {"scores": np.asarray(scores), "replica": self.replica, "stats": self.stats()}

    def stats(self) -> dict:
        core, sched = self.core, self.sched
        # the wave's thread may add a split rule's first count to by_rule meanwhile: asdict's Python loop over it could
        # meet the change mid-way, dict() copies it in one step (the core's lock would wait for the running wave)
        st = {f.name: (dict(v) if isinstance(v := getattr(core.stats, f.name), dict) else v)
              for f in dataclasses.fields(core.stats)}
        return {**st, "cached_prompts": core.cached_prompts, "cached_bytes": core.cached_bytes, "queue": sched.n_waiting,
                "waves_lingered": sched.waves_lingered}

    def describe(self) -> dict:
        """What the ingress needs of the core: the tokenizer, the split rule, the limits, the decisions."""
        core = self.core
        p = next(core.model.parameters())
        return {"tokenizer": core.tokenizer, "template": core.template, "header": core.header, "limit": core.limit,
                "longest_token_chars": core.longest_token_chars,
                "head_index": core.head_index, "score_meaning": core.score_meaning, "decisions": core.decisions,
                "config": core.model.config, "name": core.name, "model_info": core.model_info,
                "revision": revision_of(core.model_info), "device": str(p.device),
                "dtype": str(p.dtype).replace("torch.", ""), "replica": self.replica}


class _ConfigOnly:
    """The model as the routes read it in the ingress: its config (labels), no weights."""

    def __init__(self, config):
        self.config = config


class Front:
    """The ingress's stand-in for :class:`rmfast.serve.core.ServeCore`: what the routes read of it (the tokenizer,
    the split rule, the limits, the decisions: a replica's description), and the counters summed over the
    replicas' latest reports."""

    sample = ServeCore.sample  # the split rule and the positions' limit: the core's own definition

    def __init__(self, info: dict, dispatch: RayDispatch):
        self.tokenizer, self.template, self.header, self.limit = (info["tokenizer"], info["template"],
                                                                  tuple(info["header"]), info["limit"])
        self.head_index, self.score_meaning, self.name = info["head_index"], info["score_meaning"], info["name"]
        self.model_info, self.model = info["model_info"], _ConfigOnly(info["config"])
        self._decisions, self.dispatch = info["decisions"], dispatch
        self.longest_token_chars = info["longest_token_chars"]

    @property
    def decisions(self) -> dict:
        return {k: dict(v) for k, v in self._decisions.items()}

    @property
    def stats(self) -> CoreStats:
        total = CoreStats()
        for snap in self.dispatch.board.values():
            for f in dataclasses.fields(CoreStats):
                if f.name == "by_rule":
                    for r, n in snap["by_rule"].items():
                        total.by_rule[r] = total.by_rule.get(r, 0) + n
                else:
                    setattr(total, f.name, getattr(total, f.name) + snap[f.name])
        return total

    @property
    def cached_prompts(self) -> int:
        return sum(s["cached_prompts"] for s in self.dispatch.live())

    @property
    def cached_bytes(self) -> int:
        return sum(s["cached_bytes"] for s in self.dispatch.live())


class RayDispatch:
    """The ingress's stand-in for the scheduler: a request's samples grouped by prompt part, each group one call to
    the scorer with its routing key; a call whose replica died is sent again (``retries`` times, backing off)."""

    def __init__(self, handle, opts: ServeOptions, retries: int = 6, replicas: int | None = None):
        self.handle, self.retries, self.replicas = handle, int(retries), replicas
        self.max_queue, self.wave_tokens, self.max_wait_s = opts.max_queue, opts.wave_tokens, opts.max_wait_ms / 1000
        self.draining, self.waiting = False, ()
        self.n_waiting = 0  # samples sent to the scorer and not yet answered
        self.in_flight = 0  # requests
        self.board: dict = {}  # replica -> its latest counters
        self.reported: dict = {}  # replica -> when its latest counters came (time.monotonic)
        self.answered: dict = {}  # replica -> calls it answered
        self.retried = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def score(self, samples: list) -> np.ndarray:
        groups: dict = {}
        for k, s in enumerate(samples):
            groups.setdefault(s.prompt, []).append(k)
        self.in_flight += 1
        self.n_waiting += len(samples)
        # Each group's call starts in an empty context. Ray Serve gives a call made while serving a request that
        # request's internal id, and its router tracks a pending call by that id: of two concurrent calls of one
        # request (a request of several prompts), the second was never given a replica and hung until --timeout-s.
        calls = [contextvars.Context().run(asyncio.ensure_future, self._call([samples[k] for k in ks], route_key(p)))
                 for p, ks in groups.items()]
        try:
            got = await asyncio.gather(*calls)
        finally:
            self.in_flight -= 1
            self.n_waiting -= len(samples)
        out = np.empty(len(samples), dtype=np.float32)
        for ks, scores in zip(groups.values(), got):
            out[np.asarray(ks)] = scores
        return out

    def load_line(self) -> str:
        """What a 504 says of the load: the ingress sees the samples it sent, not the replicas' waves."""
        return f"{self.n_waiting} samples sent to the replicas and not answered"

    async def _call(self, samples: list, key: str) -> np.ndarray:
        from ray.exceptions import RayActorError

        for attempt in range(self.retries + 1):
            try:
                got = await self.handle.score.remote(samples, **{ROUTE_KWARG: key})
            except RayActorError:  # the replica died (or cannot be reached): another one answers
                if attempt == self.retries:
                    raise
                self.retried += 1
                await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
                continue
            if "full" in got:
                raise QueueFull(*got["full"])
            r = got["replica"]
            if got["stats"]["waves"] >= self.board.get(r, {}).get("waves", -1):  # answers may arrive out of order
                self.board[r] = got["stats"]
            self.reported[r] = time.monotonic()
            self.answered[r] = self.answered.get(r, 0) + 1
            return got["scores"]
        raise AssertionError("unreachable")

    def live(self) -> list[dict]:
        """The latest counters of the replicas taken to be alive, for the gauges (a cache's size, not a total): the
        ``replicas`` that reported last. A replica that died and was started again under a new id leaves its last
        report on the board, where its totals still count, but its cache is gone."""
        ids = sorted(self.board, key=lambda r: self.reported.get(r, 0.0), reverse=True)[: self.replicas or None]
        return [self.board[r] for r in ids]

    def metric_families(self) -> list:
        """The replicas' own counters and the router's choices, for ``/metrics`` (:class:`rmfast.serve.metrics.Metrics`)."""
        per = sorted(self.board.items())
        fams = [(f"rmfast_replica_{k}_total", "counter", f"{what}, by the replica (as it last reported)",
                 [(f'{{replica="{r}"}}', s.get(k, 0)) for r, s in per])
                for k, what in (("samples", "samples scored"), ("prompt_encodings", "prompt parts encoded"),
                                ("prompt_hits", "samples whose prompt part was encoded already"),
                                ("prompt_tokens_saved", "prompt tokens not encoded again"),
                                ("waves_lingered", "waves that waited for the clients the last wave answered (the "
                                                   "linger)"))]
        fams.append(("rmfast_replica_calls_total", "counter", "scoring calls answered, by the replica",
                     [(f'{{replica="{r}"}}', n) for r, n in sorted(self.answered.items())]))
        choices = routed()
        fams.append(("rmfast_routed_total", "counter", "scoring calls the prompt-affinity router sent: to the "
                     "replica of their prompt (affinity) or, that one full, to the least loaded (fallback)",
                     [(f'{{choice="{c}"}}', choices.get(c, 0)) for c in ("affinity", "fallback")]))
        fams.append(("rmfast_retries_total", "counter", "scoring calls sent again after their replica died",
                     [("", self.retried)]))
        return fams


_BUILT: list = []  # the ingress's app, from its constructor to Ray's ASGI wrapper (one replica per process)


def _built_app():
    return _BUILT.pop()


class IngressReplica:
    """The ingress (module doc): the app of :mod:`rmfast.serve.app` over a :class:`Front` and a :class:`RayDispatch`."""

    async def __init__(self, scorer, config: ServeConfig, opts: ServeOptions):
        info = await scorer.describe.remote()
        dispatch = RayDispatch(scorer, opts, replicas=(config.extra.get("ray_serve") or {}).get("replicas"))
        front = Front(info, dispatch)
        config = dataclasses.replace(config, revision=config.revision or info["revision"])
        _BUILT.append(build_app(front, config, dispatch))


def resources(cluster: dict, replicas: int) -> dict:
    """A scorer replica's Ray resources: one GPU each where the cluster has GPUs, else an equal share of its CPUs;
    one line where the cluster has too few.

    >>> resources({"CPU": 16.0, "GPU": 8.0}, 4), resources({"CPU": 2.0}, 2)
    ({'num_gpus': 1, 'num_cpus': 1}, {'num_cpus': 1})
    """
    gpus, cpus = int(cluster.get("GPU", 0)), int(cluster.get("CPU", 0))
    if gpus:
        if replicas > gpus:
            raise UserError(f"--replicas {replicas}: one replica per GPU, and the Ray cluster has {gpus} GPU(s)")
        return {"num_gpus": 1, "num_cpus": 1}
    if replicas > cpus:
        raise UserError(f"--replicas {replicas}: the Ray cluster has no GPU and {cpus} CPU(s), fewer than the "
                        "replicas (a CPU replica takes at least one)")
    return {"num_cpus": cpus // replicas}


#: the oldest Ray whose request router the prompt-affinity router was measured on (tests/test_serve_ray.py). On Ray
#: 2.55 (OpenRLHF's pin) 64 requests from 16 threads stalled behind it (queue-length probes of busy replicas timed
#: out and the keyed calls backed off until their clients gave up), while Ray's own router answered all 64. The
#: likely cause, read in 2.55's router: a routing task hands the replica it found to the queue's front request,
#: not to the request it chose for (harmless when any replica suits any request); 2.60 ties each task to its request
AFFINITY_RAY = (2, 60)


def routing_for(asked: str, ray_version: str) -> tuple[str, str]:
    """(the routing that runs, why) for ``asked`` ("affinity" or "default") on Ray ``ray_version``.

    >>> routing_for("affinity", "2.60.0")[0], routing_for("affinity", "2.55.1")[0], routing_for("default", "2.55.1")[0]
    ('affinity', 'default', 'default')
    """
    if asked not in ("affinity", "default"):
        raise UserError(f"routing {asked!r}: give affinity or default")
    got = tuple(int(p) for p in re.findall(r"\d+", ray_version)[:2])
    if asked == "affinity" and got < AFFINITY_RAY:
        return "default", (f"Ray {ray_version}: prompt-affinity routing needs Ray >= {'.'.join(map(str, AFFINITY_RAY))} "
                           "(on 2.55 its keyed calls stalled under load); Ray's own router runs, each replica still "
                           "keeps its prompts")
    return asked, ("a group's samples to the replica holding its prompt" if asked == "affinity" else
                   "Ray's own router (power of two choices), as asked")


def build(make_core, opts: ServeOptions, config: ServeConfig, *, replicas: int, actor_options: dict,
          routing: str = "affinity"):
    """The Ray Serve application (not yet running): the ingress over the scorer. ``routing``: "affinity" (the
    prompt-affinity router; Ray's own on a Ray older than :data:`AFFINITY_RAY`, :func:`routing_for`) or "default"
    (Ray's own, power of two choices: the bench's comparison)."""
    import ray
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    routing, why = routing_for(routing, ray.__version__)
    extra = {}
    if routing == "affinity":
        extra["request_router_config"] = RequestRouterConfig(
            request_router_class="rmfast.serve.ray_router.PromptAffinityRouter")
    scorer = serve.deployment(ScorerReplica, name="Scorer", num_replicas=int(replicas), ray_actor_options=actor_options,
                              max_ongoing_requests=opts.max_queue, max_constructor_retry_count=1, **extra)
    ingress = serve.deployment(serve.ingress(_built_app)(IngressReplica), name="Ingress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=max(opts.max_queue, 1024),
                               max_constructor_retry_count=1)
    config = dataclasses.replace(config, extra={**config.extra, "ray_serve": {  # /v1/models
        "replicas": int(replicas), "routing": routing, "routing_reason": why, "ray": ray.__version__}})
    return ingress.bind(scorer.bind(make_core, opts), config, opts)


def deploy(app, *, name: str = APP_NAME, route_prefix: str = "/") -> None:
    """Run ``app`` on the connected Ray cluster's Serve (at ``/``); a replica that cannot start is one line (the
    application deleted first: no retry loop left behind)."""
    from ray import serve

    try:
        serve.run(app, name=name, route_prefix=route_prefix)
    except RuntimeError as e:
        why = str(e)
        try:  # the replicas' own messages (their constructors' errors) are in the status, not in the exception
            status = serve.status().applications.get(name)
            why = "\n".join([why, *(d.message for d in (status.deployments.values() if status else ()) if d.message)])
            serve.delete(name)
        except Exception:  # noqa: BLE001 - best effort: the line says why the deployment failed
            pass
        raise UserError(deploy_error_line(why)) from None
