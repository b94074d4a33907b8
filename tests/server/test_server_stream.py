"""The chat stream's bookkeeping against scripted replies (an engine double that streams given text):
what a stream holds back while it may begin a call or a reasoning marker comes out once the reply
shows it was neither, and every stream adds up to the message answered whole, in each format."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentkv.chat.formats import Hermes, Llama3Json, Mistral, Pythonic
from agentkv.chat.reasoning import ReasoningFormat
from agentkv.engine.outputs import Completion, StreamDelta, Usage
from agentkv.server.chat import ChatPlan, chat_stream
from agentkv.server.protocol import ChatRequest

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


class ScriptedEngine:
    """What the server reads of an engine, streaming `pieces` as the reply."""

    context_length = 4096

    def __init__(self, fmt, pieces: list[str], reasoning=None, finish: str = "stop"):
        self.tool_format, self.reasoning, self.pieces, self.finish = fmt, reasoning, pieces, finish
        self.tokenizer = self

    def encode(self, text):
        return list(range(len(text) // 4 + 1))

    def render(self, messages, tools=None, **kwargs):
        return "prompt\n"

    async def stream(self, ids, params):
        text = "".join(self.pieces)
        for k, piece in enumerate(self.pieces):
            last = k == len(self.pieces) - 1
            done = Completion(text, [1] * len(self.pieces), self.finish, complete=True) if last else None
            yield StreamDelta(0, piece, [1], self.finish if last else None, Usage(1, 0, len(self.pieces)), done)


class Metrics:
    def __getattr__(self, name):
        return lambda *a, **k: None


def stream(engine, body: dict) -> tuple[dict, list[dict]]:
    """(the message answered whole, the stream's deltas)."""
    req = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    plan = ChatPlan(engine, req)
    text = "".join(engine.pieces)
    msg, _ = plan.message(Completion(text, [1], engine.finish, complete=True), "x_0")

    async def collect():
        events = await chat_stream(engine, req, "m", Metrics(), 0.0, lambda: None)
        return [e async for e in events]

    deltas = []
    for event in asyncio.run(collect()):
        data = event.removeprefix("data: ").strip()
        if data != "[DONE]":
            deltas.extend(c["delta"] for c in json.loads(data)["choices"])
    return msg, deltas


def joined(deltas: list[dict], field: str) -> str:
    return "".join(d.get(field) or "" for d in deltas)


@pytest.mark.parametrize("fmt, pieces", [
    (Hermes(), ["Sure ", "<too"]),  # ends inside what could have been `<tool_call>`
    (Hermes(), ["Sure.\n", "\n"]),  # whitespace that could have come before a call
    (Llama3Json(), ["It is ", '{"na']),  # ... or Llama 3's call head
    (Mistral(), ["Done. [TOOL_CA"]),
    (Pythonic(), ["  "]),  # a reply that is only whitespace: it might have become a call list
])
def test_text_held_back_comes_out_when_it_was_text(fmt, pieces):
    msg, deltas = stream(ScriptedEngine(fmt, pieces), {"tools": [ADD]})
    assert not msg.get("tool_calls") and joined(deltas, "content") == msg["content"] == "".join(pieces)


@pytest.mark.parametrize("fmt, text", [
    (Hermes(), 'Let me add.\n<tool_call>\n{"name":"add","arguments":{"a":12}}\n</tool_call>'),
    (Llama3Json(), '{"name":"add","parameters":{"a":12}}; {"name":"add","parameters":{"a":3}}'),
    (Mistral(), '[TOOL_CALLS] [{"name":"add","arguments":{"a":12}}, {"name":"add","arguments":{"a":3}}]'),
    (Pythonic(), "[add(a=12), add(a=3)]"),
])
def test_streamed_calls_add_up_to_the_whole_message(fmt, text):
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    msg, deltas = stream(ScriptedEngine(fmt, pieces), {"tools": [ADD]})
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls") or []:
            entry = calls.setdefault(tc["index"], [tc["function"].get("name"), ""])
            entry[1] += tc["function"].get("arguments") or ""
    assert [tuple(v) for v in calls.values()] == [(c["function"]["name"], c["function"]["arguments"])
                                                  for c in msg["tool_calls"]]
    assert joined(deltas, "content") == (msg["content"] or "")


def test_reasoning_held_back_at_a_cut_comes_out():
    """A reply cut inside its block, at a `<` that could have begun `</think>`."""
    engine = ScriptedEngine(Hermes(), ["<think>\nhm, 2", " < 3 <"], ReasoningFormat(), finish="length")
    msg, deltas = stream(engine, {"max_tokens": 2})
    assert msg["reasoning_content"] == "hm, 2 < 3 <" == joined(deltas, "reasoning_content")
    assert msg["content"] == "" and not joined(deltas, "content")
