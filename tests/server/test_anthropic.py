"""/v1/messages with the official `anthropic` client against a live server: text, streams (events in
order, deltas adding up to the message), tool calls under the model's own format (forced, then a
tool_result round trip from the cache), thinking blocks on a reasoning template, count_tokens, and
errors in Anthropic's shape naming the field."""

from __future__ import annotations

import jsonschema
import pytest

anthropic = pytest.importorskip("anthropic")

import agentkv as ak  # noqa: E402
from agentkv.server import create_app  # noqa: E402
from tests.server.test_server import KEY, serving  # noqa: E402
from tests.tiny import make_tiny_model  # noqa: E402

ADD = {"name": "add", "description": "Add a number.", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "add one"}]


@pytest.fixture()
def client(live):
    base = live[0].removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)


def test_a_text_reply(client):
    r = client.messages.create(model="tiny", max_tokens=12, messages=[{"role": "user", "content": "hello"}],
                               system="Be brief.")
    assert r.type == "message" and r.role == "assistant" and r.model == "tiny"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason in ("max_tokens", "end_turn") and r.usage.output_tokens > 0
    stopped = client.messages.create(model="tiny", max_tokens=40, messages=[{"role": "user", "content": "hello"}],
                                     stop_sequences=["e", "a", "o", "i"])
    if stopped.stop_reason == "stop_sequence":
        assert stopped.stop_sequence in ("e", "a", "o", "i")


def test_a_stream_in_order_adds_up(client):
    with client.messages.stream(model="tiny", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
        kinds, text = [], ""
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    starts, stops = kinds.count("content_block_start"), kinds.count("content_block_stop")
    assert starts == stops == len(final.content) == 1
    assert final.content[0].text == text and final.usage.output_tokens > 0


def test_a_forced_tool_call_then_its_result_from_the_cache(client):
    first = client.messages.create(model="tiny", max_tokens=60, messages=ASK, tools=[ADD],
                                   tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "add"
    jsonschema.validate(call.input, ADD["input_schema"])
    second = client.messages.create(model="tiny", max_tokens=8, tools=[ADD], messages=ASK + [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "7"}]}])
    assert second.type == "message"
    seen = first.usage.input_tokens + first.usage.cache_read_input_tokens  # the prompt the model saw
    assert second.usage.cache_read_input_tokens >= seen  # turn one's prompt (and its reply) came from the cache
    counted = client.messages.count_tokens(model="tiny", messages=ASK, tools=[ADD])
    assert counted.input_tokens == seen


def test_a_streamed_tool_call(client):
    with client.messages.stream(model="tiny", max_tokens=100, messages=ASK, tools=[ADD],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        partial = "".join(e.delta.partial_json for e in stream
                          if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        final = stream.get_final_message()
    calls = [b for b in final.content if b.type == "tool_use"]
    assert calls and final.stop_reason == "tool_use" and partial
    for c in calls:
        jsonschema.validate(c.input, ADD["input_schema"])


def test_errors_name_the_field(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", messages=ASK, max_tokens=0)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert "messages[0].content[0].type" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=ASK, tools=[ADD],
                               tool_choice={"type": "tool", "name": "nope"})
    assert "tool_choice" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as e:
        client.with_options(api_key="wrong").messages.create(model="tiny", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"


def test_thinking_blocks_on_a_reasoning_template(tmp_path):
    """A template that opens the block (DeepSeek-R1's): the reply is a thinking block (its budget
    closes it), then the answer; streamed as thinking_delta then text_delta. Sent back with its
    thinking block, which the template drops from earlier turns, a reply (streamed or not) is
    cached up to the new message: the server prefilled the template's form of it (server/history.py;
    with that warm-up not queued, the reply's text is computed again and this fails)."""
    path = make_tiny_model(tmp_path / "r1", chat="r1", merges=60, max_positions=4096)
    # seeded (each request, and the engine's draws for any other): unseeded, one run in 11 failed by chance
    with ak.Engine(str(path), num_slots=8192, seed=0) as engine, serving(create_app(engine, "tiny", KEY)) as base:
        client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=KEY, max_retries=0, timeout=120)
        r = client.messages.create(model="tiny", max_tokens=40, messages=ASK,
                                   thinking={"type": "enabled", "budget_tokens": 8}, extra_body={"seed": 1})
        assert r.content[0].type == "thinking" and r.content[0].thinking
        with client.messages.stream(model="tiny", max_tokens=40, messages=ASK, extra_body={"seed": 2},
                                    thinking={"type": "enabled", "budget_tokens": 8}) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
        assert deltas[0] == "thinking_delta" and final.content[0].type == "thinking"
        # a conversation that keeps the thinking block is taken back, cached up to its new message
        new = len(engine.tokenizer.encode("and again<|im_end|>\n<|im_start|>assistant\n<think>\n", add_bos=False))
        for reply in (r, final):
            assert [b.type for b in reply.content] == ["thinking", "text"]
            again = client.messages.create(model="tiny", max_tokens=8, extra_body={"seed": 3}, messages=ASK + [
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": "and again"}])
            assert again.type == "message" and again.usage.input_tokens <= new, again.usage


def test_cache_control_on_the_system_prompt_pins_it(client, live):
    engine = live[1]
    system = [{"type": "text", "text": "The pinned Anthropic system prompt. " * 8,
               "cache_control": {"type": "ephemeral"}}]
    pins = engine.stats()["pins"]
    client.messages.create(model="tiny", max_tokens=4, system=system, messages=ASK)
    client.messages.create(model="tiny", max_tokens=4, system=system, messages=[{"role": "user", "content": "again"}])
    assert engine.stats()["pins"] == pins + 1  # once for the prefix, renewed by the second request
