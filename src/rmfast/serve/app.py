"""The server's routes (FastAPI): each client's own request and response shapes, one scoring core behind them.

- ``POST /get_reward``: OpenRLHF's remote reward model (``--reward.remote_url http://host:port/get_reward``):
  ``{"query": [text], "prompts": [text], "labels": [...]}`` -> ``{"rewards", "scores", "extra_logs"}``. A query is
  tokenized as OpenRLHF's own ``serve_rm`` does (the RM's tokenizer, no added special tokens) and scored at its
  final position. The query carries the *policy's* chat template: with ``rerender`` on, a query that splits into
  turns of a known template (:mod:`rmfast.serve.turns`) is rendered again with the RM's own; otherwise it is scored
  as sent.
- ``POST /classify``: vLLM's pooling route, as verl's reward loop calls it (``{"model", "input", "use_activation"}``,
  the input already in the RM's template, its BOS stripped because the server adds it): ``data[i].probs`` holds
  the head's raw output where ``use_activation`` is false, its sigmoid where true (a softmax of one logit is 1.0).
- ``POST /reward``: slime's remote reward model (``--rm-type remote_rm --rm-url http://host:port/reward``):
  ``{"prompt", "response", "label"}`` -> a bare JSON number (slime takes the body as the reward). The sample is
  read in the RM's own template (:meth:`Ctx.reward_sample`): slime's prompt is chat messages, the policy's
  rendering of them (``--apply-chat-template``), or plain text, and its response the policy's own text.
- ``POST /v1/score``, ``POST /v1/rerank``: rmfast's own, conversations and responses templated as
  :class:`rmfast.scoring.scorer.RewardScorer` does (each response's ids in context).
- ``GET /health``, ``GET /v1/models`` (the model, its revision, the score's meaning and every decision with its
  reason), ``GET /metrics`` (Prometheus text).

Every error is one JSON line ``{"error": {"message", "code"}}`` with its status (400 malformed, 422 a wrong field,
413 too long, more samples than the queue holds (``"type": "too_many_samples"``, ``max_queue``) or a body past
``--max-body-mb`` (``"type": "body_too_large"``, ``max_body_bytes``: :mod:`rmfast.serve.body_cap`), 429 queue full
with ``Retry-After``, 504 past the timeout, 503 draining, 401 no or a wrong key, 500 a non-finite score naming the
model) and one log line; never a traceback to the client. A client that disconnects takes its samples out of the
queue (logged as 499)."""

# no `from __future__ import annotations`: FastAPI reads the route functions' annotations as objects (the body
# models are made inside build_app, so that importing this module needs neither FastAPI nor pydantic)

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import UserError
from ..scoring.candidates import TooLong, tokenize_rows
from ..scoring.conversation import as_conversation, blank_words
from ..scoring.rendered import check_not_rendered, template_marks
from ..template import build_template
from .body_cap import DEFAULT_MB, DRAIN_MAX, PastCap, capped, content_length, drain, expects_continue, too_large
from .core import ServeCore
from .errors import (ApiError, check_unicode, error_response, gone_mid_body, http_line, internal_line, json_type,
                     key_refusal, validation_line)
from .metrics import Metrics
from .scheduler import Draining, QueueFull, Scheduler
from .turns import sampled_reply, prompt_turns, rerender_query

log = logging.getLogger("rmfast.serve")

#: the routes that need the API key (``/health`` answers anyone: load balancers and readiness probes)
OPEN_ROUTES = ("/health",)


@dataclass
class ServeConfig:
    """The server's own settings (the scoring options live in the core)."""

    name: str = "model"
    revision: str | None = None
    api_key: str | None = None
    max_request_tokens: int | None = None
    timeout_s: float = 180.0
    rerender: bool = False
    max_body_bytes: int = DEFAULT_MB << 20
    extra: dict = field(default_factory=dict)


#: /classify model names other than the server's said in the log (each once); past them, no more are
OTHER_NAMES = 64
#: the conversations' templates kept (Ctx.template): at most this many, and this many ids in all
TEMPLATE_CACHE, TEMPLATE_CACHE_IDS = 1024, 1 << 22
#: a request's characters from which its texts are tokenized off the event loop (Ctx.tokenize_off_loop): ~0.1 s of
#: a fast tokenizer's time
OFF_LOOP_CHARS = 200_000


class Ctx:
    """What every route reads: the core, the scheduler, the settings, and the helpers that turn a request's texts
    into samples and samples into scores (errors as the module doc says)."""

    def __init__(self, core: ServeCore, config: ServeConfig, sched: Scheduler):
        self.core, self.config, self.sched, self.metrics = core, config, sched, Metrics()
        self.tmpl_cache: dict = {}  # conversation -> its template (TEMPLATE_CACHE entries, TEMPLATE_CACHE_IDS ids)
        self._tmpl_ids = 0
        self._marks: tuple | None = None  # the RM's template's special tokens (template_marks), once
        self._turn_end: tuple | None = None  # the ids the RM's template ends a reply with (its suffix), once
        self.said_short_end = False
        self._paths: frozenset | None = None
        self.other_names: set = set()  # /classify model names not this server's, said once each
        self.admitted = 0  # requests whose whole body came and that are not yet answered: a drain waits for them

    def paths(self, app) -> frozenset:
        """The app's route paths (the metrics' route labels; any other path is counted as "other")."""
        if self._paths is None:
            self._paths = frozenset(r.path for r in app.routes if hasattr(r, "methods"))
        return self._paths

    def check_key(self, headers) -> None:
        """401 unless ``headers`` (a request's) carry the API key, where the server has one."""
        if (refused := key_refusal(self.config.api_key, headers)) is not None:
            raise refused

    async def run(self, samples, request=None) -> np.ndarray:
        """The samples' scores through the scheduler; 429, 503, 504 and a non-finite score as ApiErrors. ``request``:
        the HTTP request, watched: a client that disconnects takes its samples out of the queue (499)."""
        cfg, sched = self.config, self.sched
        self.fits(len(samples))
        score = asyncio.ensure_future(sched.score(samples))
        watch = [asyncio.ensure_future(_disconnect(request))] if request is not None else []
        try:
            done, _ = await asyncio.wait([score, *watch], timeout=cfg.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:  # cancelling the score while it waits takes its samples out of the queue (Scheduler.score)
            for t in (score, *watch):
                t.cancel()
        if score not in done:
            if watch and watch[0] in done:
                raise ApiError(499, "the client disconnected before its scores; its samples left the queue")
            raise ApiError(504, f"not scored within --timeout-s {cfg.timeout_s:g} s ({sched.load_line()}); retry, or "
                                "raise --timeout-s")
        try:
            scores = score.result()
        except QueueFull as e:
            raise ApiError(429, str(e), {"Retry-After": str(e.retry_after)}) from None
        except Draining:  # the scheduler stopped (a body that came after the drain ended)
            raise ApiError(503, DRAINING) from None
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            k = int(bad[0])
            raise ApiError(500, f"the reward model {cfg.name} gave a non-finite score ({scores[k]}) for sample {k} of "
                                f"this request ({len(samples[k].ids)} tokens): a numeric overflow in the model (float16 "
                                "past 65,504?); try --dtype float32 or bfloat16")
        return scores

    def fits(self, n: int) -> None:
        """413 for a request of more samples than the queue ever holds (a 429 would be retried forever); the routes
        ask before they tokenize (200,000 short queries had held every client for 7 s before this answer)."""
        if n > self.sched.max_queue:
            raise ApiError(413, f"this request holds {n} samples, more than the queue ever holds (--max-queue "
                                f"{self.sched.max_queue}); send at most that many a request, or raise --max-queue",
                           extra={"type": "too_many_samples", "max_queue": self.sched.max_queue})

    def fits_chars(self, texts, what: str) -> None:
        """413 for a text no tokenization could fit in the positions (more characters than the limit times the
        longest token's: :attr:`rmfast.serve.core.ServeCore.longest_token_chars`), before it is tokenized: a 20 MiB
        query had held every client and /health ~10 s on the event loop before its 413. ``texts``: (k, text or chat
        messages) of one request."""
        limit = min(x for x in (self.config.max_request_tokens, self.core.limit, math.inf) if x is not None)
        if limit == math.inf or self.core.longest_token_chars is None:  # (no bound this tokenizer can give)
            return
        most = int(limit) * self.core.longest_token_chars
        for k, t in texts:
            n = len(t) if isinstance(t, str) else sum(len(str(m.get("content", ""))) for m in t if hasattr(m, "get"))
            if n > most:
                raise ApiError(413, f"{what} {k} is {n:,} characters: more than {int(limit):,} tokens could hold "
                                    f"(at most {self.core.longest_token_chars} characters a token here); shorten it")

    def sample(self, ids, k: int, prompt_ids=None, what: str = "sample"):
        """A :class:`rmfast.serve.core.Sample` of ``ids``; 413 over --max-request-tokens or the model's positions."""
        n, limit = len(ids), self.config.max_request_tokens
        # the prompt's share said: a long prompt's 413 had blamed a one-token response
        size = f"{n} tokens" + (f" ({len(prompt_ids)} of them its prompt's)" if prompt_ids else "")
        if limit is not None and n > limit:
            raise ApiError(413, f"{what} {k} is {size}, over --max-request-tokens {limit}")
        if self.core.limit is not None and n > self.core.limit:
            raise ApiError(413, f"{what} {k} is {size}, over the model's {self.core.limit} positions")
        try:
            return self.core.sample(ids, prompt_ids)
        except UserError as e:
            raise ApiError(400, f"{what} {k}: {e}") from None

    def note_short_end(self, ids_list) -> None:
        """Say once (a log line) where a /get_reward query ends part-way through the RM's own end of turn: a ChatML
        policy's sample ends in ``<|im_end|>``, the RM's rendering in ``<|im_end|>`` and a newline, so the score is read
        one position earlier than the RM's training put it (OpenRLHF's own server reads it there too)."""
        if self.said_short_end:
            return
        if self._turn_end is None:
            core = self.core
            self._turn_end = tuple(build_template(core.tokenizer, "hello", template=core.template).suffix_ids)
        end = self._turn_end
        for ids in ids_list:
            if len(end) < 2 or tuple(ids[-len(end):]) == end:
                continue
            k = next((k for k in range(len(end) - 1, 0, -1) if tuple(ids[-k:]) == end[:k]), 0)
            if k:
                tok = self.core.tokenizer
                log.warning("rmfast serve: /get_reward: a query ends in %r where the reward model's own rendering ends a "
                            "reply in %r: scored as sent, %d position(s) earlier than the model's training read it (as "
                            "OpenRLHF's own server does); --rerender scores the model's own rendering (said once)",
                            tok.decode(list(end[:k])), tok.decode(list(end)), len(end) - k)
                self.said_short_end = True
                return

    def tokenize(self, texts: list[str], special: bool) -> list[list[int]]:
        return self.core.tokenizer(list(texts), add_special_tokens=special)["input_ids"] if texts else []

    async def tokenize_off_loop(self, texts: list[str], special: bool) -> list[list[int]]:
        """:meth:`tokenize`, in a worker thread where the texts are long (at least :data:`OFF_LOOP_CHARS` characters;
        a fast tokenizer lets go of the interpreter lock while it encodes), so a long request does not hold every
        other client and /health while it is tokenized; short ones inline (a thread hop costs more than they do)."""
        return await self.off_loop(sum(len(t) for t in texts), self.tokenize, texts, special)

    async def off_loop(self, chars: int, fn, *args):
        """``fn(*args)``, in a worker thread where it reads at least :data:`OFF_LOOP_CHARS` characters (tokenizing,
        or rendering again with the RM's template, which tokenizes), inline below."""
        if chars < OFF_LOOP_CHARS:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    def template(self, prompt, where: str, rendered_ok: bool = False):
        """The RM's template around a conversation's reply (UserError naming ``where`` for a malformed prompt, and for
        one that holds the RM's template already, as :meth:`RewardScorer.template_for
        <rmfast.scoring.scorer.RewardScorer.template_for>` refuses it: templated again it is scored silently wrong;
        ``rendered_ok``: read it as the user's text, slime's ``/reward``)."""
        conv = as_conversation(prompt, where)
        if not rendered_ok:
            if self._marks is None:
                self._marks = template_marks(self.core.tokenizer, self.core.template)
            check_not_rendered(conv.prompt, self._marks, where, "POST /get_reward or /classify (the whole text)")
        t = self.tmpl_cache.get(conv)
        if t is None:
            core = self.core
            t = build_template(core.tokenizer, conv.prompt, template=core.template, system=conv.system,
                               history=conv.history)
            limit = min(x for x in (self.config.max_request_tokens, core.limit, math.inf) if x is not None)
            n = len(t.prefix_ids) + len(t.suffix_ids)
            if len(t.prefix_ids) < limit and n <= TEMPLATE_CACHE_IDS:  # a prompt no sample of which fits (413) is not
                # kept (300 refused prompts had held 150 MB), nor one past the whole bound; the cache is bounded by
                # the ids it holds, not only by count
                if len(self.tmpl_cache) >= TEMPLATE_CACHE or self._tmpl_ids + n > TEMPLATE_CACHE_IDS:
                    self.tmpl_cache.clear()
                    self._tmpl_ids = 0
                self.tmpl_cache[conv] = t
                self._tmpl_ids += n
        return t

    def conv_samples(self, prompt, responses: list[str], k: int, compat: str | None = None,
                     where: str | None = None, rendered_ok: bool = False) -> list:
        """A conversation's responses as samples, templated as RewardScorer does (each response's ids in context).
        A blank response is refused, except under ``compat`` (a policy's sampled text, which never stops training:
        verl's reward function, slime's ``/reward``), where it is scored as an empty assistant turn."""
        where = f"conversations[{k}]" if where is None else where
        self.fits_chars([(k, prompt)], "conversation prompt")
        self.fits_chars(list(enumerate(responses)), f"{where} response")
        blank = [j for j, r in enumerate(responses) if not r.strip()]
        try:
            t = self.template(prompt, f"{where}.prompt", rendered_ok)
            if blank and compat is None:
                raise UserError(f"{where}.responses[{blank[0]}] is {blank_words(responses[blank[0]])}; "
                                "every response needs some text (a policy's "
                                "sampled text: send compat: decode-retokenize, which scores it as an empty turn)")
            rows = tokenize_rows(self.core.tokenizer, [(0, r, k, j) for j, r in enumerate(responses) if r.strip()],
                                 [t], compat=compat)
        except TooLong as e:  # a response past what the template renders (millions of characters)
            raise ApiError(413, str(e)) from None
        except UserError as e:
            raise ApiError(422, str(e)) from None
        if blank and not t.suffix_ids:
            raise ApiError(422, f"{where}.responses[{blank[0]}] is empty, and the reward model's template ends the "
                                "reply with no token of its own, so there is no position to score; send some text")
        rows, out = iter(rows), []
        for j in range(len(responses)):
            if j in blank:  # the template's turn with nothing in it
                ids = (*t.prefix_ids, *t.suffix_ids)
            else:  # a compat row that merged with the template carries its own (the whole conversation re-tokenized)
                row = next(rows)
                rt = row.template or t
                ids = (*rt.prefix_ids, *row.ids, *rt.suffix_ids)
            out.append(self.sample(ids, j, t.prefix_ids, f"{where} response"))  # response j (k: the conversation)
        return out

    def reward_sample(self, prompt, response: str):
        """slime's sample (``POST /reward``) in the RM's own template: chat messages as they are; a text in a known
        chat template split back into its turns (what the template opened the reply with kept in front of it);
        any other text as the user's message. The reply's own end-of-turn mark is dropped. An empty reply is
        scored as an empty assistant turn, and a reply that merges with the template as the whole conversation
        re-tokenizes: slime retries a refused sample and then stops its run."""
        self.fits_chars([(0, prompt), (0, response)], "sample")  # before any reading of the texts (module doc)
        read = "messages" if not isinstance(prompt, str) else "text"
        got = prompt_turns(prompt) if read == "text" else None
        if got is not None:
            read, (prompt, opened) = "turns", got
            response = opened + response
        response = sampled_reply(response, (self.core.tokenizer.eos_token,))  # the template ends the turn itself
        self.metrics.reward_read(read)
        # a text in no known template is the user's message, marks and all: slime retries a refused sample, then stops
        return self.conv_samples(prompt, [response], 0, "decode-retokenize", where="body", rendered_ok=True)[0]

    def about(self) -> dict:
        return {"model": self.config.name, "revision": self.config.revision, "score_meaning": self.core.score_meaning}


DRAINING = "the server is shutting down: it finishes the requests it has and takes no new ones"


async def _disconnect(request) -> None:
    """Returns once the client of ``request`` (its body read) has gone. No polling: the server's next message on a
    read request is ``http.disconnect`` (uvicorn sends it when the connection drops, or once the response is sent,
    by which time the watch has been cancelled)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(core: ServeCore, config: ServeConfig, scheduler: Scheduler | None = None):
    """The FastAPI app serving ``core`` (the ``serve`` extra: fastapi, uvicorn)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request

    ctx = Ctx(core, config, scheduler or Scheduler(core))

    # FastAPI reads the annotation: the request, not a query parameter. Async, so that it runs on the event loop: a
    # plain function goes to a worker thread, whose start reads asyncio's task set unlocked ("Set changed size
    # during iteration" under Ray Serve 2.55's replica, a 500 for the request)
    async def auth(request: Request) -> None:
        ctx.check_key(request.headers)

    ctx.auth = auth

    @asynccontextmanager
    async def lifespan(app):
        await ctx.sched.start()
        yield
        await ctx.sched.stop()

    app = FastAPI(title="rmfast serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    _errors_and_counts(app, ctx)
    _openrlhf_route(app, ctx)
    _vllm_route(app, ctx)
    _slime_route(app, ctx)
    _rmfast_routes(app, ctx)
    _info_routes(app, ctx)
    return app


def _errors_and_counts(app, ctx: Ctx) -> None:
    """One JSON line and one log line per error; every request counted; 503 while draining."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    def logged(request, status: int, line: str, headers=None, extra=None):
        log.warning("rmfast serve: %s %s -> %d: %s", request.method, request.url.path, status, line)
        return error_response(status, line, headers, extra)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return logged(request, exc.status, exc.message, exc.headers, exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc):
        kind = request.headers.get("content-type", "")
        if not json_type(kind) and any(tuple(e.get("loc", ())) == ("body",) for e in exc.errors()):
            return logged(request, 415, f"the body was sent as {kind.split(';')[0] or 'no content type'}, not JSON: send "
                                        "'Content-Type: application/json' (curl: --json, or -H 'Content-Type: "
                                        "application/json'; requests: json=...)")
        return logged(request, *validation_line(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc):  # no route (404), a wrong method (405), a body not read (400)
        if isinstance(exc.__cause__, PastCap):  # a chunked body past the cap (FastAPI's 400 "parsing the body")
            line, extra = too_large(ctx.config.max_body_bytes)
            return logged(request, 413, line, extra=extra)
        return logged(request, 499 if gone_mid_body(exc) else exc.status_code, http_line(app, request, exc),
                      getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception):  # (an error in the counter itself: the rest are _Count's)
        return logged(request, 500, internal_line(exc))

    app.add_middleware(_Count, ctx=ctx, owner=app)


class _Count:
    """Every request counted (route, status, seconds) and 503 while draining: a plain ASGI middleware, where
    ``@app.middleware("http")`` (Starlette's BaseHTTPMiddleware) ran each request in an anyio task group with
    memory streams, on the event loop thread, whose interpreter lock the wave's worker thread waits for."""

    def __init__(self, app, ctx: Ctx, owner):  # app: the next ASGI app; owner: the FastAPI app (its routes' paths)
        self.app, self.ctx, self.owner = app, ctx, owner
        from starlette.datastructures import Headers

        self.headers = Headers  # a request's headers, read for its key before its body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx, t0, path = self.ctx, time.perf_counter(), scope["path"]
        status, limit, size = 500, ctx.config.max_body_bytes, content_length(scope)
        if ctx.sched.draining and path not in OPEN_ROUTES:
            status = 503
            log.warning("rmfast serve: %s %s -> 503: %s", scope["method"], path, DRAINING)
            await error_response(503, DRAINING)(scope, receive, send)
        elif path not in OPEN_ROUTES and (refused := key_refusal(ctx.config.api_key, self.headers(scope=scope))):
            status = 401  # before the body is read: a client without the key had got the JSON parser's details (400)
            log.warning("rmfast serve: %s %s -> 401: %s", scope["method"], path, refused.message)
            await error_response(401, refused.message)(scope, receive, send)
        elif size is not None and size > limit and path not in OPEN_ROUTES:  # refused unread (body_cap's module doc)
            status, (line, extra) = 413, too_large(limit, size)
            log.warning("rmfast serve: %s %s -> 413: %s", scope["method"], path, line)
            whole = not expects_continue(scope) and size <= limit + DRAIN_MAX and await drain(receive)
            close = None if whole else {"connection": "close"}  # a body not read: the connection cannot go on
            await error_response(413, line, close, extra)(scope, receive, send)
        else:
            admitted = False

            def arrived():  # the whole body came: taken, so answered even if a drain begins now (server.run_server)
                nonlocal admitted
                if not admitted:
                    admitted, ctx.admitted = True, ctx.admitted + 1

            receive = capped(receive, limit, arrived)

            async def counted(message):
                nonlocal status, started
                if message["type"] == "http.response.start":
                    status, started = message["status"], True
                await send(message)

            started = False
            try:
                await self.app(scope, receive, counted)
            except Exception as exc:  # past the route's handlers (a wave that failed alone: a CUDA out-of-memory)
                if started:
                    raise
                # answered and counted here: Starlette's outer handler would answer too, but re-raise, and uvicorn
                # then closes the connection, so the client's next request on it (a good one) was reset
                line = internal_line(exc)  # the client gets one line; the log the traceback (a bug's is needed)
                log.error("rmfast serve: %s %s -> 500: %s", scope["method"], path, line, exc_info=exc)
                await error_response(500, line)(scope, receive, counted)
            finally:
                if admitted:
                    ctx.admitted -= 1
        route = path if path in ctx.paths(self.owner) else "other"
        ctx.metrics.request(route, status, time.perf_counter() - t0,
                            scored=scope["method"] == "POST" and route != "other" and status == 200)


def _openrlhf_route(app, ctx: Ctx) -> None:
    """``POST /get_reward`` (the module doc)."""
    from fastapi import Depends, Request
    from pydantic import BaseModel, ConfigDict

    class RewardBody(BaseModel):
        model_config = ConfigDict(extra="allow")
        query: list[str] | str
        prompts: list[str | None] | str | None = None
        labels: list | str | None = None

    @app.post("/get_reward", dependencies=[Depends(ctx.auth)])
    async def get_reward(body: RewardBody, request: Request):
        check_unicode(body.model_dump())
        queries = [body.query] if isinstance(body.query, str) else body.query
        ctx.fits(len(queries))
        ctx.fits_chars(list(enumerate(queries)), "query")
        prompts = [body.prompts] if isinstance(body.prompts, str) else body.prompts
        if prompts is not None:  # tokenized too: bounded as the queries are (they had escaped the bound)
            ctx.fits_chars([(k, p) for k, p in enumerate(prompts) if p], "prompt")
        for name, got in (("prompts", prompts), ("labels", body.labels)):
            got = [got] if isinstance(got, str) else got
            if got is not None and len(got) != len(queries):  # a misaligned batch: refused, though labels go unread
                raise ApiError(422, f"{name}: {len(got)} {name} for {len(queries)} queries; send one per query")
        if not queries:  # nothing to score: no wave (an empty one had run, and could get 429 or 504)
            logs = {"rm_tokens": [], "rm_prompt_tokens": [], **({"rm_rerendered": []} if ctx.config.rerender else {})}
            return {"rewards": [], "scores": [], "extra_logs": logs}
        rerendered = []
        if ctx.config.rerender:  # off the event loop where long, as tokenizing is (it held /health 2.7 s on 4 MB)
            got = await ctx.off_loop(sum(map(len, queries)), lambda: [
                rerender_query(ctx.core, q, p) for q, p in zip(queries, prompts or [None] * len(queries))])
            rerendered = [g is not None for g in got]
            plain = [q for g, q in zip(got, queries) if g is None]
            as_sent = iter(await ctx.tokenize_off_loop(plain, False))
            ids = [g if g is not None else next(as_sent) for g in got]
        else:
            ids = await ctx.tokenize_off_loop(queries, False)
            ctx.note_short_end(ids)
        p_ids = (await ctx.tokenize_off_loop([p or "" for p in prompts], False) if prompts is not None
                 else [None] * len(queries))
        samples = [ctx.sample(i, k, p if p else None, "query") for k, (i, p) in enumerate(zip(ids, p_ids))]
        scores = [float(s) for s in await ctx.run(samples, request)]
        logs = {"rm_tokens": [len(s.ids) for s in samples], "rm_prompt_tokens": [s.split for s in samples]}
        if ctx.config.rerender:
            logs["rm_rerendered"] = [int(r) for r in rerendered]
        return {"rewards": scores, "scores": scores, "extra_logs": logs}


def _vllm_route(app, ctx: Ctx) -> None:
    """``POST /classify``, vLLM's body and response (the module doc)."""
    from fastapi import Depends, Request
    from pydantic import BaseModel, ConfigDict, StrictBool

    class ClassifyBody(BaseModel):
        model_config = ConfigDict(extra="allow")
        model: str | None = None
        input: list[str] | str
        use_activation: StrictBool | None = None  # strict: "no" is not false (pydantic's lax mode took it so)
        add_special_tokens: StrictBool = True

    @app.post("/classify", dependencies=[Depends(ctx.auth)])
    async def classify(body: ClassifyBody, request: Request):
        check_unicode(body.model_dump())
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ApiError(422, "input: an empty list; send a text or a list of texts")
        ctx.fits(len(texts))
        ctx.fits_chars(list(enumerate(texts)), "input")
        if body.model and body.model != ctx.config.name and body.model not in ctx.other_names:
            # answered all the same (a trainer's config may name the model by a path or hub id where the server was
            # started with an alias); said once in the log, so a config pointing at the wrong server shows. The
            # names are the clients': kept up to OTHER_NAMES (a name per run or step would grow without bound)
            if len(ctx.other_names) < OTHER_NAMES:
                ctx.other_names.add(body.model)
                log.warning("rmfast serve: /classify asked for model %r; this server scores %r (answered, said once%s)",
                            body.model[:200] + ("..." if len(body.model) > 200 else ""), ctx.config.name,
                            "; the last name said: more go unsaid" if len(ctx.other_names) == OTHER_NAMES else "")
        ids = await ctx.tokenize_off_loop(texts, body.add_special_tokens)  # vLLM adds them (verl strips its BOS)
        samples = [ctx.sample(i, k, None, "input") for k, i in enumerate(ids)]
        scores = [float(s) for s in await ctx.run(samples, request)]
        act = body.use_activation is not False  # vLLM's default: the activation on
        core = ctx.core
        label = (getattr(core.model.config, "id2label", None) or {}).get(core.head_index, f"LABEL_{core.head_index}")
        n_tok = sum(len(s.ids) for s in samples)
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": ctx.config.name,  # the model that scored (vLLM's answer names its own; the client's, up to
                # 100,000 characters, had been echoed)
                "data": [{"index": k, "label": label, "probs": [_sigmoid(v) if act else v], "num_classes": 1}
                         for k, v in enumerate(scores)],
                "usage": {"prompt_tokens": n_tok, "total_tokens": n_tok, "completion_tokens": 0,
                          "prompt_tokens_details": None}}


def _slime_route(app, ctx: Ctx) -> None:
    """``POST /reward``: slime's remote reward model, one sample per request, answered with a bare number."""
    from typing import Any

    from fastapi import Depends, Request
    from pydantic import BaseModel, ConfigDict

    class OneBody(BaseModel):
        model_config = ConfigDict(extra="allow")
        prompt: str | list[dict]
        response: str
        label: Any = None  # the task's answer, for rule-based rewards; a reward model does not read it

    @app.post("/reward", dependencies=[Depends(ctx.auth)])
    async def reward(body: OneBody, request: Request):
        check_unicode(body.model_dump())
        sample = ctx.reward_sample(body.prompt, body.response)
        return float((await ctx.run([sample], request))[0])


def _rmfast_routes(app, ctx: Ctx) -> None:
    """``POST /v1/score`` and ``POST /v1/rerank`` (the module doc)."""
    from typing import Annotated, Any

    from fastapi import Depends, Request
    from pydantic import BaseModel, ConfigDict, Field, StrictInt

    class ConvItem(BaseModel):
        model_config = ConfigDict(extra="forbid")
        prompt: str | list[dict]
        responses: list[str]

    class ScoreBody(BaseModel):
        model_config = ConfigDict(extra="forbid")
        conversations: list[ConvItem]
        states: Any = None  # never served: any value gets the one line below, whatever its type
        compat: Literal["decode-retokenize"] | None = None

    class RerankBody(BaseModel):
        model_config = ConfigDict(extra="forbid")
        prompt: str | list[dict]
        responses: list[str]
        top_n: Annotated[StrictInt, Field(ge=0)] | None = None  # strict: "1" is not 1

    @app.post("/v1/score", dependencies=[Depends(ctx.auth)])
    async def v1_score(body: ScoreBody, request: Request):
        check_unicode(body.model_dump())
        if body.states not in (None, False, "", []):
            raise ApiError(422, "states: hidden states are not served (their size per sample is the model's width); "
                                "use RewardScorer.score_with_states or rmfast scan --states in-process")
        ctx.fits(sum(len(c.responses) for c in body.conversations))
        per = [ctx.conv_samples(c.prompt, c.responses, k, body.compat) for k, c in enumerate(body.conversations)]
        flat = [s for p in per for s in p]
        scores = await ctx.run(flat, request) if flat else np.zeros(0, dtype=np.float32)
        out, k = [], 0
        for p in per:
            out.append([float(v) for v in scores[k:k + len(p)]])
            k += len(p)
        return {"scores": out, **ctx.about()}

    @app.post("/v1/rerank", dependencies=[Depends(ctx.auth)])
    async def v1_rerank(body: RerankBody, request: Request):
        check_unicode(body.model_dump())
        ctx.fits(len(body.responses))
        samples = ctx.conv_samples(body.prompt, body.responses, 0)
        scores = await ctx.run(samples, request) if samples else np.zeros(0, dtype=np.float32)
        order = sorted(range(len(samples)), key=lambda j: (-float(scores[j]), j))  # ties: input order
        top = order[: body.top_n] if body.top_n is not None else order
        return {"results": [{"index": j, "response": body.responses[j], "score": float(scores[j])} for j in top],
                **ctx.about()}


def _info_routes(app, ctx: Ctx) -> None:
    """``GET /health``, ``/v1/models``, ``/metrics``."""
    from fastapi import Depends
    from fastapi.responses import PlainTextResponse

    @app.api_route("/health", methods=["GET", "HEAD"])  # load balancers' probes send HEAD too (it had been a 405)
    async def health():
        if ctx.sched.draining:
            return error_response(503, "draining")
        return {"status": "ok", "model": ctx.config.name}

    @app.get("/v1/models", dependencies=[Depends(ctx.auth)])
    async def models():
        core, sched, cfg = ctx.core, ctx.sched, ctx.config
        return {"object": "list", "data": [{"id": cfg.name, "object": "model", "owned_by": "rmfast",
                                            "revision": cfg.revision, "score_meaning": core.score_meaning,
                                            "max_model_len": core.limit, "max_body_bytes": cfg.max_body_bytes,
                                            "decisions": core.decisions,
                                            "scheduler": {"max_queue": sched.max_queue, "wave_tokens": sched.wave_tokens,
                                                          "max_wait_s": sched.max_wait_s},
                                            **cfg.extra}]}

    @app.get("/metrics", dependencies=[Depends(ctx.auth)])
    async def get_metrics():
        return PlainTextResponse(ctx.metrics.text(ctx.core, ctx.sched, ctx.admitted),
                                 media_type="text/plain; version=0.0.4")


def _sigmoid(x: float) -> float:
    """The activation of a one-logit head (vLLM's softmax of one logit is always 1.0)."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
