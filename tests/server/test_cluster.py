"""`agentkv serve --replicas`: two engine replicas of a tiny model on a local Ray instance, behind the
OpenAI HTTP surface, serving several agents' conversations. The cache-aware router must send each
agent's later requests to the replica that holds its system prompt (round-robin would miss it about
half the time), and errors keep their HTTP status across the Ray hop. The routes are the single
engine's: /v1/responses (a stored response continued on the replica that stores it), /metrics
(every replica's gauges) and 429s past the in-flight limit."""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray", reason="the cluster extra is not installed: pip install 'agentkv[cluster]'")
requests = pytest.importorskip("requests")  # a dependency of ray

MAX_INFLIGHT = 3  # the concurrent test below sends three at once
TENANTS = [f"You are agent {t}. " + f"Tool {t}: " + "look up records and report them briefly. " * 6 for t in range(3)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tiny_long_dir, tmp_path_factory):
    from ray import serve

    from agentkv.server.cluster.deploy import build_app

    options = {"num_slots": 8192}
    if importlib.util.find_spec("peft") is not None:  # every replica serves a LoRA adapter too
        from tests.lora_helpers import make_adapter

        options["lora"] = {"support": str(make_adapter(tiny_long_dir, tmp_path_factory.mktemp("lora") / "support"))}
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(str(tiny_long_dir), "tiny", 2, engine_options=options,
                            max_inflight=MAX_INFLIGHT), name="agentkv",
                  route_prefix="/")
        yield Client(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()


class Client:
    def __init__(self, base: str):
        self.base, self.session = base, requests.Session()

    def get(self, path: str):
        return self.session.get(self.base + path, timeout=120)

    def post(self, path: str, json: dict, stream: bool = False):
        return self.session.post(self.base + path, json=json, timeout=120, stream=stream)


def chat(client, messages, **kw):
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 8,
                                                  "temperature": 0.0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_agents_stay_on_their_replica(cluster):
    def conversation(t: int, c: int) -> list[int]:
        messages = [{"role": "system", "content": TENANTS[t]}]
        cached = []
        for turn in range(2):
            messages.append({"role": "user", "content": f"conversation {c}, question {turn}"})
            out = chat(cluster, messages)
            cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
            messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        return cached

    with ThreadPoolExecutor(3) as pool:  # the first conversation of each agent, concurrently
        firsts = list(pool.map(lambda t: conversation(t, 0), range(3)))
    later = [conversation(t, c) for c in (1, 2) for t in range(3)]
    system_tokens = min(len(s) for s in TENANTS)  # one token per character in the tiny tokenizer
    # every request after an agent's first finds at least its system prompt cached on its replica
    assert all(cached[1] >= system_tokens for cached in firsts), firsts
    assert all(c >= system_tokens for cached in later for c in cached), later


def test_stream_models_and_errors(cluster):
    r = cluster.post("/v1/chat/completions", stream=True, json={
        "model": "tiny", "messages": [{"role": "user", "content": "stream please"}], "max_tokens": 6,
        "stream": True, "temperature": 0.0})
    assert r.status_code == 200
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "chat.completion.chunk"
    assert cluster.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert cluster.get("/v1/models/tiny").json()["id"] == "tiny" and cluster.get("/v1/models/x").status_code == 404
    r = cluster.post("/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    # refused in a replica (the grammar compiler): the 400 and its message survive the Ray hop
    r = cluster.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                   "response_format": {"type": "json_schema", "json_schema": {
                                                       "name": "x", "schema": {"$ref": "https://x.example/y.json"}}}})
    assert r.status_code == 400 and "which was not given" in r.text, r.text
    r = cluster.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                   "tool_choice": "required"})
    assert r.status_code == 400, r.text
    r = cluster.post("/v1/completions", json={"model": "tiny", "prompt": "plain", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None


def test_pins_follow_their_agent(cluster):
    system = [{"role": "system", "content": "You are the pinned agent. " + "Always answer in one line. " * 8}]
    r = cluster.post("/v1/pins", json={"messages": system})
    assert r.status_code == 200, r.text
    pin = r.json()
    assert pin["tokens"] > 200 and pin["id"] in [p["id"] for p in cluster.get("/v1/pins").json()["data"]]
    # even this agent's first requests find the pinned prefix: the router sends them to its replica
    for i in range(4):
        out = chat(cluster, system + [{"role": "user", "content": f"question {i}"}])
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= pin["tokens"], out["usage"]
    r = cluster.session.delete(cluster.base + f"/v1/pins/{pin['id']}", timeout=120)
    assert r.status_code == 200 and r.json()["deleted"] is True, r.text
    r = cluster.session.delete(cluster.base + f"/v1/pins/{pin['id']}", timeout=120)
    assert r.status_code == 404 and r.json()["error"]["code"] == "pin_not_found"
    assert cluster.post("/v1/pins", json={"messages": []}).status_code == 400


def test_a_pin_whose_time_ran_out_leaves_the_list(cluster):
    system = [{"role": "system", "content": "You are the short-lived pin's agent. " + "Answer briefly. " * 8}]
    pin = cluster.post("/v1/pins", json={"messages": system, "ttl_s": 1.0}).json()
    assert pin["id"] in [p["id"] for p in cluster.get("/v1/pins").json()["data"]]
    deadline = time.monotonic() + 30
    while pin["id"] in [p["id"] for p in cluster.get("/v1/pins").json()["data"]]:
        assert time.monotonic() < deadline, "the expired pin is still listed"
        time.sleep(0.5)


def test_responses_continue_on_the_replica_that_stores_them(cluster):
    """Each first turn lands where the router puts it; its continuation (previous_response_id) goes
    to that replica and starts from its cached prompt and reply, whatever the other replica holds."""
    for t in range(3):
        first = cluster.post("/v1/responses", json={"model": "tiny", "instructions": TENANTS[t], "input": f"hello {t}",
                                                    "max_output_tokens": 8, "temperature": 0.0})
        assert first.status_code == 200, first.text
        first = first.json()
        # (instructions are not carried over by previous_response_id: the request gives them again)
        second = cluster.post("/v1/responses", json={"model": "tiny", "instructions": TENANTS[t],
                                                     "previous_response_id": first["id"], "input": "and again",
                                                     "max_output_tokens": 8, "temperature": 0.0})
        assert second.status_code == 200, second.text
        second = second.json()
        covered = first["usage"]["input_tokens"] + first["usage"]["output_tokens"] - 2
        assert second["usage"]["input_tokens_details"]["cached_tokens"] >= covered, (first["usage"], second["usage"])
        assert cluster.get(f"/v1/responses/{first['id']}").json()["id"] == first["id"]
        assert cluster.session.delete(cluster.base + f"/v1/responses/{second['id']}", timeout=120).status_code == 200
        assert cluster.get(f"/v1/responses/{second['id']}").status_code == 404
    r = cluster.post("/v1/responses", json={"model": "tiny", "previous_response_id": "resp_missing", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id", r.text


def test_metrics_and_admission(cluster):
    chat(cluster, [{"role": "user", "content": "count me"}])
    text = cluster.get("/metrics").text
    assert 'agentkv_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    free = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("agentkv_free_kv_slots "))
    assert free > 8192  # both replicas' pools (8191 free slots each when idle)
    # streams hold their in-flight slot until they end: one more than the limit is refused
    streams = [cluster.post("/v1/chat/completions", stream=True, json={
        "model": "tiny", "messages": [{"role": "user", "content": f"long {i}"}], "max_tokens": 3000,
        "stream": True, "temperature": 1.0, "ignore_eos": True}) for i in range(MAX_INFLIGHT)]
    try:
        assert all(s.status_code == 200 for s in streams)
        r = cluster.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                       "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["code"] == "server_busy", r.text
    finally:
        for s in streams:
            s.close()


def test_a_prompt_cache_key_session_stays_on_one_replica(cluster):
    """Two turns of one prompt_cache_key session: the second lands where the first pinned the
    conversation, and starts from its prompt and reply."""
    messages = [{"role": "system", "content": "You keep the keyed session. " * 8},
                {"role": "user", "content": "turn one"}]
    first = chat(cluster, messages, prompt_cache_key="cluster-session")
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "turn two"}]
    second = chat(cluster, messages, prompt_cache_key="cluster-session")
    covered = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= covered, (first["usage"], second["usage"])


def test_an_adapters_session_stays_on_one_replica(cluster):
    """A prompt_cache_key session on a LoRA adapter: its second turn lands where the first pinned the
    conversation (in the adapter's cache), and starts from it; the adapter is listed with its parent."""
    pytest.importorskip("peft")
    models = {m["id"]: m for m in cluster.get("/v1/models").json()["data"]}
    assert models["support"]["parent"] == "tiny"
    messages = [{"role": "system", "content": "You keep the adapter's session. " * 8},
                {"role": "user", "content": "turn one"}]
    first = chat(cluster, messages, prompt_cache_key="lora-session", model="support")
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "turn two"}]
    second = chat(cluster, messages, prompt_cache_key="lora-session", model="support")
    covered = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= covered, (first["usage"], second["usage"])
    r = cluster.post("/v1/chat/completions", json={"model": "legal", "messages": messages, "max_tokens": 2})
    assert r.status_code == 404 and "support" in r.json()["error"]["message"]
