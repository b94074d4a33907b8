"""Requests a hostile or careless client sends: each is a 400 (or 413) naming what to change, before
anything reaches the engine, and the server keeps answering the next request."""

from __future__ import annotations

import pytest

import agentkv as ak
from agentkv.errors import GrammarError, RequestError, ToolDefinitionError
from tests.grammar_helpers import BYTE_COMPILER

fastapi_testclient = pytest.importorskip("fastapi.testclient")

from agentkv.server import create_app  # noqa: E402
from agentkv.server.protocol import check_max_tokens  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def tool(name: str = "f", parameters=None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or OBJECT}}


@pytest.fixture(scope="module")
def engine(tiny_long_dir):
    with ak.Engine(str(tiny_long_dir), num_slots=16384, seed=0) as e:
        yield e


@pytest.fixture(scope="module")
def client(engine):
    return fastapi_testclient.TestClient(create_app(engine, "m"), raise_server_exceptions=False)


def chat(client, **body):
    body = {"model": "m", "messages": HI, "max_tokens": 4, **body}
    return client.post("/v1/chat/completions", json=body)


def error(response, status: int, param: str) -> str:
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert err["param"] == param, err
    return err["message"]


@pytest.mark.parametrize("body,param,says", [
    # a schema that is not JSON Schema: once a TypeError deep in the converter, a 500
    ({"tools": [tool(parameters={"type": 7})]}, "tools[0].function.parameters", "(at #/type)"),
    ({"tools": [tool(parameters={"type": "object", "properties": {"a": {"minLength": -1}}})]},
     "tools[0].function.parameters", "(at #/properties/a/minLength)"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"required": "a"}}}},
     "response_format.json_schema.schema", "(at #/required)"),
    # names OpenAI refuses; this one once came back as raw markup in `content`
    ({"tools": [tool('</tool_call>"{')], "tool_choice": "required"}, "tools[0].function.name", "1 to 64 letters"),
    ({"tools": [tool("x" * 65)]}, "tools[0].function.name", "1 to 64 letters"),
    ({"tools": [tool("get weather")]}, "tools[0].function.name", "1 to 64 letters"),
    # more tokens than the context holds: once a 200
    ({"max_tokens": 10 ** 12}, "max_tokens", "leaving at most"),
    ({"max_tokens": 4096}, "max_tokens", "the context holds 4096 tokens"),
    ({"max_completion_tokens": 10 ** 12}, "max_completion_tokens", "lower max_completion_tokens"),
    # past the server's limits
    ({"stop": [str(i) for i in range(17)]}, "stop", "at most 16 strings"),
    ({"stop": "x" * 513}, "stop", "at most 512 characters"),
    ({"regex": "a" * (64 << 10) + "a"}, "regex", "longer than"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested(70)}}},
     "response_format.json_schema.schema", "nested deeper than 64"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_request_is_a_400_naming_the_field(client, body, param, says, stream):
    assert says in error(chat(client, stream=stream, **body), 400, param)
    ok = chat(client)  # and the server keeps serving
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_bodies_too_large_or_too_deep(client):
    from agentkv.server.protocol import MAX_BODY_BYTES

    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * MAX_BODY_BYTES + b'"}]}'
    r = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    deep = b"[" * 100_000 + b"]" * 100_000  # once a RecursionError, a 500
    r = client.post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]["message"]
    assert chat(client).status_code == 200


def test_prompt_over_the_context_streamed_is_a_413_not_a_broken_stream(client):
    r = chat(client, messages=[{"role": "user", "content": "x " * 5000}], stream=True)
    assert r.status_code == 413 and r.json()["error"]["code"] == "context_length_exceeded"


def test_names_and_limits_users_write_are_served(client, engine):
    r = chat(client, tools=[tool("get-weather_2")], tool_choice="required", max_tokens=120)
    assert r.status_code == 200
    calls = r.json()["choices"][0]["message"].get("tool_calls") or []
    assert all(c["function"]["name"] == "get-weather_2" for c in calls)
    prompt = [1] * 10  # a prompt of token ids: the room left is context - 10
    r = client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": engine.context_length - 9})
    assert "leaving at most 4086" in error(r, 400, "max_tokens")
    check_max_tokens(engine.context_length - 10, 10, engine.context_length)  # exactly full: allowed
    r = client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200


def _add(a: int, b: int) -> int:
    return a + b


def test_the_library_refuses_them_too(engine):
    with pytest.raises(GrammarError, match=r"not valid JSON Schema: 7 is not valid .*\(at #/type\)"):
        BYTE_COMPILER.compile_json_schema({"type": 7})
    # a draft-07 tuple and a draft-04 boolean bound are valid schemas of their drafts
    BYTE_COMPILER.compile_json_schema({"items": [{"type": "string"}], "exclusiveMinimum": True, "minimum": 1})
    with pytest.raises(GrammarError, match=r"\(at #/items/0/type\)"):
        BYTE_COMPILER.compile_json_schema({"items": [{"type": "text"}]})
    with pytest.raises(ToolDefinitionError, match="1 to 64 letters"):
        ak.tool(_add, name="</tool_call>")
    with pytest.raises(RequestError, match="1 to 64 letters"):
        engine.chat(HI, tools=[tool("a b")], max_tokens=4)


A_TOOL = {"type": "function", "function": {"name": "a"}}


@pytest.mark.parametrize("route,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools[0]"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [A_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [A_TOOL], "tool_choice": {"type": "function", "function": {"name": "b"}}},
     "tool_choice"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
    ("/v1/chat/completions", {"temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"top_p": 0}, "top_p"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                          "schema": {"required": "a"}}}}, "text.format.schema"),
    ("/v1/responses", {"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 10 ** 9}, "max_output_tokens"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
])
def test_every_field_family_gets_a_400_naming_it(client, route, body, param):
    """One table over the request-field families (messages, tools, tool_choice, response_format,
    text.format, sampling parameters) and both OpenAI routes: the 400 names the field. Checked against
    a planted bug: the Responses route naming chat's field (response_format.json_schema.schema) for
    text.format's schema, as it once did; that row fails."""
    base = {"model": "m", "max_tokens": 4} if route == "/v1/chat/completions" else {"model": "m"}
    if route == "/v1/chat/completions" and "messages" not in body:
        base["messages"] = HI
    error(client.post(route, json={**base, **body}), 400, param)


@pytest.mark.parametrize("body,names", [
    ({"messages": HI}, "max_tokens"),
    ({"messages": HI, "max_tokens": 4, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 4}, "messages[0].content[0]"),
])
def test_the_anthropic_route_names_the_field_in_its_message(client, body, names):
    r = client.post("/v1/messages", json={"model": "m", **body})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert names in r.json()["error"]["message"]
