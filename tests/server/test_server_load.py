"""The OpenAI-compatible server under load and past its limits, on the tiny model: a client that goes
away mid-stream, pins and the metrics, the in-flight limit's 429, and 32 streams with a quarter of
them disconnecting (tests/server/test_server.py has the API itself; `live` and `client` are
tests/conftest.py's)."""

from __future__ import annotations

import json
import time

import pytest

openai = pytest.importorskip("openai")

from agentkv.server import create_app  # noqa: E402
from tests.server.test_server import KEY, WEATHER, ask, serving  # noqa: E402


def open_stream(client, route: str):
    long = "a long story " * 20
    if route == "chat":
        return client.chat.completions.create(model="tiny", messages=ask(long), max_tokens=2000, stream=True,
                                              extra_body={"ignore_eos": True})
    if route == "completions":
        return client.completions.create(model="tiny", prompt=long, max_tokens=2000, stream=True,
                                         extra_body={"ignore_eos": True})
    return client.responses.create(model="tiny", input=long, max_output_tokens=2000, stream=True,
                                   extra_body={"ignore_eos": True})


@pytest.mark.parametrize("route", ["chat", "completions", "responses"])
def test_disconnect_mid_stream_frees_the_request(client, live, route):
    """Every streamed route: a client that goes away aborts its request (KV back) and releases its
    in-flight slot. Checked against a planted bug: the completions stream's `done()` not called when
    the client leaves (its slot held for ever): the in-flight assertion fails."""
    engine = live[1]
    idle = engine.stats()["free_slots"] + engine.stats()["evictable_tokens"]
    decoded = engine.stats()["decode_tokens"]
    stream = open_stream(client, route)
    for k, _ in enumerate(stream):
        if k == 3:
            break
    stream.close()  # the client goes away
    deadline = time.monotonic() + 30
    while engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    st = engine.stats()
    assert st["running"] == 0 and st["waiting"] == 0
    assert st["decode_tokens"] - decoded < 1000  # aborted, not run to its 2000 tokens
    assert st["free_slots"] + st["evictable_tokens"] >= idle  # nothing held but what the cache may evict
    metrics = http("GET", live[0].removesuffix("/v1") + "/metrics")[1]
    inflight = next(line for line in metrics.splitlines() if line.startswith("agentkv_inflight_requests "))
    assert float(inflight.split()[-1]) == 0, inflight


def http(method: str, url: str, body: dict | None = None) -> tuple[int, str]:
    """(status, body text) of a plain HTTP call with the test key."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_pins_metrics_and_capacity(client, live):
    base, engine, _ = live
    system = {"role": "system", "content": "You answer in French. " * 20}
    status, text = http("POST", f"{base}/pins", {"messages": [system], "tools": [WEATHER]})
    pinned = json.loads(text)
    assert status == 200 and pinned["tokens"] > 400 and engine.stats()["pins"] >= 1
    assert [p["id"] for p in json.loads(http("GET", f"{base}/pins")[1])["data"]] == [pinned["id"]]
    r = client.chat.completions.create(model="tiny", messages=[system, *ask("bonjour")], tools=[WEATHER], max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens >= pinned["tokens"]
    assert json.loads(http("DELETE", f"{base}/pins/{pinned['id']}")[1])["deleted"] is True
    assert http("DELETE", f"{base}/pins/{pinned['id']}")[0] == 404
    assert http("POST", f"{base}/pins", {"messages": []})[0] == 400

    text = http("GET", base.removesuffix("/v1") + "/metrics")[1]
    assert 'agentkv_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert "agentkv_time_to_first_token_seconds_count" in text and "agentkv_cache_hit_rate" in text
    assert 'status="400"' in text and 'status="404"' in text
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}  # the whole text parses
    assert families["agentkv_inflight_requests"].samples[0].value == 0  # this scrape is not a request
    assert families["agentkv_pins"].samples[0].value == engine.stats()["pins"]
    assert {"agentkv_grammar_cache_bytes", "agentkv_grammar_cache_evictions"} <= set(families)


def test_a_pin_with_ttl_ends_on_its_own(live):
    """POST /v1/pins with ttl_s: listed while alive, gone (and counted in /metrics) once idle past it."""
    base, engine, _ = live
    system = {"role": "system", "content": "You answer in Dutch. " * 12}
    assert http("POST", f"{base}/pins", {"messages": [system], "ttl_s": -1})[0] == 400
    pinned = json.loads(http("POST", f"{base}/pins", {"messages": [system], "ttl_s": 0.3})[1])
    assert pinned["id"] in [p["id"] for p in json.loads(http("GET", f"{base}/pins")[1])["data"]]
    before = engine.stats()["pin_expiries"]
    time.sleep(0.8)
    assert pinned["id"] not in [p["id"] for p in json.loads(http("GET", f"{base}/pins")[1])["data"]]
    assert engine.stats()["pin_expiries"] == before + 1
    assert "agentkv_pin_expiries" in http("GET", base.removesuffix("/v1") + "/metrics")[1]


def test_busy_server_answers_429(tiny_long_dir, live):
    engine = live[1]
    with serving(create_app(engine, "tiny", max_inflight=1)) as base:
        c = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        stream = c.chat.completions.create(model="tiny", messages=ask("long"), max_tokens=500, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="tiny", messages=ask("x"), max_tokens=1)
        stream.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the slot frees when the stream ends
            try:
                c.chat.completions.create(model="tiny", messages=ask("x"), max_tokens=1)
                break
            except openai.RateLimitError:
                time.sleep(0.1)
        else:
            pytest.fail("the in-flight slot was never released")


def test_load_32_streams_a_quarter_disconnecting(client, live):
    """32 concurrent streaming clients; a quarter, chosen at random, go away after a random number of
    chunks. The others get exactly what the same seed gives alone; afterwards no KV slot is held."""
    import asyncio
    import random

    rng = random.Random(0)
    leaving = {i: rng.randint(1, 6) for i in rng.sample(range(32), 8)}  # client -> chunks it reads

    base, engine, _ = live
    before = engine.stats()
    idle = before["free_slots"] + before["evictable_tokens"]
    system = {"role": "system", "content": "Load test. " * 30}

    async def one(aclient, i: int):
        stream = await aclient.chat.completions.create(
            model="tiny", messages=[system, *ask(f"client {i}")], max_tokens=48, temperature=1.0, seed=i, stream=True)
        text, finish, k = "", None, 0
        async for c in stream:
            k += 1
            if k == leaving.get(i):
                await stream.close()
                return None
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        return text, finish

    async def main():
        async with openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120) as aclient:
            return await asyncio.wait_for(asyncio.gather(*(one(aclient, i) for i in range(32))), timeout=300)

    results = asyncio.run(main())
    for i, res in enumerate(results):
        if i in leaving:
            assert res is None
            continue
        ref = engine.chat([system, *ask(f"client {i}")], max_tokens=48, temperature=1.0, seed=i)
        assert res == (ref.text, ref.finish_reason), i
    deadline = time.monotonic() + 30
    while engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = engine.stats()
    assert after["running"] == 0 and after["waiting"] == 0
    assert after["free_slots"] + after["evictable_tokens"] == idle  # nothing leaked
