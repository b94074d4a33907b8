"""/v1/responses, driven by the official `openai` client (create, parse, stream, retrieve, delete)
and by the OpenAI Agents SDK's default Responses model, on tiny models with real chat templates."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")

import agentkv as ak  # noqa: E402
from agentkv.server import create_app  # noqa: E402
from tests.server.test_server import KEY, serving  # noqa: E402
from tests.tiny import make_tiny_model  # noqa: E402

ADD = {"type": "function", "name": "add", "description": "Add a number.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
    "additionalProperties": False}}


class X(BaseModel):
    x: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    engine = ak.Engine(str(make_tiny_model(tmp_path_factory.mktemp("q25") / "m", chat="qwen2.5", max_positions=4096)),
                       num_slots=16384)
    with serving(create_app(engine, "tiny", KEY)) as base:
        yield openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120), engine, base
    engine.close()


@pytest.fixture()
def client(live):
    return live[0]


def test_create_parse_retrieve_delete(client):
    r = client.responses.create(
        model="tiny", input="hello", max_output_tokens=12, temperature=1.0, extra_body={"seed": 1})
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 12 and r.output[0].type == "message" and r.output_text
    p = client.responses.parse(model="tiny", input="x?", text_format=X, max_output_tokens=40, extra_body={"seed": 2})
    assert p.status == "completed" and isinstance(p.output_parsed, X)
    assert client.responses.retrieve(p.id).id == p.id
    client.responses.delete(p.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(p.id)
    unstored = client.responses.create(model="tiny", input="x?", text={"format": {"type": "json_object"}},
                                       max_output_tokens=20, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_tool_calls_and_their_stream(client):
    """A required call comes back as a function_call item whose arguments validate; streamed, the
    events come in OpenAI's order and the argument deltas add up to the final arguments."""
    r = client.responses.create(model="tiny", input="add one", tools=[ADD], tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=60, extra_body={"seed": 3})
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "add" and call.call_id and r.status == "completed"
    jsonschema.validate(json.loads(call.arguments), ADD["parameters"])
    kinds, args, seqs = [], "", []
    with client.responses.stream(model="tiny", input="add one", tools=[ADD],
                                 tool_choice={"type": "function", "name": "add"}, parallel_tool_calls=False,
                                 max_output_tokens=60, extra_body={"seed": 3}) as stream:
        for event in stream:
            kinds.append(event.type)
            seqs.append(event.sequence_number)
            if event.type == "response.function_call_arguments.delta":
                args += event.delta
        final = stream.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    (streamed,) = [o for o in final.output if o.type == "function_call"]
    assert args == streamed.arguments and streamed.id == final.output[0].id


def test_a_continued_response_starts_from_cache(client):
    """Turn two sends only the tool's result and previous_response_id: its prompt's cached tokens
    cover turn one's prompt and reply (kept pinned while the response is stored)."""
    first = client.responses.create(model="tiny", instructions="You add.", input="add one", tools=[ADD],
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=60,
                                    extra_body={"seed": 4})
    (call,) = [o for o in first.output if o.type == "function_call"]
    second = client.responses.create(model="tiny", instructions="You add.", tools=[ADD], previous_response_id=first.id,
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "7"}],
                                     max_output_tokens=16, extra_body={"seed": 5})
    assert second.previous_response_id == first.id
    covered = first.usage.input_tokens + first.usage.output_tokens - 2
    assert second.usage.input_tokens_details.cached_tokens >= covered
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="tiny", input="x", previous_response_id="resp_missing", max_output_tokens=4)
    assert e.value.body["param"] == "previous_response_id"


def test_bad_input_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input=[{"type": "image_generation_call"}], max_output_tokens=4)
    assert e.value.body["param"] == "input[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}], max_output_tokens=4)
    assert e.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="x", max_output_tokens=10 ** 6)
    assert e.value.body["param"] == "max_output_tokens"


def test_a_reasoning_model_gives_a_reasoning_item(tmp_path):
    engine = ak.Engine(str(make_tiny_model(tmp_path / "q3", chat="qwen3", max_positions=4096)), num_slots=8192)
    try:
        with serving(create_app(engine, "tiny", KEY)) as base:
            client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
            bias = {str(engine.tokenizer.token_to_id("<think>")): 100}
            r = client.responses.parse(model="tiny", input="x?", text_format=X, max_output_tokens=80,
                                       extra_body={"max_reasoning_tokens": 8, "logit_bias": bias})
            kinds = [o.type for o in r.output]
            assert kinds == ["reasoning", "message"] and r.output[0].content[0].text
            assert isinstance(r.output_parsed, X)
    finally:
        engine.close()


def test_openai_agents_sdk_default_responses_model(live):
    """The Agents SDK's default model speaks the Responses API: a call it runs, a typed output."""
    pytest.importorskip("agents")
    from agents import (
        Agent,
        AsyncOpenAI,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="tiny", openai_client=AsyncOpenAI(base_url=live[2], api_key=KEY))
    calls: list = []

    def add(a: int) -> int:
        """Add one to a number."""
        calls.append(a)
        return a + 1

    caller = Agent(name="calc", instructions="Add.", tools=[function_tool(add)], model=model,
                   tool_use_behavior="stop_on_first_tool",
                   model_settings=ModelSettings(max_tokens=60, tool_choice="required", parallel_tool_calls=False,
                                                extra_body={"seed": 3}))  # (unseeded, a random call can run long)
    result = Runner.run_sync(caller, "add one to 2", max_turns=2)
    assert calls and str(result.final_output) == str(calls[0] + 1)
    typed = Agent(name="calc", instructions="Answer.", output_type=X, model=model,
                  model_settings=ModelSettings(max_tokens=40, extra_body={"seed": 2}))
    assert isinstance(Runner.run_sync(typed, "x?", max_turns=1).final_output, X)


def test_a_continued_response_keeps_its_tokens_under_pressure(tiny_long_dir):
    """Between the turns, other prompts fill the pool and evict what is not held; the stored response's
    pinned conversation stays: turn two's cached tokens cover turn one's prompt and reply. Checked
    against a planted bug: ResponseStore.put not pinning the stored conversation; it fails."""
    with ak.Engine(str(tiny_long_dir), num_slots=1600) as engine, serving(create_app(engine, "tiny", KEY)) as base:
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
        first = client.responses.create(model="tiny", instructions="You keep records. " * 12, input="turn one",
                                        max_output_tokens=12, temperature=1.0, extra_body={"seed": 1})
        for i in range(6):  # ~2,700 tokens of other prompts through a 1,600-token pool
            client.chat.completions.create(model="tiny", max_tokens=2, messages=[
                {"role": "system", "content": f"other {i}: " + "unrelated text " * 28},
                {"role": "user", "content": "x"}])
        second = client.responses.create(model="tiny", instructions="You keep records. " * 12, input="turn two",
                                         previous_response_id=first.id, max_output_tokens=4)
        covered = first.usage.input_tokens + first.usage.output_tokens - 1
        assert second.usage.input_tokens_details.cached_tokens >= covered
