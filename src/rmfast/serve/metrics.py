"""``GET /metrics``: the server's counters in Prometheus' text format (version 0.0.4), written here from the
scheduler's and the core's own totals (a handful of counters needs no client library).

>>> m = Metrics()
>>> m.request("/get_reward", 200, 0.012)
>>> "rmfast_requests_total{route=\\"/get_reward\\",code=\\"200\\"} 1" in m.text(None, None)
True
"""

from __future__ import annotations

import bisect
import threading

#: latency histogram buckets (seconds)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0)


class Metrics:
    """Request counts by route and status, and a latency histogram; the rest is read from the core and the
    scheduler when ``/metrics`` is asked for."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict = {}  # (route, code) -> count
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.latency_n = 0
        self.reward_reads: dict = {}  # how POST /reward read its prompts -> count

    def reward_read(self, read: str) -> None:
        """One more ``POST /reward`` prompt read as ``read`` (messages, turns, text)."""
        with self._lock:
            self.reward_reads[read] = self.reward_reads.get(read, 0) + 1

    def request(self, route: str, code: int, seconds: float, scored: bool = True) -> None:
        """One request answered: counted by ``route`` (one of the app's, or "other": a label per unknown path would
        grow without bound under a port scanner) and ``code``; its latency in the histogram where ``scored`` (an
        answered scoring request: 4xx, 429s and /health would mix into the scoring latency)."""
        with self._lock:
            self.requests[(route, int(code))] = self.requests.get((route, int(code)), 0) + 1
            if scored:
                self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
                self.latency_sum += seconds
                self.latency_n += 1

    def text(self, core, scheduler, admitted: int | None = None) -> str:
        """The Prometheus text; ``admitted``: the app's requests taken and not yet answered (:class:`rmfast.serve.app.Ctx`)."""
        out = []

        def metric(name: str, kind: str, help_: str, samples):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                out.append(f"{name}{labels} {value}")

        with self._lock:
            metric("rmfast_requests_total", "counter", "HTTP requests by route and status code",
                   [(f'{{route="{r}",code="{c}"}}', n) for (r, c), n in sorted(self.requests.items())])
            cum, rows = 0, []
            for le, n in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.buckets):
                cum += n
                rows.append((f'_bucket{{le="{le}"}}', cum))
            out.append("# HELP rmfast_request_seconds latency of the scoring requests answered 200, arrival to answer")
            out.append("# TYPE rmfast_request_seconds histogram")
            out.extend(f"rmfast_request_seconds{lab} {v}" for lab, v in rows)
            out.append(f"rmfast_request_seconds_sum {self.latency_sum:.6f}")
            out.append(f"rmfast_request_seconds_count {self.latency_n}")
            if self.reward_reads:
                metric("rmfast_reward_prompts_total", "counter", "POST /reward's prompts by how they were read "
                       "(messages, turns of a known chat template, text as the user's message)",
                       [(f'{{read="{r}"}}', v) for r, v in sorted(self.reward_reads.items())])
        if scheduler is not None:
            metric("rmfast_queue_samples", "gauge", "samples waiting for a wave", [("", scheduler.n_waiting)])
            metric("rmfast_in_flight_requests", "gauge", "requests submitted and not yet answered",
                   [("", scheduler.in_flight)])
            if admitted is not None:
                metric("rmfast_taken_requests", "gauge", "requests whose whole body came and that are not yet answered "
                       "(some still being read or tokenized: a drain answers them all before the exit)",
                       [("", admitted)])
            if hasattr(scheduler, "wave_s_total"):
                metric("rmfast_wave_seconds_total", "counter", "seconds the waves took to score (over "
                       "rmfast_waves_total: the mean wave time; over rmfast_samples_total: per sample)",
                       [("", round(scheduler.wave_s_total, 6))])
            if hasattr(scheduler, "waves_split"):
                metric("rmfast_waves_split_total", "counter", "waves that failed and were scored again one request "
                       "at a time (only a request that fails alone gets the error)", [("", scheduler.waves_split)])
            if hasattr(scheduler, "waves_lingered"):
                metric("rmfast_waves_lingered_total", "counter", "waves that waited for the clients the last wave "
                       "answered to send their next samples (the linger: docs/serving.md)",
                       [("", scheduler.waves_lingered)])
            if hasattr(scheduler, "n_running"):
                metric("rmfast_running_samples", "gauge", "samples of the wave being scored (it runs to its end, "
                       "whether or not their clients are still there)", [("", scheduler.n_running)])
            for family in getattr(scheduler, "metric_families", tuple)():  # a scheduler with more to say (Ray's)
                metric(*family)
        if core is not None:
            st = core.stats
            for name, help_, v in (
                ("samples", "samples scored", st.samples),
                ("tokens", "tokens of the samples scored (prompt and response)", st.tokens),
                ("waves", "waves scored", st.waves),
                ("batches", "batches run", st.batches),
                ("batch_rows", "rows in the batches run", st.batch_rows),
                ("batch_tokens", "row tokens the batches ran, pads included", st.batch_tokens),
                ("row_tokens", "row tokens that were the samples' own", st.real_tokens),
                ("prompt_encodings", "prompt parts encoded", st.prompt_encodings),
                ("prompt_tokens_encoded", "tokens of the prompt parts encoded", st.prompt_tokens_encoded),
                ("prompt_reencodings", "prompt parts encoded again after leaving the cache", st.prompt_reencodings),
                ("prompt_hits", "samples whose prompt part was encoded already (cache or the same wave)", st.prompt_hits),
                ("prompt_tokens_saved", "prompt tokens not encoded again thanks to sharing", st.prompt_tokens_saved),
                ("unshared_samples", "samples with no shared prompt part (no header, no prompt given)", st.unsplit),
                ("nonfinite_scores", "scores that came out NaN or infinite (answered as errors)", st.nonfinite),
            ):
                metric(f"rmfast_{name}_total", "counter", help_, [("", v)])
            metric("rmfast_prompt_cache_prompts", "gauge", "prompt encodings in the cache", [("", core.cached_prompts)])
            metric("rmfast_prompt_cache_bytes", "gauge", "bytes of the cached prompt encodings", [("", core.cached_bytes)])
            metric("rmfast_samples_by_split_total", "counter", "samples by the split rule that found their prompt",
                   [(f'{{rule="{r}"}}', n) for r, n in sorted(st.by_rule.items())])
        return "\n".join(out) + "\n"


def parse(text: str) -> dict:
    """A Prometheus text page as {name{labels}: value} (tests, the bench).

    >>> parse('# HELP x y\\nrmfast_samples_total 3\\n')["rmfast_samples_total"]
    3.0
    """
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out
