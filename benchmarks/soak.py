"""Soak: `agentkv serve` on the embedded model under mixed traffic for a set time, then a check that
nothing leaked.

`--clients` concurrent clients (asyncio, aiohttp) loop over a mix of requests: plain chats, tool calls
(required and auto), json_schema outputs, streams (every third hung up after its first chunks),
completions, pins (made, used, deleted), and bad requests (a schema that is not JSON Schema, a tool
name OpenAI refuses, max_tokens past the context, a body that is not JSON, another model). After a
warm-up the process's RSS is noted; at the end, once the server is idle: every KV slot free or held
by the radix cache and none protected, no pin, no request in flight or queued, and RSS within 10% of
the warm-up's. The KV pool is allocated untouched (its pages cost memory once first written), so
the warm-up lasts until the radix cache has filled it and begun to evict (at least a tenth of the
time): from then on, growth is growth. A small pool (`--num-slots`) keeps eviction busy.

    python benchmarks/soak.py --minutes 10 [--clients 16] [--num-slots 16384]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table
from serve import start_server

import agentkv as ak

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}
SYSTEM = {"role": "system", "content": "You are a concise assistant. " * 8}
BAD = [  # (body or raw bytes, the status it must get)
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]}, 400),
    ({"tools": [{"type": "function", "function": {"name": "</tool_call>", "parameters": {"type": "object"}}}]}, 400),
    ({"max_tokens": 10 ** 9}, 400),
    ({"model": "another-model"}, 404),
    (b'{"model": "smollm2", "messages": [', 400),
]


def user(i: int) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"Question {i}: what is the weather like in city {i % 7}?"}]


async def one(http: aiohttp.ClientSession, base: str, kind: str, i: int, pins: list[str]) -> int:
    """One request of `kind`; returns its HTTP status."""
    body: dict = {"model": "smollm2", "messages": user(i), "max_tokens": 16, "temperature": 0.8, "seed": i}

    async def post(path: str, payload) -> int:
        kw = {"data": payload, "headers": {"content-type": "application/json"}} if isinstance(payload, bytes) \
            else {"json": payload}
        async with http.post(base + path, **kw) as r:
            await r.read()
            return r.status

    if kind == "tools_required":
        body.update(tools=[WEATHER], tool_choice="required", max_tokens=48)
    elif kind == "tools_auto":
        body.update(tools=[WEATHER], tool_choice="auto", max_tokens=24)
    elif kind == "json_schema":
        body.update(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
                    max_tokens=48)
    elif kind == "completion":
        return await post("/completions", {"model": "smollm2", "prompt": f"Once upon a time {i}", "max_tokens": 16})
    elif kind == "pin":
        async with http.post(base + "/pins", json={"messages": [SYSTEM], "tools": [WEATHER]}) as r:
            made = await r.json() if r.status == 200 else None
            if made is None:
                return r.status
        pins.append(made["id"])
        used = await post("/chat/completions", {**body, "tools": [WEATHER]})
        pins.remove(made["id"])
        async with http.delete(f"{base}/pins/{made['id']}") as r:
            await r.read()
            return max(used, r.status)
    elif kind.startswith("stream"):
        body.update(stream=True, max_tokens=32)
        async with http.post(base + "/chat/completions", json=body) as r:
            chunks = 0
            async for line in r.content:
                chunks += line.startswith(b"data:")
                if kind == "stream_hangup" and chunks >= 3:
                    r.close()  # the connection goes mid-stream: the server aborts the request
                    break
            return r.status
    elif kind == "bad":
        payload, _ = BAD[i % len(BAD)]
        return await post("/chat/completions", payload if isinstance(payload, bytes) else {**body, **payload})
    return await post("/chat/completions", body)


KINDS = ["chat", "tools_required", "tools_auto", "json_schema", "completion", "pin", "stream", "stream_hangup",
         "bad"]


async def client(base: str, until: float, rng: random.Random, log: dict, pins: list[str]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        i = rng.randrange(10 ** 6)
        while time.monotonic() < until:
            kind, i = rng.choice(KINDS), i + 1
            started = time.perf_counter()
            try:
                status = await one(http, base, kind, i, pins)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # a dropped connection counts as a 5xx
                status = f"{type(e).__name__}"
            log[kind].append((status, time.perf_counter() - started))


async def load(base: str, seconds: float, clients: int, seed: int) -> dict:
    log: dict = defaultdict(list)
    pins: list[str] = []
    until = time.monotonic() + seconds
    await asyncio.gather(*(client(base, until, random.Random(seed + k), log, pins) for k in range(clients)))
    return log


def gauges(base: str) -> dict:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base.removesuffix("/v1") + "/metrics") as r:
        text = r.read().decode()
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.type == "gauge"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-slots", type=int, default=16384)
    args = ap.parse_args()
    seconds = args.minutes * 60
    engine = ak.Engine(max_running_requests=64, num_slots=args.num_slots)
    base, server, thread = start_server(engine)
    proc = psutil.Process()
    warm: dict = defaultdict(list)
    started, chunk = time.monotonic(), seconds / 10
    while time.monotonic() - started < seconds / 2:  # until the pool has been filled once
        for kind, entries in asyncio.run(load(base, chunk, args.clients, args.seed + len(warm))).items():
            warm[kind] += entries
        if engine.stats()["evicted_tokens"] > 0:
            break
    warm_s = time.monotonic() - started
    rss_warm = proc.memory_info().rss
    t0 = time.perf_counter()
    log = asyncio.run(load(base, max(seconds - warm_s, chunk), args.clients, args.seed + 1000))
    elapsed = time.perf_counter() - t0
    time.sleep(2)  # streams the clients hung up on finish their abort
    stats, g = engine.stats(), gauges(base)
    rss_end = proc.memory_info().rss

    rows, fivexx, wrong = [], 0, 0
    for kind in KINDS:
        entries = log.get(kind, []) + warm.get(kind, [])
        statuses = Counter(s for s, _ in entries)
        lat = sorted(t for _, t in log.get(kind, []))
        fivexx += sum(n for s, n in statuses.items() if not isinstance(s, int) or s >= 500)
        want = {400, 404} if kind == "bad" else {200}
        wrong += sum(n for s, n in statuses.items() if s not in want)
        q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0)
        rows.append([kind, len(entries), " ".join(f"{s}:{n}" for s, n in sorted(statuses.items(), key=str)),
                     q(0.5), q(0.95), q(0.99)])
    total = sum(len(v) for v in log.values())
    print(f"soak: {args.minutes} min, {args.clients} clients, embedded SmolLM2-135M, {args.num_slots} KV slots; "
          f"warm-up {warm_s:.0f} s (the pool filled: {stats['evicted_tokens'] > 0}), then {total} requests in "
          f"{elapsed:.0f} s ({total / elapsed:.1f}/s)\n")
    print(table(rows, ["kind", "requests", "statuses", "p50 s", "p95 s", "p99 s"]))
    lost = stats["total_slots"] - stats["free_slots"] - stats["cached_tokens"]
    checks = [
        ("5xx or dropped connections", fivexx, fivexx == 0),
        ("answers other than expected (200; 400/404 for bad requests)", wrong, wrong == 0),
        ("KV slots neither free nor cached (lost)", lost, lost == 0),
        ("KV slots held by requests after the end", stats["protected_tokens"], stats["protected_tokens"] == 0),
        ("pins left", stats["pins"], stats["pins"] == 0),
        ("requests in flight / running / waiting", (g.get("agentkv_inflight_requests"), stats["running"],
                                                    stats["waiting"]),
         g.get("agentkv_inflight_requests") == 0 and stats["running"] == stats["waiting"] == 0),
        ("RSS after warm-up -> end (MiB)", f"{rss_warm / 2**20:.0f} -> {rss_end / 2**20:.0f}",
         rss_end <= 1.10 * rss_warm),
    ]
    print()
    print(table([[name, str(value), "ok" if ok else "FAIL"] for name, value, ok in checks], ["check", "value", ""]))
    print(f"\nengine: {stats['retractions']} retractions, cache hit rate {stats['cache_hit_rate']:.2f}, "
          f"{stats['evicted_tokens']} tokens evicted")
    server.should_exit = True
    thread.join(timeout=30)
    engine.close()
    if not all(ok for _, _, ok in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
