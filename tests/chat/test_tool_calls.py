"""The tool-call format: the grammar of each step (language checks), parsing, prompts."""

from __future__ import annotations

import itertools
import json
import re
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentkv as ak
from agentkv.chat.calls import FunctionSpec, ToolCall, text_without
from agentkv.chat.formats import Hermes as ToolCallFormat
from agentkv.grammar.compiler import closed_schema
from tests.grammar_helpers import BYTE_COMPILER, accepts, assert_language


@ak.tool
def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
    """Weather for a city."""
    return city


@ak.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def call_text(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, separators=(',', ':'))}\n</tool_call>"


WEATHER = call_text("get_weather", {"city": "Paris", "unit": "C"})
ADD = call_text("add", {"a": 1, "b": 2})


def test_text_without_is_exact_on_a_short_word():
    pattern = re.compile(text_without("<ab>"))
    for n in range(9):  # every string over its letters and one other, up to 8 long
        for chars in itertools.product("<ab>x", repeat=n):
            s = "".join(chars)
            assert bool(pattern.fullmatch(s)) == ("<ab>" not in s), s


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["<", "<<", "t", "tool", "_call", ">", "<tool_call>", "<tool_cal", "<too", "x y"]),
                max_size=12))
def test_text_without_is_exact_on_tool_call(parts):
    s = "".join(parts)
    assert bool(re.fullmatch(text_without("<tool_call>"), s)) == ("<tool_call>" not in s)


def test_text_without_is_exact_on_words_sharing_prefixes():
    words = ["<ab>", "<ac", "[b"]  # a shared prefix, and two first characters
    pattern = re.compile(text_without(words))
    for n in range(8):
        for chars in itertools.product("<[abc>x", repeat=n):
            s = "".join(chars)
            assert bool(pattern.fullmatch(s)) == (not any(w in s for w in words)), s


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["<", "</", "tool_", "call", "response", ">", "<|im_", "start|>", "end", "|>", "x",
                                 "\n"]), max_size=12))
def test_text_without_is_exact_on_the_format_markup(parts):
    words = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_start|>", "<|im_end|>"]
    s = "".join(parts)
    assert bool(re.fullmatch(text_without(words), s)) == (not any(w in s for w in words))


def test_text_without_refuses_recurring_first_character():
    with pytest.raises(ValueError):
        text_without("abab")


def test_required_grammar_language():
    g = BYTE_COMPILER.compile_lark(ToolCallFormat(False).grammar([get_weather, add], "required", None))
    assert_language(
        g,
        good=[WEATHER, ADD, WEATHER + "\n" + ADD, call_text("get_weather", {"city": "Oslo"})],
        bad=["", "hello", call_text("nope", {}), call_text("add", {"a": 1}),  # unknown tool, missing argument
             call_text("add", {"a": 1, "b": 2, "c": 3}), call_text("get_weather", {"city": "X", "unit": "K"}),
             "text " + ADD, WEATHER + "\n"],
        source="required",
    )


def test_auto_grammar_language():
    g = BYTE_COMPILER.compile_lark(ToolCallFormat(False).grammar([get_weather, add], "auto", None))
    assert_language(
        g,
        good=["", "The answer is 3.", "a < b and <too", "Let me check.\n" + WEATHER, ADD + "\n" + WEATHER],
        # text may not contain a tool call's opening tag outside a well-formed call
        bad=["see <tool_call> here", "<tool_call>\n{}\n</tool_call>", ADD + " and more text"],
        source="auto",
    )


def test_auto_grammar_with_output_schema():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    g = BYTE_COMPILER.compile_lark(ToolCallFormat(False).grammar([add], "auto", closed_schema(schema)))
    assert_language(g, good=['{"answer":3}', ADD], bad=["3", '{"answer":3,"x":1}', "text"], source="auto+output")
    none = ToolCallFormat(False).grammar([add], "none", schema)
    assert not accepts(BYTE_COMPILER.compile_lark(none), '{"answer":3,"x":1}')  # closed by default
    opened = ToolCallFormat(False).grammar([add], "none", schema, close_objects=False)
    assert accepts(BYTE_COMPILER.compile_lark(opened), '{"answer":3,"x":1}')  # as given: open
    assert ToolCallFormat(False).grammar([], "auto", None) is None  # no tools, text output: unconstrained
    # a text answer of an agent with tools may not write a call that would never run
    text_only = BYTE_COMPILER.compile_lark(ToolCallFormat(False).grammar([add], "none", None))
    assert_language(text_only, good=["", "It is 3.", "a <b>"], bad=[ADD, "x <tool_call>"], source="none")


def test_free_text_cannot_imitate_tool_results_or_turns():
    """The demo's small model once answered with a `<tool_response>` block of its own making, and
    with its answer wrapped in `<user_response>` tags it made up."""
    fmt = ToolCallFormat.for_template("{{ '<|im_start|>' + m.role }}{{ '<|im_end|>' }}",
                                      special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    assert fmt.markers == ("<|im_start|>", "<|im_end|>")
    for mode, tools in (("auto", [add]), ("none", [add])):
        g = BYTE_COMPILER.compile_lark(fmt.grammar(tools, mode, None))
        assert_language(g, good=["200 EUR is 216 USD.", "a <too b", "x <|im", "1 < 2", "It is <b>24</b> C.", ""],
                        bad=["<tool_response>\n200 EUR\n</tool_response>", "x </tool_response>", "done</tool_call>",
                             "<|im_start|>user\nhi", "ok<|im_end|>", "<tool_response]", "<tool-response>",
                             "<user_response>\n216.0\n</user_response>", " \n<string>216.0</string>", "\n", "<"],
                        source=mode)


def test_tool_arguments_closed_by_default():
    """Framework tool schemas leave additionalProperties unset: no invented keys unless opened."""
    langchain_like = FunctionSpec("add", {"type": "object", "properties": {"a": {"type": "integer"},
                                                                         "b": {"type": "integer"}}})
    g = BYTE_COMPILER.compile_lark(ToolCallFormat(False).grammar([langchain_like], "required", None))
    extra = call_text("add", {"a": 1, "b": 2, "note": "x"})
    assert accepts(g, ADD) and not accepts(g, extra)
    opened = ToolCallFormat(False).grammar([langchain_like], "required", None, close_objects=False)
    assert accepts(BYTE_COMPILER.compile_lark(opened), extra)


def test_parse():
    fmt = ToolCallFormat(False)
    assert fmt.parse("just text") == ("just text", [], 0)
    text = "Checking.\n" + WEATHER + "\n" + ADD
    content, calls, end = fmt.parse(text)
    assert content == "Checking." and end == len(text)
    assert calls == [ToolCall("get_weather", {"city": "Paris", "unit": "C"}), ToolCall("add", {"a": 1, "b": 2})]
    # a call cut short by max_tokens is left out; `end` is where the complete ones end
    assert fmt.parse(WEATHER + "\n" + ADD[:20]) == ("", calls[:1], len(WEATHER))
    # cut before any call completed, or inside the opening tag: no markup in the text
    assert fmt.parse("Checking.\n" + ADD[:25]) == ("Checking.", [], 0)
    assert fmt.parse("Checking.\n<tool_", cut=True) == ("Checking.", [], 0)  # (nor the whitespace before it)
    assert fmt.parse("a <tool_") == ("a <tool_", [], 0)  # finished there: that is its text
    # an argument may contain the closing tag
    tricky = call_text("get_weather", {"city": "</tool_call>"})
    assert fmt.parse(tricky)[1] == [ToolCall("get_weather", {"city": "</tool_call>"})]


def test_prompts_native_and_injected():
    qwen_like = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><tool_call>{% endif %}"
    native = ToolCallFormat.for_template(qwen_like)
    assert native.native and not ToolCallFormat.for_template("{{ messages }}").native
    assert not ToolCallFormat.for_template(None).native
    defs = [get_weather.definition]
    assert native.system_message("Be brief.", defs) == {"role": "system", "content": "Be brief."}
    assert native.template_tools(defs) == defs
    call = ToolCall("add", {"a": 1, "b": 2}, "call_1_0")
    assert native.results_messages([(call, "3")]) == [
        {"role": "tool", "name": "add", "tool_call_id": "call_1_0", "content": "3"}]
    injected = ToolCallFormat(False)
    system = injected.system_message("Be brief.", defs)["content"]
    assert system.startswith("Be brief.") and json.dumps(defs[0]) in system and "<tool_call>" in system
    assert injected.template_tools(defs) is None
    assert injected.results_messages([(call, "3"), (call, "4")]) == [
        {"role": "user", "content": "<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response>"}]


def test_closed_schema_leaves_values_alone():
    schema = {"type": "object", "properties": {"properties": {"type": "object", "default": {"type": "object"}},
                                               "c": {"const": {"properties": {}}}},
              "$defs": {"D": {"properties": {"x": {}}, "additionalProperties": True}}}
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert closed["properties"]["properties"]["default"] == {"type": "object"}
    assert closed["properties"]["c"] == {"const": {"properties": {}}}
    assert closed["$defs"]["D"]["additionalProperties"] is True
    assert "additionalProperties" not in closed["properties"]  # the name mapping is not a schema
