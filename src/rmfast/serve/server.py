"""Running the server: the model loaded once, the app on uvicorn, one line at start, and a drain on SIGTERM or
Ctrl-C (every request taken finishes, those still being tokenized too (:func:`drained`), new ones get 503, then exit
0; a second signal exits at once, 1, its requests unanswered; after the drain the signals are ignored).

One process drives one device (``rmfast serve MODEL --device cuda:N`` per GPU); many replicas behind one address
with each group's prompt on one replica: ``rmfast serve MODEL --ray`` (:mod:`rmfast.serve.ray_app`, docs/scale_out.md).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import UserError
from .app import ServeConfig, build_app
from .body_cap import DEFAULT_MB
from .core import ServeCore
from .scheduler import Scheduler

#: the API key's environment variable (``--api-key-file`` names a file instead)
API_KEY_ENV = "RMFAST_API_KEY"
ROUTES = ("POST /get_reward", "POST /classify", "POST /reward", "POST /v1/score", "POST /v1/rerank", "GET /health",
          "GET /v1/models", "GET /metrics")


@dataclass
class ServeOptions:
    """The server's own options (``rmfast serve``'s flags beside the scoring options)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key_file: str | None = None
    insecure: bool = False
    max_queue: int = 4096
    max_request_tokens: int | None = None
    timeout_s: float = 180.0
    wave_tokens: int = 32768
    max_wait_ms: float = 5.0
    cache_mb: int = 1024
    rerender: bool = False
    gemm_rows: str = "auto"
    max_body_mb: float = DEFAULT_MB  # MiB (a fraction in tests)


def is_local(host: str) -> bool:
    """Whether binding ``host`` exposes the server to this machine only (loopback addresses, localhost).

    >>> is_local("127.0.0.1"), is_local("::1"), is_local("localhost"), is_local("0.0.0.0")
    (True, True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def api_key(opts: ServeOptions) -> str | None:
    """The API key: ``--api-key-file``'s first line, else $RMFAST_API_KEY, else None; one line for a bad file.
    A non-local address without a key is refused unless ``--insecure`` (OpenRLHF's own server binds 0.0.0.0 with
    none: anyone on the network could score, or fill the queue)."""
    key = None
    if opts.api_key_file:
        try:
            # utf-8-sig: a file some editors save with a byte-order mark (PowerShell's UTF8) had kept it in the key,
            # which no header can carry: every request 401 while the banner said "API key required"
            key = open(opts.api_key_file, encoding="utf-8-sig").read().strip().splitlines()[0].strip()
        except (OSError, UnicodeDecodeError, IndexError) as e:
            raise UserError(f"--api-key-file {opts.api_key_file}: cannot read a key from it "
                            f"({getattr(e, 'strerror', None) or 'empty or not text'}); write the key on its first line") from None
    elif os.environ.get(API_KEY_ENV, "").strip():
        key = os.environ[API_KEY_ENV].strip()
    if key is not None and len(key) < 8:
        raise UserError("the API key is shorter than 8 characters; use a long random one (e.g. `openssl rand -hex 32`)")
    if key is not None and not (key.isascii() and key.isprintable()):
        raise UserError("the API key holds characters an HTTP header cannot carry (not printable ASCII), so no client "
                        "could send it; use a long random one (e.g. `openssl rand -hex 32`)")
    if key is None and not opts.insecure and not is_local(opts.host):
        raise UserError(f"--host {opts.host} exposes the server beyond this machine without an API key: give "
                        f"--api-key-file FILE or ${API_KEY_ENV} (clients send 'Authorization: Bearer <key>'), or "
                        "--insecure to serve without one")
    return key


def check(opts: ServeOptions, bind: bool = True) -> None:
    """One-line UserErrors for server options that cannot run, before the model loads. ``bind``: also take the address
    and port for a moment (this process listens there; on Ray Serve its proxy does, perhaps one already running)."""
    if not 0 < int(opts.port) < 65536:
        raise UserError(f"--port {opts.port}: give a port in 1..65535")
    try:  # a name no resolver knows (or text that is no host name) fails here, not in uvicorn after the load
        addr = socket.getaddrinfo(opts.host, int(opts.port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (OSError, UnicodeError):
        raise UserError(f"--host {opts.host!r}: not an address, or a name this machine resolves; give an IP address "
                        "(127.0.0.1: this machine only, 0.0.0.0: every interface) or a resolvable host name") from None
    if bind:
        _check_bind(opts, addr)
    for k in ("max_queue", "wave_tokens", "cache_mb"):
        if int(getattr(opts, k)) < 1:
            raise UserError(f"--{k.replace('_', '-')} must be a positive integer")
    if opts.max_request_tokens is not None and int(opts.max_request_tokens) < 2:
        raise UserError("--max-request-tokens must be at least 2 (a prompt and a response)")
    if not float(opts.timeout_s) > 0:
        raise UserError(f"--timeout-s {opts.timeout_s:g}: give a positive number of seconds")
    if not float(opts.max_body_mb) > 0:
        raise UserError(f"--max-body-mb {opts.max_body_mb:g}: give a positive number of MiB")
    if not float(opts.max_wait_ms) >= 0:
        raise UserError(f"--max-wait-ms {opts.max_wait_ms:g}: give 0 or more milliseconds")
    if float(opts.max_wait_ms) >= 1000 * float(opts.timeout_s):  # every request would wait past its own timeout
        raise UserError(f"--max-wait-ms {opts.max_wait_ms:g} is past --timeout-s {opts.timeout_s:g} (every sample "
                        "would wait for a full wave and then get 504); give a wait under the timeout")
    if opts.gemm_rows not in ("auto", "pad", "chunk"):
        raise UserError(f"--gemm-rows {opts.gemm_rows!r}: give auto, pad or chunk")


def _check_bind(opts: ServeOptions, addr: tuple) -> None:
    """The address and port taken for a moment, as uvicorn will take them (SO_REUSEADDR), before the model loads: a
    port in use was uvicorn's own ERROR line and then ours, after the load."""
    family, kind, proto, _, where = addr
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(where)
        except OSError as e:
            raise UserError(f"cannot listen on {opts.host}:{opts.port}: {e.strerror}; choose another --port (or "
                            "--host)") from None


def start_notes(random_head_seed: int | None, opts: ServeOptions, limit: int | None) -> list[str]:
    """What a server's user should know before its first score: a random head, a --max-request-tokens past the
    model's positions (``limit``; None where not known here).

    >>> start_notes(0, ServeOptions(max_request_tokens=10_000), 8192)[1]
    "--max-request-tokens 10000 is past the model's 8192 positions: a sample longer than 8192 tokens gets 413"
    """
    notes = []
    if random_head_seed is not None:
        notes.append(f"the score head is RANDOM (--random-head-seed {random_head_seed}): a test server, its scores "
                     "are no reward")
    if opts.max_request_tokens is not None and limit is not None and opts.max_request_tokens > limit:
        notes.append(f"--max-request-tokens {opts.max_request_tokens} is past the model's {limit} positions: a "
                     f"sample longer than {limit} tokens gets 413")
    return notes


def make_scheduler(core: ServeCore, opts: ServeOptions) -> Scheduler:
    """The scheduler of a loaded core (one per process, or one per Ray replica), its waves' rule in the decisions."""
    sched = Scheduler(core, max_queue=opts.max_queue, wave_tokens=opts.wave_tokens, max_wait_s=opts.max_wait_ms / 1000)
    core.reasons["waves"] = {"value": f"{opts.wave_tokens} tokens or {opts.max_wait_ms:g} ms", "reason": (
        "a wave starts once its token budget waits or its oldest sample has waited that long: how the waves are cut "
        "never changes a score (the rows rules), so they are cut for throughput alone; a budget of tens of thousands "
        "of tokens keeps the GEMMs wide under load, and an idle server answers within a few ms; where the last wave "
        "took 10x that wait or more, the next also waits that long from its end for the clients it answered (a "
        "fixed pool of clients otherwise splits into half-full waves)")}
    return sched


def serve_config(opts: ServeOptions, *, name: str, revision: str | None = None, key: str | None = None) -> ServeConfig:
    """The app's own settings from the server's options."""
    return ServeConfig(name=name, revision=revision, api_key=key, max_request_tokens=opts.max_request_tokens,
                       timeout_s=opts.timeout_s, rerender=opts.rerender, max_body_bytes=int(float(opts.max_body_mb) * (1 << 20)))


def revision_of(info) -> str | None:
    """The model's revision as ``/v1/models`` names it: its hub revision, else its file's hash, else None."""
    if not isinstance(info, dict):
        return None
    return info.get("revision") or info.get("sha256") or info.get("content_sha256")


def make_app(core: ServeCore, opts: ServeOptions, *, name: str, revision: str | None = None, key: str | None = None):
    """The app and its scheduler for a loaded core (tests build servers this way)."""
    sched = make_scheduler(core, opts)
    return build_app(core, serve_config(opts, name=name, revision=revision, key=key), sched), sched


def run_server(app, sched: Scheduler, opts: ServeOptions, banner: str) -> int:
    """Serve until SIGTERM / Ctrl-C, then drain (module doc); 0 once drained."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("rmfast.serve").setLevel(logging.INFO)

    ctx = app.state.ctx  # its admitted requests: taken before the drain (their bodies in), answered before the exit

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):  # not uvicorn's: it would raise the signal again after the shutdown
            if sched.draining:  # a second signal: now. Not through uvicorn's forced shutdown: that still waited for the
                # running wave (the scheduler's worker thread) and then logged the lifespan's CancelledError traceback
                print(f"rmfast serve: a second signal: exit now ({ctx.admitted} requests in flight not answered)",
                      file=sys.stderr, flush=True)
                os._exit(1)
            sched.drain()
            print(f"rmfast serve: draining ({ctx.admitted} requests in flight; new ones get 503), then exit; "
                  "a second signal exits now", file=sys.stderr, flush=True)

        async def on_tick(self, counter: int) -> bool:
            if sched.draining:
                return drained(ctx, sched)
            return await super().on_tick(counter)

        @contextmanager
        def capture_signals(self):  # uvicorn's gives the signals back to their defaults once serve() ends: a second
            # one in the rest of the teardown (asyncio.run's, then the interpreter's: a second or two) killed the
            # process by the signal. Every request is answered by then: the signals are ignored until run_server
            # returns (a Python handler would not do: the interpreter's finalization resets those to the default)
            with super().capture_signals():
                yield
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_IGN)

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                print(banner, file=sys.stderr, flush=True)

    config = uvicorn.Config(app, host=opts.host, port=int(opts.port), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5)
    server = DrainingServer(config)
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        server.run()
    except SystemExit:  # uvicorn exits 1 where it cannot bind, after logging why
        pass
    finally:  # the caller's handlers back (a notebook's Ctrl-C): the drain's ignoring was for the teardown only;
        for sig, handler in before.items():  # the CLI, exiting, ignores them again (cli.serve.ignore_after_drain)
            signal.signal(sig, handler)
    if not server.started:
        raise UserError(f"could not listen on {opts.host}:{opts.port} (in use, or not an address of this machine); "
                        "choose another --port or --host")
    return 0


def drained(ctx, sched: Scheduler) -> bool:
    """Whether a draining server has answered every request it took: those whose bodies came (``ctx.admitted``, some
    still being tokenized: they had got 503 and the server had exited under them) and those in the scheduler."""
    return ctx.admitted == 0 and sched.in_flight == 0 and not sched.waiting


def free_port() -> int:
    """A free TCP port on the loopback address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app, port: int | None = None):
    """``app`` served on 127.0.0.1 in a background thread until the block ends; yields its base URL (the tests'
    and the bench's servers: real HTTP, no signal handling, no banner)."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise RuntimeError(f"the server on 127.0.0.1:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=60)
