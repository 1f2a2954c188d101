"""Waves across requests: a bounded queue of samples, gathered for at most a few milliseconds or until a wave's
token budget fills, scored by :class:`rmfast.serve.core.ServeCore` in one worker thread, results handed back to
each request.

Requests arrive one sample at a time (OpenRLHF, verl): the N samples of a GRPO group come as N requests, in any
order, among other groups'. A wave takes every waiting sample up to its token budget (whole requests, oldest
first); the core groups them by prompt, so a group that arrives within one wave is encoded once, and one that
straddles waves finds its prompt in the core's cache.

The clients a wave answered get ``max_wait_s`` from its end to send their next samples (the linger), while fewer
requests have come since than it answered, where the last wave took at least :data:`LINGER_RATIO` times as long (so
the wait costs at most a tenth of a wave). A fixed pool of clients, each sending its next sample once answered, is
otherwise cut in two: the half whose samples came while a wave ran leave at its end alone, and the half it answered
wait for the next, so every wave is half full. On a GPU a half-full wave of short rows costs nearly a full one's
time (launch-bound), so the pool's throughput halves: 16 clients on the H200 ran 128 samples in 16 waves of 8. How the waves are cut never changes a score
(:mod:`rmfast.serve.core`), so the scheduler is free to cut them for throughput alone.

A request whose client has gone (a timeout, a disconnect) is dropped from the queue if it is still waiting, or its
result is discarded if its wave is running: nobody else's result depends on it. Nor on its failure: a wave that
fails is scored again one request at a time, so only a request that fails alone gets the error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .core import Sample, ServeCore

#: the linger (module doc) waits only where the last wave took at least this many times ``max_wait_s``
LINGER_RATIO = 10


class QueueFull(Exception):
    """More samples waiting than ``max_queue``: the client should retry after ``retry_after`` seconds."""

    def __init__(self, waiting: int, limit: int, retry_after: int):
        super().__init__(f"{waiting} samples waiting, the queue holds {limit}: retry in {retry_after} s")
        self.retry_after = retry_after


class Draining(Exception):
    """The scheduler has stopped (the server's shutdown, after its drain): no wave will run for these samples."""


@dataclass(eq=False)  # a request is itself (the queue removes it by identity)
class _Request:
    samples: list
    future: asyncio.Future
    tokens: int
    t_in: float = field(default_factory=time.perf_counter)
    queued: bool = True  # in ``waiting`` (counted in ``n_waiting``) until a wave takes it or its client goes


class Scheduler:
    """Gathers samples into waves and scores them (the module doc).

    Args:
        core: the scoring core (one wave at a time, in one worker thread).
        max_queue: samples that may wait; one more is refused (:class:`QueueFull`).
        wave_tokens: a wave's token budget (the samples' whole lengths); a wave starts once it is full ...
        max_wait_s: ... or once its oldest sample has waited this long (and, the linger, the last wave's clients
            have had this long since its end to send their next samples: the module doc).
    """

    def __init__(self, core: ServeCore, *, max_queue: int = 4096, wave_tokens: int = 32768, max_wait_s: float = 0.005):
        self.core = core
        self.max_queue, self.wave_tokens, self.max_wait_s = int(max_queue), int(wave_tokens), float(max_wait_s)
        self.waiting: deque[_Request] = deque()
        self.n_waiting = 0  # samples
        self._tokens_waiting = 0  # their tokens (kept, not summed at each wake-up: one a request)
        self.in_flight = 0  # requests submitted and not yet answered
        self.n_running = 0  # samples of the wave being scored (its clients may have gone: it runs to its end)
        self.draining = False
        self.stopped = False  # stop() ran: no wave runs any more
        self._nap: asyncio.Future | None = None  # the loop's wait for a sample (or the gather's deadline): :meth:`_wait`
        self._task: asyncio.Task | None = None
        self._loop_of: asyncio.AbstractEventLoop | None = None  # the loop the scheduler runs on (:meth:`drain`)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmfast-wave")
        self.wave_s_avg = 0.0  # for Retry-After
        self.wave_s_total = 0.0  # /metrics
        self.waves_split = 0  # /metrics: waves that failed and were scored again one request at a time
        self.waves_lingered = 0  # /metrics: waves that waited for the last wave's clients (the linger)
        self.last_wave_s = 0.0
        self._answered = 0  # requests the last wave answered ...
        self._answered_at = 0.0  # ... when (time.perf_counter)
        self._since_answered = 0  # requests submitted since

    async def start(self) -> None:
        self._loop_of = asyncio.get_running_loop()
        self._task = self._loop_of.create_task(self._loop())

    def drain(self) -> None:
        """The drain: the server's door (:class:`rmfast.serve.app._Count`) takes no new requests; those it took are
        still scored here, in waves that wait for nothing more (no linger, no --max-wait-ms: :meth:`_wait_left`).
        Safe from a signal handler (the wake-up goes through the loop's thread-safe call)."""
        self.draining = True
        if self._loop_of is not None and not self._loop_of.is_closed():
            self._loop_of.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        """The loop's wait (:meth:`_wait`) ends: a sample came, or the drain began."""
        if self._nap is not None and not self._nap.done():
            self._nap.set_result(None)

    async def stop(self) -> None:
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=True)

    async def score(self, samples: list[Sample]) -> np.ndarray:
        """The samples' scores, once their wave has run (raises :class:`QueueFull`, :class:`Draining` once stopped).
        Taken while draining too: a request the server took before the drain (tokenized meanwhile) is answered."""
        if self.stopped:
            raise Draining()
        if self.n_waiting + len(samples) > self.max_queue:
            raise QueueFull(self.n_waiting, self.max_queue, self.retry_after())
        req = _Request(list(samples), asyncio.get_running_loop().create_future(), sum(len(s.ids) for s in samples))
        self.waiting.append(req)
        self.n_waiting += len(samples)
        self._tokens_waiting += req.tokens
        self.in_flight += 1
        self._since_answered += 1
        self._wake()  # idle, or the gather re-checks its budget
        try:
            return await req.future
        finally:
            self.in_flight -= 1
            # Cancelled (a timeout, a disconnect) while waiting: leave the queue now. Asked of the request, not of its
            # future: cancelling this task cancels the future it awaits too, so "not done" never held here, and a gone
            # client's samples stayed counted against max_queue until a wave reached them (spurious 429s meanwhile).
            if req.queued:
                req.queued = False
                self.waiting.remove(req)
                self.n_waiting -= len(req.samples)
                self._tokens_waiting -= req.tokens
            if not req.future.done():  # its wave is running: the result is dropped
                req.future.cancel()

    async def _alone(self, wave: list[_Request], loop) -> None:
        """A failed wave's requests scored one at a time: a score does not depend on its wave (the same bits), so one
        request's failure (a CUDA out-of-memory from its long prompt, say) is its own 500, not every co-batched
        client's. Requests whose clients have gone are skipped."""
        for r in wave:
            if r.future.done():
                continue
            self.n_running = len(r.samples)
            try:
                got = await loop.run_in_executor(self._pool, self.core.score, r.samples)
            except Exception as e:  # noqa: BLE001 - this request's own failure, told to it alone
                got = e
            finally:
                self.n_running = 0
            if not r.future.done():
                r.future.set_exception(got) if isinstance(got, Exception) else r.future.set_result(got)

    def load_line(self) -> str:
        """What a 504 says of the load."""
        return f"{self.n_waiting} samples waiting, {self.n_running} in the running wave"

    def retry_after(self) -> int:
        """Seconds until the queue is likely to have room: the waiting waves at the recent wave time."""
        waves = max(1.0, self.n_waiting * 64 / max(1, self.wave_tokens))
        return max(1, math.ceil(waves * max(self.wave_s_avg, 0.05)))

    def _take(self) -> list[_Request]:
        """The next wave: waiting requests, oldest first, until the token budget is met (at least one)."""
        wave, tokens = [], 0
        while self.waiting:
            req = self.waiting[0]
            if wave and tokens + req.tokens > self.wave_tokens:
                break
            self.waiting.popleft()
            req.queued = False
            self.n_waiting -= len(req.samples)
            self._tokens_waiting -= req.tokens
            wave.append(req)
            tokens += req.tokens
        return wave

    def _lingering(self, now: float) -> bool:
        """Whether the next wave waits for the last wave's clients (the linger, module doc): the last wave took at
        least LINGER_RATIO x max_wait_s, fewer requests have come since it ended than it answered, and its end was
        under max_wait_s ago."""
        return (not self.draining and self.last_wave_s >= LINGER_RATIO * self.max_wait_s
                and self._since_answered < self._answered and now - self._answered_at < self.max_wait_s)

    def _wait_left(self) -> tuple[float, float]:
        """Seconds the next wave may still wait for samples: (its oldest sample's own max_wait_s, the linger's; 0 where
        it does not linger). Both 0 where the queue emptied meanwhile (its clients went), and while draining (no client
        sends again: the samples waiting are scored now, where they had waited out --max-wait-ms)."""
        if not self.waiting or self.draining:
            return 0.0, 0.0
        now = time.perf_counter()
        linger = self.max_wait_s - (now - self._answered_at) if self._lingering(now) else 0.0
        return self.max_wait_s - (now - self.waiting[0].t_in), linger

    async def _wait(self, loop, left: float | None) -> None:
        """Until a sample comes or ``left`` seconds pass (None: a sample), whichever is first (no polling: the event
        loop thread's wake-ups take the interpreter lock from the wave's worker thread)."""
        self._nap = fut = loop.create_future()
        timer = None if left is None else loop.call_later(left, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._nap = None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.waiting:
                await self._wait(loop, None)
            while self.waiting:
                lingered = False  # the linger, not the oldest sample's own wait, kept this wave waiting
                while self._tokens_waiting < self.wave_tokens:
                    own, linger = self._wait_left()
                    if max(own, linger) <= 0:
                        break
                    lingered = lingered or own <= 0
                    # woken at the oldest sample's own deadline too, where the linger outlasts it: the wave counts
                    # as lingered from then on
                    await self._wait(loop, own if 0 < own < linger else max(own, linger))
                wave = self._take()
                if not wave:
                    continue
                self.waves_lingered += lingered
                samples = [s for r in wave for s in r.samples]
                t0 = time.perf_counter()
                self.n_running = len(samples)
                try:
                    scores = await loop.run_in_executor(self._pool, self.core.score, samples)
                except Exception as e:  # the wave failed: its requests alone, so only one that fails alone is told
                    self.n_running = 0
                    if len(wave) > 1:
                        self.waves_split += 1
                        await self._alone(wave, loop)
                    elif not wave[0].future.done():
                        wave[0].future.set_exception(e)
                    self._answered = 0  # no linger after a failed wave (its clients' next samples are no wave's)
                    continue
                finally:
                    self.n_running = 0
                dt = time.perf_counter() - t0
                self.wave_s_avg = dt if self.wave_s_avg == 0 else 0.8 * self.wave_s_avg + 0.2 * dt
                self.wave_s_total += dt
                self.last_wave_s = dt
                k, answered = 0, 0
                for r in wave:
                    n = len(r.samples)
                    if not r.future.done():
                        r.future.set_result(scores[k:k + n])
                        answered += 1
                    k += n
                self._answered, self._answered_at, self._since_answered = answered, time.perf_counter(), 0
