"""Tool calls in the model's JSON style: the style a chat template writes calls in (probed by
rendering one), the calls' grammar in each style (a JSON call's wrapper and its arguments one
style, chosen together under the model's choice), and the calls read and written back in it."""

from __future__ import annotations

import pytest

from agentkv.chat.calls import FunctionSpec, ToolCall
from agentkv.chat.formats import Hermes, Llama3Json, Mistral, MistralArgs
from agentkv.chat.formats.json_calls import written_style
from agentkv.chat.formats.template_style import template_json_style
from agentkv.chat.turn import Turn
from agentkv.engine.tokenizer import Tokenizer
from tests.chat_templates import FAMILIES
from tests.grammar_helpers import BYTE_COMPILER, accepts

ADD = FunctionSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["a", "b"]})
SPACED = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
COMPACT = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'
WRAPPER_ONLY = '<tool_call>\n{"name": "add", "arguments": {"a":1,"b":2}}\n</tool_call>'
ARGUMENTS_ONLY = '<tool_call>\n{"name":"add","arguments":{"a": 1, "b": 2}}\n</tool_call>'
NAME_SPACED = '<tool_call>\n{"name": "add","arguments":{"a":1,"b":2}}\n</tool_call>'


def render_with(template: str):
    tok = Tokenizer.__new__(Tokenizer)  # (the template's renderer alone: no vocabulary needed)
    tok.chat_template, tok._chat_env, tok.bos_token, tok.eos_token = template, None, "<s>", "</s>"
    return tok.apply_chat_template


@pytest.mark.parametrize("family,style", [("qwen2.5", "spaced"), ("qwen3", "spaced"), ("llama3", "spaced"),
                                          ("mistral", "spaced"), ("magistral", "spaced"), ("glm45", None)])
def test_the_templates_style_is_read_by_rendering_a_call(family, style):
    assert template_json_style(render_with(FAMILIES[family].template)) == style


def test_a_compact_template_and_one_without_calls():
    compact = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
               "{{ c.function.arguments | tojson(separators=(',', ':')) }}{% endfor %}{{ m.content }}{% endfor %}")
    assert template_json_style(render_with(compact)) == "compact"
    assert template_json_style(render_with("{% for m in messages %}{{ m.content }}{% endfor %}")) is None
    assert template_json_style(render_with("{{ raise_exception('no tools here') }}")) is None


@pytest.mark.parametrize("style,good,bad", [
    ("compact", [COMPACT], [SPACED, WRAPPER_ONLY, ARGUMENTS_ONLY, NAME_SPACED]),
    ("spaced", [SPACED], [COMPACT, WRAPPER_ONLY, ARGUMENTS_ONLY, NAME_SPACED]),
    ("model", [COMPACT, SPACED], [WRAPPER_ONLY, ARGUMENTS_ONLY, NAME_SPACED]),
])
def test_a_json_calls_wrapper_and_arguments_are_one_style(style, good, bad):
    g = BYTE_COMPILER.compile_lark(Turn(Hermes(), (ADD,), mode="required").grammar(json_style=style))
    for text in good:
        assert accepts(g, text), (style, text)
    for text in bad:
        assert not accepts(g, text), (style, text)


@pytest.mark.parametrize("fmt,text", [
    (Llama3Json(), '{"name": "add", "parameters": {"a": 1, "b": 2}}'),
    (Mistral(), '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]'),
    (MistralArgs(), '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'),
])
def test_other_formats_write_spaced_calls_and_read_them(fmt, text):
    g = BYTE_COMPILER.compile_lark(Turn(fmt, (ADD,), mode="required").grammar(json_style="spaced"))
    assert accepts(g, text)
    assert not accepts(g, text.replace(": ", ":").replace(", ", ",").replace("[TOOL_CALLS][", "[TOOL_CALLS] ["))
    (call,) = fmt.bind([ADD]).parse(text)[1]
    assert call.name == "add" and call.arguments == {"a": 1, "b": 2}


def test_spaced_calls_are_read_and_streamed_as_written():
    content, calls, _ = Hermes().parse("Sure.\n" + SPACED)
    assert content == "Sure." and [(c.name, c.arguments, c.arguments_text) for c in calls] == [
        ("add", {"a": 1, "b": 2}, '{"a": 1, "b": 2}')]
    cut = SPACED[:SPACED.index('"b"')]
    (progress,) = Hermes().progress(cut)
    assert progress.name == "add" and progress.arguments_text == '{"a": 1, ' and not progress.done


def test_calls_are_written_back_in_the_style_they_were_made():
    made = ToolCall("add", {"a": 1, "b": 2}, arguments_text='{"a": 1, "b": 2}')
    assert Hermes().calls_text([made]) == SPACED  # (the model's choice: as its arguments were written)
    assert Hermes(json_style="spaced").calls_text([ToolCall("add", {"a": 1, "b": 2})]) == SPACED
    assert Hermes().calls_text([ToolCall("add", {"a": 1, "b": 2})]) == COMPACT
    assert written_style('{"a:b,": 1}') == "spaced" and written_style('{"a, b: ":1}') == "compact"


def test_the_turns_style_is_the_requests_then_the_templates_then_the_models():
    turn = Turn(Hermes(json_style="spaced"), (ADD,), mode="required")
    assert turn.json_style() == "spaced" and turn.json_style("compact") == "compact"
    assert Turn(Hermes(), (ADD,), mode="required").json_style() == "model"


def test_a_call_read_back_keeps_its_text_and_is_written_back_as_it_was():
    odd = '<tool_call>\n{"name": "add","arguments": {"a":1, "b":2}}\n</tool_call>'  # (not a style of ours)
    (call,) = Hermes().parse(odd)[1]
    assert call.text == odd.split("\n")[1] and Hermes().calls_text([call]) == odd
    assert Hermes(json_style="compact").calls_text([call]) == odd  # the model's text, not the style's
