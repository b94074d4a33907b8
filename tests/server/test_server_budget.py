"""max_tokens inside a tool call, through the official clients: budget closing (the default) returns
the call whole and valid under finish_reason "length" / stop_reason "max_tokens", flagged `truncated`;
opted out, the call comes back as cut, in each API's own terms; a budget no call fits is a 400
naming the least max_tokens; JSON numbers stop at their digit bound."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from tests.server.test_server import KEY  # noqa: E402

NOTE = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["text", "n"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "note", "parameters": NOTE}}
ASK = [{"role": "user", "content": "take a note"}]


def chat(client, stream: bool, **args):
    """(content, finish_reason, calls as (name, arguments), the final choice's extra fields) of one reply."""
    if not stream:
        c = client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOL], tool_choice="required", **args)
        choice = c.choices[0]
        calls = [(t.function.name, t.function.arguments) for t in choice.message.tool_calls or []]
        return choice.message.content or "", choice.finish_reason, calls, choice.model_extra or {}
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOL], tool_choice="required",
                                                 stream=True, **args))
    calls: dict[int, list[str]] = {}
    for c in chunks:
        for t in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(t.index, ["", ""])
            entry[0] += t.function.name or "" if t.function else ""
            entry[1] += t.function.arguments or "" if t.function else ""
    last = [c.choices[0] for c in chunks if c.choices][-1]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return content, last.finish_reason, [tuple(v) for v in calls.values()], last.model_extra or {}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_call_cut_by_max_tokens_is_closed_and_flagged(client, stream):
    closed = 0
    for seed in range(4):
        content, reason, calls, extra = chat(client, stream, temperature=1.0, seed=seed, max_tokens=90)
        assert len(calls) == 1 and calls[0][0] == "note" and "<tool" not in content
        jsonschema.validate(json.loads(calls[0][1]), NOTE)  # whole and valid, cut or not
        if reason == "length":
            assert extra.get("truncated") is True
            closed += 1
        else:
            assert reason == "tool_calls" and "truncated" not in extra
    assert closed  # (the random model writes long strings: 90 tokens close most of them)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_opted_out_a_cut_call_comes_back_as_cut(client, stream):
    for seed in range(3):
        content, reason, calls, extra = chat(client, stream, temperature=1.0, seed=seed, max_tokens=55,
                                             extra_body={"budget_closing": False})
        assert reason == "length" and "truncated" not in extra and "<tool" not in content
        assert [name for name, _ in calls] == ["note"]  # its name was written: it is shown, arguments as cut
        with pytest.raises(json.JSONDecodeError):
            json.loads(calls[0][1])


def test_a_budget_no_call_fits_is_a_400_naming_the_least(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOL], tool_choice="required",
                                       max_tokens=5)
    least = int(re.search(r"at least (\d+)", str(e.value)).group(1))
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOL], tool_choice="required",
                                       max_tokens=least, temperature=1.0, seed=1)
    assert r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("length", "tool_calls")


def test_usage_counts_the_closing_tokens(client):
    for seed in range(4):
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOL], tool_choice="required",
                                           max_tokens=90, temperature=1.0, seed=seed)
        details = (r.usage.completion_tokens_details.model_extra or {}) if r.usage.completion_tokens_details else {}
        assert (details.get("closing_tokens", 0) > 0) == (r.choices[0].finish_reason == "length")
        assert r.usage.completion_tokens <= 90


@pytest.fixture()
def messages_client(live):
    return anthropic.Anthropic(base_url=live[0].removesuffix("/v1"), api_key=KEY, max_retries=0, timeout=120)


def test_anthropic_max_tokens_inside_a_tool_use(messages_client):
    tool = {"name": "note", "description": "Take a note.", "input_schema": NOTE}
    seen = set()
    for seed in range(4):
        for budget_closing in (True, False):
            r = messages_client.messages.create(
                model="tiny", max_tokens=90 if budget_closing else 55, messages=ASK, tools=[tool],
                tool_choice={"type": "any"},
                extra_body={"temperature": 1.0, "seed": seed, "budget_closing": budget_closing})
            uses = [b for b in r.content if b.type == "tool_use"]
            assert len(uses) == 1 and uses[0].name == "note"  # never an empty content list
            if budget_closing:
                jsonschema.validate(uses[0].input, NOTE)  # closed: whole and valid
            else:
                assert r.stop_reason == "max_tokens"  # cut: the members it completed
                assert set(uses[0].input) <= {"text", "n"}
            seen.add(r.stop_reason)
    assert "max_tokens" in seen


def test_numbers_stop_at_their_bound_unless_strict(client, live):
    vocab = live[1].tokenizer.backend.get_vocab()
    digits = {str(i): 100 for t, i in vocab.items() if t.isdigit() and not t.startswith("0")}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = client.chat.completions.create(model="tiny", messages=ASK, response_format=fmt, max_tokens=100,
                                       temperature=0.0, logit_bias=digits)
    assert r.choices[0].finish_reason == "stop" and len(str(json.loads(r.choices[0].message.content)["n"])) == 16
    strict = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    r = client.chat.completions.create(model="tiny", messages=ASK, response_format=strict, max_tokens=100,
                                       temperature=0.0, logit_bias=digits, extra_body={"budget_closing": False})
    assert r.choices[0].finish_reason == "length"  # exact to the spec: the digits run on


def test_the_json_style_a_request_names_holds_on_every_route(client, messages_client, live):
    space = live[1].tokenizer.encode(" ")[0]
    fmt = {"type": "json_schema", "json_schema": {"name": "note", "schema": NOTE}}
    for style, bias, head in (("compact", 30, '{"text":"'), ("spaced", -30, '{"text": "')):  # (against the lean)
        r = client.chat.completions.create(model="tiny", messages=ASK, response_format=fmt, max_tokens=60,
                                           temperature=0.0, logit_bias={str(space): bias},
                                           extra_body={"json_style": style})
        assert r.choices[0].message.content.startswith(head)
        c = client.chat.completions.create(model="tiny", messages=ASK, tools=[TOOL], tool_choice="required",
                                           max_tokens=90, temperature=0.0, extra_body={"json_style": style})
        assert c.choices[0].message.tool_calls[0].function.arguments.startswith(head)
        m = messages_client.messages.create(
            model="tiny", max_tokens=90, messages=ASK, tool_choice={"type": "any"},
            tools=[{"name": "note", "description": "Take a note.", "input_schema": NOTE}],
            extra_body={"temperature": 0.0, "json_style": style})
        jsonschema.validate(m.content[-1].input, NOTE)
        r = client.responses.create(model="tiny", input="take a note", max_output_tokens=60, temperature=0.0,
                                    text={"format": {"type": "json_schema", "name": "note", "schema": NOTE}},
                                    extra_body={"json_style": style})
        assert r.output_text.startswith(head)
    with pytest.raises(openai.BadRequestError, match="json_style"):
        client.chat.completions.create(model="tiny", messages=ASK, extra_body={"json_style": "pretty"})
