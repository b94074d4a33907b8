"""/metrics in Prometheus' text format: request and token counters, the engine's cache and queue
gauges, and latency histograms (time to first token, inter-token latency, request duration).

Written by hand rather than with prometheus_client: a dozen series, no global registry to reset
between apps in one process (the tests run several).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = _LATENCY_BUCKETS):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """What the server counts; `render(engine_stats)` writes the exposition text."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, HTTP status) -> count
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.ttft = Histogram()
        self.itl = Histogram()
        self.duration = Histogram()

    def request_done(self, endpoint: str, status: int, seconds: float, usage: dict | None = None) -> None:
        """A finished request; `usage` is the response's usage object."""
        with self._lock:
            self.requests[(endpoint, status)] += 1
            self.duration.observe(seconds)
            if usage:
                self.prompt_tokens += usage["prompt_tokens"]
                self.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
                self.completion_tokens += usage["completion_tokens"]

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def between_tokens(self, seconds: float, tokens: int) -> None:
        """One stream delta of `tokens` tokens arrived `seconds` after the previous one."""
        if tokens <= 0:
            return
        with self._lock:
            for _ in range(tokens):
                self.itl.observe(seconds / tokens)

    def render(self, stats: dict) -> str:
        lines = ["# HELP agentkv_requests_total Finished HTTP requests by endpoint and status.",
                 "# TYPE agentkv_requests_total counter"]
        with self._lock:
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'agentkv_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            for name, value, help_ in (
                ("agentkv_prompt_tokens_total", self.prompt_tokens, "Prompt tokens of finished requests."),
                ("agentkv_cached_prompt_tokens_total", self.cached_tokens, "Prompt tokens read from the radix cache."),
                ("agentkv_completion_tokens_total", self.completion_tokens, "Generated tokens of finished requests."),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {value}"]
            for name, hist, help_ in (
                ("agentkv_time_to_first_token_seconds", self.ttft, "Time from request to first streamed token."),
                ("agentkv_inter_token_latency_seconds", self.itl, "Time between streamed tokens."),
                ("agentkv_request_duration_seconds", self.duration, "Time from request to response end."),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram", *hist.lines(name)]
        for name, key, help_ in (
            ("agentkv_cache_hit_rate", "cache_hit_rate", "Share of prompt tokens served from the radix cache."),
            ("agentkv_waiting_requests", "waiting", "Requests queued in the engine."),
            ("agentkv_running_requests", "running", "Requests being generated."),
            ("agentkv_free_kv_slots", "free_slots", "Free token slots in the KV pool."),
            ("agentkv_cached_tokens", "cached_tokens", "Tokens held by the radix cache."),
            ("agentkv_pinned_tokens", "pinned_tokens", "Tokens pinned in the radix cache."),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name} {stats.get(key, 0)}"]
        return "\n".join(lines) + "\n"
