"""Anthropic's stop_reason for each way a reply ends, streamed and not (checked against a planted bug
that reported a length finish as end_turn: these fail on it): max_tokens (text cut, and a forced
tool call max_tokens ends: closed by budget closing, its tool_use shown), tool_use, stop_sequence
(naming the sequence), end_turn."""

from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic")

from agentkv.server.anthropic import stop_of  # noqa: E402
from tests.server.test_server import KEY  # noqa: E402

NOTE = {"name": "note", "description": "Take a note.", "input_schema": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": False}}
ADD = {"name": "add", "description": "Add a number.", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
    "additionalProperties": False}}
ASK = [{"role": "user", "content": "go"}]


@pytest.fixture()
def client(live):
    return anthropic.Anthropic(base_url=live[0].removesuffix("/v1"), api_key=KEY, max_retries=0, timeout=120)


def reply(client, stream: bool, **body):
    body = {"model": "tiny", "messages": ASK, **body}
    if not stream:
        return client.messages.create(**body)
    with client.messages.stream(**body) as s:
        return s.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_each_ending_has_its_stop_reason(client, stream):
    cut = reply(client, stream, max_tokens=3, extra_body={"seed": 1})
    assert cut.stop_reason == "max_tokens" and cut.stop_sequence is None
    called = reply(client, stream, max_tokens=200, tools=[ADD], tool_choice={"type": "tool", "name": "add"},
                   extra_body={"seed": 1})
    assert called.stop_reason == "tool_use" and [b.type for b in called.content][-1] == "tool_use"
    # a forced call of a tool with a string argument, which the random model runs on in: max_tokens ends it
    # (closed, so its tool_use is whole) — never an empty content list
    closed = reply(client, stream, max_tokens=90, tools=[NOTE], tool_choice={"type": "any"}, extra_body={"seed": 2})
    assert closed.stop_reason == "max_tokens" and [b.type for b in closed.content] == ["tool_use"]
    assert isinstance(closed.content[0].input["text"], str)
    stopped = [reply(client, stream, max_tokens=40, stop_sequences=["e", "a", "o"], extra_body={"seed": s})
               for s in range(4)]
    hits = [r for r in stopped if r.stop_reason == "stop_sequence"]
    assert hits and all(r.stop_sequence in ("e", "a", "o") for r in hits)
    assert all(r.stop_reason == "max_tokens" for r in stopped if r not in hits)


def test_a_reply_that_ends_itself_is_end_turn():
    class Completion:
        token_ids, text = [1], "x"

    for reason, expected in (("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"),
                             ("grammar_dead_end", "end_turn")):
        assert stop_of(None, type("Req", (), {"stop_sequences": None})(), Completion(), reason) == {
            "stop_reason": expected, "stop_sequence": None}
