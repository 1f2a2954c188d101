"""Clients of ``rmfast serve`` (:mod:`rmfast.serve`): a scorer with :class:`rmfast.scoring.scorer.RewardScorer`'s
``score`` that calls the server instead of a local model, for TRL's GRPO (``rmfast_reward("http://host:port")``,
:mod:`rmfast.integrations.grpo`) and any other Python caller in another process or on another machine.

The server answers the same bits as it would for any other batch (docs/serving.md), so a reward computed over
HTTP equals the server's in-process score; against a local ``RewardScorer`` it agrees to rounding (another batch
shape), bit for bit in fp32 where the server's probe chose one-GEMM rows and the batch shapes match.

>>> RemoteScorer("localhost:8000")
Traceback (most recent call last):
rmfast.errors.UserError: url 'localhost:8000': give the server's address as http://host:port (or https://...)
"""

from __future__ import annotations

import os

from ..errors import UserError, missing_package
from ..scoring.candidates import TooLong

#: the API key's environment variable (as the server's)
API_KEY_ENV = "RMFAST_API_KEY"


def is_url(x) -> bool:
    """Whether ``x`` names a server (http:// or https://) rather than a model."""
    return isinstance(x, str) and x.startswith(("http://", "https://"))


def httpx_module():
    """httpx (the serve extra), or one UserError naming the extra: a bare ModuleNotFoundError had been the reward
    function's first call, inside a GRPO run."""
    try:
        import httpx
    except ImportError as e:
        raise (missing_package(e, "a client of rmfast serve") or e) from None
    return httpx


def _headers(api_key: str | None) -> dict:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
    return {"Authorization": f"Bearer {key}"} if key else {}


def _error_body(text: str) -> dict:
    """The server's error object (``{"message", "code", ...}``) in an answer's text, or {} where it holds none."""
    try:
        import json

        err = json.loads(text)["error"]
        return err if isinstance(err, dict) else {}
    except Exception:
        return {}


def _error_line(status: int, text: str) -> str:
    msg = _error_body(text).get("message")
    if msg is not None:
        return msg
    return text.strip().splitlines()[0][:300] if text.strip() else f"HTTP {status}"


class ServerAnswer(UserError):
    """A server's error relayed to a Python caller: its line names the SERVER's options as it wrote them
    (``--max-queue``, ``--timeout-s``), where a UserError's names them as this process's Python arguments ("raise
    timeout_s" named the client's own argument, which would not help)."""

    def __str__(self) -> str:
        return self.cli_message()


class ServerTooLong(ServerAnswer, TooLong):
    """The server's 413 for a sample longer than it takes (a :class:`TooLong`: the GRPO adapter gives it None)."""


class TooManySamples(ServerAnswer):
    """A request of more samples than the server's queue ever holds (its 413 of type ``too_many_samples``): not a
    sample too long. ``limit``: the most samples a request may hold (:class:`RemoteScorer` splits by it)."""

    def __init__(self, message: str, limit: int):
        super().__init__(message)
        self.limit = limit


class BodyTooLarge(ServerAnswer):
    """A request whose body is past the server's ``--max-body-mb`` (its 413 of type ``body_too_large``):
    :class:`RemoteScorer` sends it again in smaller parts; a single sample past it is a :class:`ServerTooLong`."""


#: seconds a learned request size (:attr:`RemoteScorer.max_samples`) is kept before the server is asked again (one
#: 413 then, where its queue is as it was)
RELEARN_S = 600.0

#: seconds of connection errors a client waits out where no try has reached the server (a wrong address, a server
#: not started): :class:`Retries`
UNREACHED_S = 30.0


class Retries:
    """The one retry rule of every client of ``rmfast serve`` (:class:`RemoteScorer`, verl's ``compute_score`` and
    ``compute_score_sync``). After a connection error wait 1, 2, 4 ... (at most 10) s; after a 429 or 503 the
    server's Retry-After, longer after each (x1, x1.5, x2 ..., at most 30 s); every wait jittered by x0.5-1.5, so the
    clients a full queue turned away do not all come back at the same instant (a thousand verl calls at once had:
    144 gave up in 5 tries while the server, never stopped, worked through the rest). Tries go on while
    ``patience_s`` lasts (a rolling restart, a model loading), or, where ``retries`` is given, at most that many. Any
    other answer but 200 is one UserError naming it. A caller's loop sleeps (or awaits) each of :meth:`waits`,
    tries with :meth:`timeout` as the try's own limit, and hands the outcome to :meth:`answer`.

    >>> from types import SimpleNamespace as R
    >>> t = Retries("http://h:1", 2)
    >>> [t.answer(R(status_code=429, headers={"retry-after": "0"}, text="full")) for _ in t.waits()]
    Traceback (most recent call last):
    rmfast.integrations.remote.ServerAnswer: rmfast serve at http://h:1 answered 429: full
    """

    def __init__(self, url: str, retries: int | None = None, patience_s: float = 180.0):
        self.url, self.last, self._wait = url, None, 0.0
        self.retries = None if retries is None else max(1, int(retries))
        self.patience_s = float(patience_s)
        self._attempt = self._busy = 0
        self._t0, self._done, self._reached = None, False, False

    def waits(self):
        """Seconds to wait before each try (0 before the first), while tries are left."""
        import time

        self._t0, self._attempt, self._wait, self._done = time.monotonic(), 0, 0.0, False
        while True:
            yield self._wait
            if self._done:
                return
            self._attempt += 1

    def timeout(self) -> float:
        """Seconds the next try may take: what is left of ``patience_s`` (at least 1 s), so that the last try ends
        with the patience (a try given the whole patience as its own limit had run up to twice it: a try begun at
        170 s of 180 waited 180 s more); ``patience_s`` itself where ``retries`` counts the tries.

        >>> Retries("http://h:1", patience_s=60).timeout() <= 60
        True
        """
        import time

        if self.retries is not None or self._t0 is None:
            return self.patience_s
        return max(1.0, self.patience_s - (time.monotonic() - self._t0))

    def _more(self, wait: float) -> bool:
        """Whether another try is left after ``wait`` more seconds. Where no try has reached a server yet, connection
        errors get :data:`UNREACHED_S` at most: a wrong address says so in half a minute, not after the whole
        patience (a server that answered, then went, is restarting: it gets all of it)."""
        import time

        if self.retries is not None:
            return self._attempt + 1 < self.retries
        patience = self.patience_s if self._reached else min(self.patience_s, UNREACHED_S)
        return time.monotonic() - self._t0 + wait <= patience

    def answer(self, r):
        """The outcome of a try (an httpx response, or the ``httpx.HTTPError`` it raised): the response where it is
        a 200, None where the rule tries again (or, after a connection error, has no try left: :meth:`gave_up`)."""
        import random

        if isinstance(r, Exception):
            self.last, self._wait = f"{type(r).__name__}: {r}", min(2 ** self._attempt, 10) * random.uniform(0.5, 1.5)
            self._done = not self._more(self._wait)
            return None
        self._reached = True
        if r.status_code in (429, 503):
            self._busy += 1
            after = float(r.headers.get("retry-after", 1))
            wait = min(after * (1 + 0.5 * (self._busy - 1)), 30.0) * random.uniform(0.5, 1.5)
            if self._more(wait):
                self.last, self._wait = _error_line(r.status_code, r.text), wait
                return None
        if r.status_code != 200:  # 413: a sample longer than the server takes (the GRPO adapter gives it None), or more
            line = f"rmfast serve at {self.url} answered {r.status_code}: {_error_line(r.status_code, r.text)}"
            err = _error_body(r.text)
            if r.status_code == 413 and err.get("type") == "too_many_samples":  # samples than its queue holds
                raise TooManySamples(line, int(err["max_queue"]))
            if r.status_code == 413 and err.get("type") == "body_too_large":  # or a body past its --max-body-mb
                raise BodyTooLarge(line)
            raise (ServerTooLong if r.status_code == 413 else ServerAnswer)(line)
        return r

    def gave_up(self) -> UserError:
        import time

        took = f"{self._attempt + 1} tries"
        if self.retries is None:
            took += f" in {time.monotonic() - self._t0:.0f} s" + (
                f" (patience {self.patience_s:g} s)" if self._reached else ", none reaching a server: is the address right?")
        return UserError(f"rmfast serve at {self.url}: no answer after {took} ({self.last})")


class RemoteScorer:
    """``score(conversations, responses)`` over HTTP (``POST /v1/score``), shaped as ``RewardScorer.score``.

    Args:
        url: the server, ``http://host:port``.
        api_key: the server's key (default: $RMFAST_API_KEY, else none).
        timeout_s: per request (default 180 s, OpenRLHF's).
        retries: at most this many tries on a connection error, 429 (after its Retry-After) or 503; default: tries
            for as long as ``timeout_s`` (:class:`Retries`).
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 180.0, retries: int | None = None):
        if not is_url(url):
            raise UserError(f"url {url!r}: give the server's address as http://host:port (or https://...)")
        self.url, self.timeout_s = url.rstrip("/"), float(timeout_s)
        self.retries = None if retries is None else max(1, int(retries))
        self.headers = _headers(api_key)
        self.max_samples: int | None = None  # a request's samples at most, once the server said (TooManySamples) ...
        self._learned_at = 0.0  # ... when (time.monotonic): forgotten after RELEARN_S, so a larger queue is found
        httpx_module()  # checked when the reward is built, not at its first call

    def score(self, conversations, responses, *, nonfinite: str = "warn", compat: str | None = None, **_ignored):
        """Scores of ``responses[i][j]`` to ``conversations[i]``, the same shape; a server error is one UserError.
        ``compat``: "decode-retokenize" scores a response that merges with the template as the template renders it.
        A request of more samples than the server's queue holds is sent again in parts of half of it (the server's
        413 names its --max-queue), and so is every later one; a part whose body is past the server's --max-body-mb
        is sent again in halves, in this call only (a single sample past it is a :class:`ServerTooLong`, the parts
        scored already are kept)."""
        from ..scoring.conversation import call_lists

        import time

        conversations, responses = call_lists(conversations, responses)  # zip below would drop extra ones unscored
        convs = [c if isinstance(c, (str, list)) else _as_messages(c) for c in conversations]
        if self.max_samples is not None and time.monotonic() - self._learned_at > RELEARN_S:
            self.max_samples = None  # asked again: a server restarted with a larger queue had been split for good
        while True:
            out = [[None] * len(rs) for rs in responses]
            try:
                most = self.max_samples or max(1, sum(len(rs) for rs in responses))
                for part in _parts(responses, most):  # [(conversation i, first j, end j)], <= most samples
                    self._fill(out, convs, responses, part, compat)
                return out
            except TooManySamples as e:  # past a queue sized for one-sample clients (or one that shrank): split
                # in halves of the queue: a part of the whole queue fits only an empty one (every try a 429 beside
                # other clients' samples)
                most = max(1, e.limit // 2)
                if self.max_samples is not None and most >= self.max_samples:
                    raise
                self.max_samples, self._learned_at = most, time.monotonic()

    def _fill(self, out: list, convs: list, responses: list, part: list, compat: str | None) -> None:
        """``out``'s slices of ``part`` scored: one request, or, where its body is past the server's cap, its two
        halves (each the same way). The halving is this call's: the cap is a matter of these samples' lengths (one
        long completion had left the scorer at one sample a request for every later GRPO step)."""
        try:
            got = self._post([convs[i] for i, _, _ in part], [responses[i][a:b] for i, a, b in part], compat)
        except BodyTooLarge as e:
            samples = [(i, j) for i, a, b in part for j in range(a, b)]
            if len(samples) <= 1:
                raise ServerTooLong(str(e)) from None
            for half in (samples[: len(samples) // 2], samples[len(samples) // 2:]):
                self._fill(out, convs, responses, _slices(half), compat)
            return
        for (i, a, b), g in zip(part, got):
            out[i][a:b] = g

    def _post(self, convs: list, responses: list, compat: str | None) -> list:
        """One ``POST /v1/score`` under the retry rule: the scores, as ``responses``."""
        import time

        httpx = httpx_module()
        body = {"conversations": [{"prompt": c, "responses": r} for c, r in zip(convs, responses)]}
        if compat not in (None, "own"):
            body["compat"] = compat
        tries = Retries(self.url, self.retries, self.timeout_s)
        for wait in tries.waits():
            time.sleep(wait)
            try:
                r = httpx.post(f"{self.url}/v1/score", json=body, headers=self.headers, timeout=tries.timeout())
            except httpx.HTTPError as e:
                r = e
            if tries.answer(r) is not None:
                return r.json()["scores"]
        raise tries.gave_up()

    def too_long(self, conversations, responses, *, compat: str | None = None) -> list[list[bool]]:
        """Whether the server refuses each ``responses[i][j]`` as too long (413: its positions or
        --max-request-tokens), asked one sample at a time: what the GRPO adapter leaves out (as None) after a call
        was refused, as it does with a local scorer's :meth:`rmfast.scoring.scorer.RewardScorer.too_long`."""
        out = []
        for c, rs in zip(conversations, responses):
            out.append([])
            for r in rs:
                try:
                    self.score([c], [[r]], compat=compat)
                    out[-1].append(False)
                except TooLong:
                    out[-1].append(True)
        return out


def _parts(responses: list, most: int):
    """The (conversation, first response, end) slices of ``responses`` in order, in requests of at most ``most``
    samples (a conversation's responses split where they do not fit).

    >>> list(_parts([["a", "b", "c"], ["d"], ["e", "f"]], 2))
    [[(0, 0, 2)], [(0, 2, 3), (1, 0, 1)], [(2, 0, 2)]]
    """
    part, n, most = [], 0, max(1, int(most))
    for i, rs in enumerate(responses):
        j = 0
        while j < len(rs):
            take = min(len(rs) - j, most - n)
            part.append((i, j, j + take))
            j, n = j + take, n + take
            if n == most:
                yield part
                part, n = [], 0
    if part:
        yield part


def _slices(samples: list) -> list:
    """(conversation, response) pairs, in order, as the (conversation, first, end) slices :func:`_parts` gives.

    >>> _slices([(0, 1), (0, 2), (1, 0)])
    [(0, 1, 3), (1, 0, 1)]
    """
    out = []
    for i, j in samples:
        if out and out[-1][0] == i and out[-1][2] == j:
            out[-1] = (i, out[-1][1], j + 1)
        else:
            out.append((i, j, j + 1))
    return out


def _as_messages(conv) -> list[dict]:
    """A :class:`rmfast.scoring.conversation.Conversation` as chat messages (what /v1/score takes)."""
    from ..scoring.conversation import messages_of

    return messages_of(conv)


__all__ = ["BodyTooLarge", "RemoteScorer", "Retries", "TooManySamples", "is_url"]
