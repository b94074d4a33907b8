"""The server's API fuzzed by schemathesis from the OpenAPI document it publishes: no 5xx, every
answer's status and body as documented, and afterwards the engine serving with its KV back.

A bounded run on the tiny model (a 512-token context, so every generation is short). A longer one:
AGENTKV_FUZZ_EXAMPLES=500 pytest tests/server/test_server_fuzz.py
"""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import agentkv as ak  # noqa: E402
from agentkv.server import create_app  # noqa: E402

EXAMPLES = int(os.environ.get("AGENTKV_FUZZ_EXAMPLES", "50"))
REQUEST_TIMEOUT_S = 120
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def served(tiny_dir):
    engine = ak.Engine(str(tiny_dir), num_slots=4096, seed=0)
    yield engine, create_app(engine, "tiny", max_inflight=64)
    engine.close()


def operations(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


def test_api_fuzz(served):
    ops = operations(served[1])
    assert {op.label for op in ops} >= {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/pins",
                                        "POST /v1/messages", "POST /v1/messages/count_tokens"}
    for op in ops:
        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            # (a request without max_tokens generates up to the 512-token context: on a busy host that
            # passed schemathesis' 10 s default; the test checks answers, not the host's speed)
            case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S)

        run()


def test_after_fuzzing_the_engine_serves_with_its_kv_back(served):
    engine, app = served
    from fastapi.testclient import TestClient

    client = TestClient(app)
    for pin in client.get("/v1/pins").json()["data"]:  # pins the fuzzer made
        assert client.delete(f"/v1/pins/{pin['id']}").status_code == 200
    for rid in app.state.handle.responses.ids():  # responses it stored (each pins its conversation)
        assert client.delete(f"/v1/responses/{rid}").status_code == 200
    # what is still pinned is the cache hints' (prompt_cache_key sessions, cache_control prefixes: they end
    # with their time to live), never a pin nobody holds
    hints = {p.id for p in app.state.handle.sessions.held()}
    left = [p for p in engine.pins() if p.id not in hints]
    assert left == [], left
    for p in engine.pins():
        engine.unpin(p)
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 4})
    assert r.status_code == 200
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["pins"] == 0
    # every slot is free or held by the radix cache, and none of those is held by a request: no
    # failed, aborted or refused request kept its KV
    assert stats["free_slots"] + stats["cached_tokens"] == stats["total_slots"], stats
    assert stats["protected_tokens"] == 0 and stats["evictable_tokens"] == stats["cached_tokens"], stats
