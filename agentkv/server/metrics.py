"""/metrics in Prometheus' text format, with prometheus_client: request and token counters, the
engine's cache and queue gauges, requests in flight, and latency histograms (time to first token,
inter-token latency, request duration).

Each app has its own registry (several apps live in one process in the tests, and a replica of the
cluster has one per engine); the engine's gauges are read when scraped.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# (metric, engine stats key or "inflight", help)
_GAUGES = (
    ("agentkv_cache_hit_rate", "cache_hit_rate", "Share of prompt tokens served from the radix cache."),
    ("agentkv_waiting_requests", "waiting", "Requests queued in the engine."),
    ("agentkv_running_requests", "running", "Requests being generated."),
    ("agentkv_free_kv_slots", "free_slots", "Free token slots in the KV pool."),
    ("agentkv_cached_tokens", "cached_tokens", "Tokens held by the radix cache."),
    ("agentkv_pinned_tokens", "pinned_tokens", "Tokens pinned in the radix cache."),
    ("agentkv_pins", "pins", "Pinned prefixes."),
    ("agentkv_pin_expiries", "pin_expiries", "Pins released because their time to live ran out (since start)."),
    ("agentkv_grammar_cache_bytes", "grammar_cache_bytes",
     "Bytes the grammar caches hold: token masks, token walks, rule automata."),
    ("agentkv_grammar_cache_evictions", "grammar_cache_evictions",
     "Grammars, masks, walks and rule automata evicted from the grammar caches."),
    ("agentkv_disk_tier_bytes", "disk_bytes", "Bytes of KV blocks in the disk tier (kv_dir)."),
    ("agentkv_disk_tier_blocks", "disk_blocks", "KV blocks in the disk tier."),
    ("agentkv_disk_tier_restored_tokens", "disk_restored_tokens",
     "Tokens read back from the disk tier into the pool instead of computed (since start)."),
    ("agentkv_disk_tier_errors", "disk_errors",
     "Disk tier blocks that could not be written or served (recomputed instead; since start)."),
    ("agentkv_inflight_requests", "inflight", "HTTP requests accepted and not yet answered (streams included)."),
)


ENGINE_GAUGE_KEYS = tuple(key for _, key, _ in _GAUGES if key != "inflight")  # read from engine.stats()


class _EngineGauges:
    """A collector that reads the engine's stats (and the app's in-flight count) when scraped."""

    def __init__(self, read: Callable[[], dict]):
        self.read = read

    def collect(self):
        stats = self.read()
        for name, key, help_ in _GAUGES:
            yield GaugeMetricFamily(name, help_, value=stats.get(key, 0))


class Metrics:
    """What the server counts; `render(engine_stats)` writes the exposition text."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self._stats: dict = {}
        r = self.registry
        self.requests = Counter("agentkv_requests", "Finished HTTP requests by endpoint and status.",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("agentkv_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.cached_tokens = Counter("agentkv_cached_prompt_tokens", "Prompt tokens read from the radix cache.",
                                     registry=r)
        self.disk_cached_tokens = Counter("agentkv_disk_cached_prompt_tokens",
                                          "Of the cached prompt tokens, those read back from the disk tier.",
                                          registry=r)
        self.completion_tokens = Counter("agentkv_completion_tokens", "Generated tokens of finished requests.",
                                         registry=r)
        self.ttft = Histogram("agentkv_time_to_first_token_seconds", "Time from request to first streamed token.",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("agentkv_inter_token_latency_seconds", "Time between streamed tokens.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("agentkv_request_duration_seconds", "Time from request to response end.",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineGauges(lambda: self._stats))

    def request_done(self, endpoint: str, status: int, seconds: float, usage: dict | None = None) -> None:
        """A finished request; `usage` is the response's usage object (chat's, the Responses API's or
        Anthropic's)."""
        self.requests.labels(endpoint, str(status)).inc()
        self.duration.observe(seconds)
        if not usage:
            return
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        self.disk_cached_tokens.inc(details.get("disk_cached_tokens", 0))
        if "prompt_tokens" in usage:  # chat, completions
            prompt, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
        elif "cache_read_input_tokens" in usage:  # Anthropic's: input_tokens are the uncached ones
            cached = usage["cache_read_input_tokens"]
            prompt = usage["input_tokens"] + cached
        else:  # responses
            prompt, cached = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.completion_tokens.inc(usage.get("completion_tokens", usage.get("output_tokens", 0)))

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def between_tokens(self, seconds: float, tokens: int) -> None:
        """One stream delta of `tokens` tokens arrived `seconds` after the previous one."""
        for _ in range(max(tokens, 0)):
            self.itl.observe(seconds / tokens)

    def render(self, stats: dict) -> str:
        """The exposition text, with the engine's `stats` (and "inflight") as the gauges."""
        self._stats = stats
        return generate_latest(self.registry).decode()
