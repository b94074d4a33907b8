"""`engine.chat(messages, tools=[...])` on the tiny model: the reply generated under the tool-call
format and read back as calls. Any sample of the random model must come back well-formed: calls
whose arguments validate, a call cut by max_tokens left out (finish_reason "length"), and never the
format's markup or the chat template's role markers in the content."""

import json

import jsonschema
import pytest

import agentkv as ak
from agentkv.chat.formats import Hermes

MARKUP = Hermes.words

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}}}


@ak.tool
def lookup(city: str) -> str:
    """Look a city up."""
    return city


@pytest.fixture(scope="module")
def engine(tiny_long_dir):
    engine = ak.Engine(str(tiny_long_dir), num_slots=8192)
    yield engine
    engine.close()


def _no_markup(text: str) -> None:
    for word in (*MARKUP, "<|im_start|>", "<|im_end|>"):
        assert word not in text, text


@pytest.mark.parametrize("closing", [False, True], ids=["cut", "closed"])
@pytest.mark.parametrize("choice", ["required", "auto", "add"])
def test_tool_calls_read_back_whatever_the_sample(engine, choice, closing):
    """Cut by max_tokens (budget closing off) or closed by budget closing, the calls read back are whole."""
    cut = 0
    for seed in range(8):
        out = engine.chat([{"role": "user", "content": "add"}], tools=[ADD, lookup], tool_choice=choice,
                          temperature=1.0, seed=seed, max_tokens=64 if closing else 48, budget_closing=closing)
        c = out.completions[0]
        _no_markup(out.content)
        for call in c.tool_calls:
            assert call.name in ("add", "lookup") and (choice != "add" or call.name == "add")
            if call.name == "add":  # closed by default: no keys beyond those declared
                jsonschema.validate(call.arguments, {**ADD["function"]["parameters"], "additionalProperties": False})
        assert not c.truncated or closing and c.finish_reason == "length"  # (closed: where it could not end)
        if c.finish_reason == "length":
            cut += 1
        elif c.tool_calls:
            assert c.finish_reason == "tool_calls"
        if choice != "auto":
            assert c.tool_calls or c.finish_reason == "length"
    if choice != "auto" and not closing:
        assert cut  # 48 tokens cut the tiny model's run of calls at least once


def test_cut_call_keeps_the_completed_ones(engine):
    """A reply cut inside its second call: the first is returned, finish_reason "length", no markup."""
    from agentkv.chat.turn import Turn
    from agentkv.engine.outputs import Completion, RequestOutput, Usage

    plan = Turn.plan(engine.tool_format, [ADD], "required", None)
    first = '<tool_call>\n{"name":"add","arguments":{"a":3}}\n</tool_call>'
    text = "Sure.\n" + first + '\n<tool_call>\n{"name":"add","argu'
    out = plan.read(RequestOutput([1], [Completion(text, [2], "length")], Usage()))
    assert out.finish_reason == "length" and out.content == "Sure."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("add", {"a": 3})]
    whole = plan.read(RequestOutput([1], [Completion(first, [2], "stop")], Usage()))
    assert whole.finish_reason == "tool_calls" and whole.content == ""


def test_tool_chat_errors(engine):
    with pytest.raises(ak.RequestError, match="neither"):
        engine.chat([{"role": "user", "content": "x"}], tools=[ADD], tool_choice="nope")
    with pytest.raises(ak.RequestError, match="tools\\[0\\]"):
        engine.chat([{"role": "user", "content": "x"}], tools=[{"name": "x"}])
    plain = engine.chat([{"role": "user", "content": "x"}], max_tokens=4)
    assert plain.tool_calls == [] and plain.content == plain.text
    text = engine.chat([{"role": "user", "content": "x"}], tools=[ADD], tool_choice="none", max_tokens=30,
                            temperature=1.0, seed=1)
    _no_markup(text.content)
    assert json.dumps(text.tool_calls) == "[]"
