"""Each family's tool-call format: the language of its grammar, its parse (whole, cut, and as far as a
stream has written it), and its detection from chat templates."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.chat.calls import FunctionSpec, ToolCall
from agentkv.chat.formats import (
    FORMATS,
    DeepSeekV3,
    DeepSeekV31,
    FunctionGemma,
    Gemma4,
    Glm,
    Granite,
    Harmony,
    Hermes,
    Kimi,
    Llama3Json,
    Mistral,
    MistralArgs,
    Phi4Mini,
    Pythonic,
    QwenXml,
    detect,
    tool_format_for,
)
from agentkv.chat.messages import template_messages
from agentkv.errors import RequestError
from tests.chat_templates import FAMILIES
from tests.grammar_helpers import BYTE_COMPILER, accepts

ADD = FunctionSpec("add", {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"},
    "note": {"type": ["string", "null"], "maxLength": 6}}, "required": ["a"]})
WEATHER = FunctionSpec("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]})
TOOLS = [ADD, WEATHER]
ALL = [Hermes(), Llama3Json(), Mistral(), MistralArgs(), Pythonic(), QwenXml().bind(TOOLS), Glm().bind(TOOLS), Kimi(),
       DeepSeekV31(), DeepSeekV3(), Granite(), Phi4Mini(), Harmony(), Gemma4(),
       FunctionGemma()]
GOOD_CALLS = [[ToolCall("add", {"a": 1})], [ToolCall("add", {"a": 9, "ok": True, "note": None})],
              [ToolCall("add", {"a": 0, "note": "x]\")<"})],
              [ToolCall("get_weather", {"city": "Paris", "unit": "C"}), ToolCall("add", {"a": 2, "ok": False})]]
BAD_CALLS = [[ToolCall("nope", {})], [ToolCall("add", {})], [ToolCall("add", {"a": 10})],
             [ToolCall("add", {"a": 1, "z": 1})], [ToolCall("get_weather", {"city": "X", "unit": "K"})],
             [ToolCall("get_weather", {"city": "X"})]]


def plain(calls: list[ToolCall]) -> list[ToolCall]:
    """`calls` without the ids a format's calls may carry (Kimi's)."""
    return [ToolCall(c.name, c.arguments) for c in calls]


def grammar(fmt, mode="required", parallel=True, output=None):
    return BYTE_COMPILER.compile_lark(fmt.grammar(TOOLS, mode, output, parallel))


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_calls_are_the_grammars_language(fmt):
    """What a format writes for valid calls is in its grammar (so a conversation that sends our calls
    back re-reads them as generated), and calls of unknown tools or invalid arguments are not."""
    g = grammar(fmt)
    for calls in GOOD_CALLS:
        if len(calls) > 1 and fmt.one_call:  # (one call a reply: harmony's; calls_text writes the first)
            assert not accepts(g, fmt.calls_text(calls) + fmt.calls_text(calls[1:]))
            continue
        assert accepts(g, fmt.calls_text(calls)), fmt.calls_text(calls)
    for calls in BAD_CALLS:
        assert not accepts(g, fmt.calls_text(calls)), fmt.calls_text(calls)
    assert not accepts(g, "") and not accepts(g, "hello")
    single = grammar(fmt, parallel=False)
    assert accepts(single, fmt.calls_text(GOOD_CALLS[0]))
    assert not accepts(single, fmt.calls_text(GOOD_CALLS[3]) + fmt.calls_text(GOOD_CALLS[3][1:]) * fmt.one_call)


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_auto_text_cannot_start_a_call_nor_write_markup(fmt):
    g = grammar(fmt, "auto")
    head = fmt.text_opening  # (the header before text: harmony's final channel)
    assert accepts(g, head + "The answer is 4.") and accepts(g, head) and accepts(g, fmt.calls_text(GOOD_CALLS[3]))
    assert not accepts(g, fmt.opening + " the answer")  # a reply that starts like a call is one
    assert not head or not accepts(g, "The answer is 4.")
    for word in (*fmt.words, "<tool_response>", "<tool", "<answer>"):
        assert not accepts(g, head + "Sure. " + word + " x") or word.startswith("<") and not accepts(g, head + word)
    with_text = "Let me check." + fmt.between_text_and_calls + fmt.calls_text(GOOD_CALLS[0])
    if fmt.text_before_calls:  # calls after text are calls
        content, calls, _ = fmt.parse(with_text)
        assert accepts(g, with_text) and (content, plain(calls)) == ("Let me check.", GOOD_CALLS[0])
    else:  # pythonic calls are a whole reply: text cannot write one (it would come back as content)
        assert not accepts(g, with_text) and accepts(g, head + "See [1] and [x(2)].")


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_output_or_calls(fmt):
    out = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    g = grammar(fmt, "auto", output=out)
    head = fmt.text_opening
    assert accepts(g, head + '{"x":3}') and accepts(g, fmt.calls_text(GOOD_CALLS[0]))
    assert not accepts(g, head + "text") and not accepts(g, head + '{"x":3,"y":1}')
    none = BYTE_COMPILER.compile_lark(fmt.grammar(TOOLS, "none", out))
    assert accepts(none, head + '{"x":3}') and not accepts(none, fmt.calls_text(GOOD_CALLS[0]))
    assert fmt.parse(head + '{"x":3}') == ('{"x":3}', [], 0) and fmt.text(head + '{"x":3}') == '{"x":3}'


ARG = st.lists(st.sampled_from(list("ab \"\\\n]){}<>,;=é") + ["</tool_call>", "[TOOL_CALLS]", '{"name":']),
               max_size=4).map("".join)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL), st.lists(st.tuples(st.integers(0, 9), st.none() | st.booleans(), ARG), min_size=1,
                                      max_size=3))
def test_parse_round_trip_and_every_cut(fmt, values):
    """calls_text -> parse gives the calls back; cut anywhere, the parse gives the calls completed
    before the cut and nothing of the cut one, and a stream's progress never takes back what it
    showed: names once complete, argument text that only grows into the final arguments."""
    calls = [ToolCall("add", {"a": a, **({} if ok is None else {"ok": ok}), "note": note}) for a, ok, note in values]
    calls = calls[:1] if fmt.one_call else calls
    for c in calls:
        if len(c.arguments["note"]) > 6:
            del c.arguments["note"]  # past the schema's maxLength
    text = fmt.calls_text(calls)
    assert accepts(grammar(fmt), text)
    content, parsed, end = fmt.parse(text)
    assert (content, plain(parsed), end) == ("", calls, len(text))
    final = [c.arguments_json for c in parsed]
    assert [json.loads(a) for a in final] == [c.arguments for c in calls]
    shown: list[str] = []
    for k in range(len(text) + 1):
        cut = text[:k]
        content, got, _ = fmt.parse(cut, cut=True)
        assert plain(got) == calls[:len(got)] and content == ""
        progress = fmt.progress(cut)
        assert [p.name for p in progress] == [c.name for c in calls[:len(progress)]]
        for i, p in enumerate(progress):
            assert final[i].startswith(p.arguments_text)
            assert p.arguments_text.startswith(shown[i] if i < len(shown) else "")
            assert p.done or i >= len(got)  # a call the parse completed is done
        shown = [p.arguments_text for p in progress]
    assert shown == final and all(p.done for p in fmt.progress(text))


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_content_holds_back_what_may_start_a_call(fmt):
    if fmt.text_before_calls:
        assert fmt.content("Sure " + fmt.opening[:3]) == "Sure"
        assert fmt.content("Sure " + fmt.opening + "...") == "Sure"
    elif fmt.text_opening:  # the text's header held back, then taken off
        assert fmt.content(fmt.text_opening[:5]) == "" and fmt.content(fmt.opening) == ""
        assert fmt.content(fmt.text_opening + "Hel") == "Hel" and fmt.content(fmt.opening[:3]) == ""
    else:
        assert fmt.content("  ") == "" and fmt.content(fmt.opening) == ""
    assert fmt.content("Hello") == "Hello"


def test_pythonic_writes_python_literals_and_keyword_order():
    fmt = Pythonic()
    g = grammar(fmt)
    assert accepts(g, '[add(a=1, ok=True, note=None)]') and accepts(g, '[add(a=1, note="x")]')
    assert not accepts(g, '[add(a=1, ok=true)]') and not accepts(g, '[add(ok=True)]')
    assert not accepts(g, '[add(note="x", a=1)]')  # the schema's order
    assert fmt.parse('[add(a=1, ok=True, note=None)]')[1] == [ToolCall("add", {"a": 1, "ok": True, "note": None})]
    with pytest.raises(RequestError, match="Python identifier"):
        fmt.grammar([FunctionSpec("get-weather", {"type": "object"})], "required", None)
    nested = FunctionSpec("f", {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
                                "$defs": {"P": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                                "required": ["on"]}}})
    g = BYTE_COMPILER.compile_lark(fmt.grammar([nested], "required", None))
    assert accepts(g, '[f(p={"on":False})]') and not accepts(g, '[f(p={"on":false})]')


def test_pythonic_names_are_pythons_keywords_and_unicode_included():
    """Arguments named by a keyword (`from`, common in conversion tools) and names in other scripts (a
    BFCL tool's `año_vehiculo`) are written and read back: the reader renames keywords for Python's
    parser, leaving the strings' text alone."""
    fmt = Pythonic()
    tools = [FunctionSpec("convert", {"type": "object", "properties": {"from": {"type": "string"},
                                                                         "to": {"type": "string"}},
                                      "required": ["from", "to"]}),
             FunctionSpec("import", {"type": "object", "properties": {"año_vehiculo": {"type": "integer"}}})]
    g = BYTE_COMPILER.compile_lark(fmt.grammar(tools, "required", None))
    calls = [ToolCall("convert", {"from": "USD", "to": "a, from=b("}), ToolCall("import", {"año_vehiculo": 2020})]
    text = fmt.calls_text(calls)
    assert accepts(g, text)
    assert fmt.parse(text)[1] == calls
    with pytest.raises(RequestError, match="Python identifier"):  # (Python reads `ﬁle` as `file`)
        fmt.grammar([FunctionSpec("f", {"type": "object", "properties": {"ﬁle": {}}})], "required", None)


def test_mistral_ids_and_structured_history():
    fmt = Mistral(native=True)
    call = ToolCall("add", {"a": 1}, "call_1_0")
    msg = fmt.assistant_message("", [call])
    (result,) = fmt.results_messages([(call, "2")])
    assert msg["tool_calls"][0]["id"] == result["tool_call_id"] and len(result["tool_call_id"]) == 9
    assert result["tool_call_id"].isalnum() and Mistral(native=True).results_messages([(call, "2")]) == [result]


@pytest.mark.parametrize("family,expected", [("qwen3", Hermes), ("qwen2.5", Hermes), ("r1", Hermes),
                                             ("llama3", Llama3Json), ("mistral", Mistral), ("pythonic", Pythonic),
                                             ("qwen3_xml", QwenXml), ("qwen3_coder", QwenXml),
                                             ("magistral", MistralArgs), ("mistral_v11", MistralArgs),
                                             ("glm45", Glm), ("kimi_k2", Kimi), ("deepseek_v31", DeepSeekV31),
                                             ("deepseek_r1", DeepSeekV3),
                                             ("granite33", Granite), ("phi4_mini", Phi4Mini), ("gpt_oss", Harmony),
                                             ("gemma4", Gemma4), ("gemma3_pythonic", Pythonic),
                                             ("gemma3", Pythonic), ("functiongemma", FunctionGemma)])
def test_detection_from_the_families_templates(family, expected):
    fam = FAMILIES[family]
    assert detect(fam.template, fam.specials) is expected
    fmt = expected.for_template(fam.template, fam.specials)
    # (DeepSeek's templates write calls, not tools)
    assert fmt.native == (expected not in (DeepSeekV3, DeepSeekV31) and family != "gemma3")
    assert fmt.opening not in fmt.markers
    assert set(fmt.markers) <= set(fam.specials)


def test_detection_without_a_tool_template_and_by_name():
    class Tok:
        chat_template = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
        special_tokens = ("<|im_start|>", "<|im_end|>")

    fmt = tool_format_for(Tok())
    assert isinstance(fmt, Hermes) and not fmt.native and fmt.markers == ("<|im_start|>", "<|im_end|>")
    system = fmt.system_message("Be brief.", [ADD.definition])["content"]
    assert system.startswith("Be brief.") and '"name": "add"' in system and "<tool_call>" in system
    assert isinstance(tool_format_for(Tok(), "pythonic"), Pythonic)
    assert "func_name1(" in tool_format_for(Tok(), "pythonic").system_message("", [ADD.definition])["content"]
    with pytest.raises(RequestError, match="hermes"):
        tool_format_for(Tok(), "qwen")
    assert sorted(FORMATS) == ["deepseek_v3", "deepseek_v31", "functiongemma", "gemma4", "glm", "granite", "harmony",
                               "hermes", "kimi_k2", "llama3_json", "mistral", "mistral_args", "phi4_mini", "pythonic",
                               "qwen3_xml"]


def test_definitions_are_offered_only_where_the_template_does_not_render_them():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    offered = Hermes(native=False).offered(chat, [ADD.definition])
    assert offered[0]["content"].startswith("Be brief.") and '"name": "add"' in offered[0]["content"]
    assert offered[1:] == chat[1:]
    alone = Hermes(native=False).offered(chat[1:], [ADD.definition])  # a system turn made for them
    assert alone[0]["role"] == "system" and alone[0]["content"].startswith("# Tools")
    assert Hermes(native=False).offered(chat[1:], []) == chat[1:]  # no tools: nothing added
    assert Hermes(native=True).offered(chat, [ADD.definition]) == chat


def test_qwen_xml_reads_strings_raw_and_the_rest_by_schema():
    """Qwen3.5's XML calls: a string argument is its raw text (quotes, newlines and JSON-looking text
    kept), other values JSON or the template's Python spelling; read by the offered tools' schemas.
    Checked against a planted bug (every value read as JSON first): it fails here."""
    fmt = QwenXml().bind([FunctionSpec("run", {"type": "object", "properties": {
        "cmd": {"type": "string"}, "n": {"type": "integer"}, "dry": {"type": "boolean"}, "env": {"type": "object"},
        "note": {"type": ["string", "null"]}}, "required": ["cmd"]})])
    text = ('Running it.\n\n<tool_call>\n<function=run>\n<parameter=cmd>\necho "1"\nls -la\n</parameter>\n'
            '<parameter=n>\n3\n</parameter>\n<parameter=dry>\nTrue\n</parameter>\n<parameter=env>\n{"A": [1]}\n'
            '</parameter>\n<parameter=note>\nNone\n</parameter>\n</function>\n</tool_call>')
    content, calls, end = fmt.parse(text)
    assert content == "Running it." and end == len(text)
    assert calls == [ToolCall("run", {"cmd": 'echo "1"\nls -la', "n": 3, "dry": True, "env": {"A": [1]}, "note": None})]
    assert fmt.parse(text.replace("echo \"1\"\nls -la", "42"))[1][0].arguments["cmd"] == "42"
    run = FunctionSpec("run", {"type": "object", "properties": {"cmd": {"type": "string"}, "n": {"type": "integer"}},
                               "required": ["cmd"]})
    g = BYTE_COMPILER.compile_lark(fmt.grammar([run], "required", None))
    ok = "<tool_call>\n<function=run>\n<parameter=cmd>\na\n</parameter>\n</function>\n</tool_call>"
    assert accepts(g, ok) and not accepts(g, ok.replace("<parameter=cmd>\na\n</parameter>\n", ""))  # required
    assert not accepts(g, ok.replace("\na\n", "\na\n</parameter>\nb\n"))  # a value cannot end its tag early
    nested = FunctionSpec("go", {"$defs": {"Loc": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                     "required": ["x"]}},
                                 "type": "object", "properties": {"at": {"$ref": "#/$defs/Loc"}}, "required": ["at"]})
    g = BYTE_COMPILER.compile_lark(fmt.grammar([nested], "required", None))  # a $ref reaches the tool's $defs
    assert accepts(g, '<tool_call>\n<function=go>\n<parameter=at>\n{"x":3}\n</parameter>\n</function>\n</tool_call>')
    with pytest.raises(RequestError, match="rename it"):
        fmt.grammar([FunctionSpec("bad", {"type": "object", "properties": {"a>b": {"type": "string"}}})], "required",
                    None)


def test_kimi_calls_keep_the_ids_they_wrote():
    """Kimi K2's calls carry ids (`functions.<name>:<index>`) its template writes back verbatim: a
    call keeps the id it wrote (one repeating an earlier call's id in the reply takes its place's),
    and a conversation whose calls a client named otherwise writes them, and their results' headers,
    by their place in the turn. Checked against a planted bug (results keeping the client's id)."""
    fmt = Kimi(native=True)
    text = fmt.calls_text([ToolCall("add", {"a": 1}, "functions.add:3"), ToolCall("add", {"a": 2}, "functions.add:3")])
    assert text.count("functions.add:3") == 2 and accepts(grammar(fmt), text)
    _, calls, _ = fmt.parse(text)
    assert [c.id for c in calls] == ["functions.add:3", "functions.add:1"]
    assert [p.id for p in fmt.progress(text)] == ["functions.add:3", "functions.add:1"]
    assert "functions.add:05" not in fmt.calls_text(calls) and not accepts(grammar(fmt), text.replace(":3", ":03", 1))
    chat = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}},
                {"id": "functions.get_weather:7", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"P","unit":"C"}'}}]},
            {"role": "tool", "tool_call_id": "functions.get_weather:7", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_x", "content": "2"}]
    rendered = template_messages(chat, fmt)
    assert [c["id"] for c in rendered[1]["tool_calls"]] == ["functions.add:0", "functions.get_weather:7"]
    assert [(m["name"], m["tool_call_id"]) for m in rendered[2:]] == [("get_weather", "functions.get_weather:7"),
                                                                      ("add", "functions.add:0")]


def test_deepseek_offers_tools_in_its_words_and_its_template_writes_calls():
    fmt = DeepSeekV31()
    system = fmt.system_message("Be brief.", [ADD.definition])["content"]
    assert system.startswith("Be brief.\n\n## Tools\nYou have access to the following tools:\n\n### add\n")
    assert '\nParameters: {"type": "object"' in system
    assert "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name" in system
    call = ToolCall("add", {"a": 1}, "call_1_0", arguments_text='{"a": 1}')
    assert fmt.assistant_message("", [call])["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert fmt.results_messages([(call, "2")]) == [{"role": "tool", "name": "add", "tool_call_id": "call_1_0",
                                                    "content": "2"}]


def test_deepseek_v3_fences_its_arguments_and_offers_tools_in_its_words():
    """V3-0324's and R1's calls: `function<｜tool▁sep｜>name`, the arguments in a fenced block, one
    call a line; the tools listed as DeepSeek's prompt lists them."""
    fmt = DeepSeekV3()
    text = fmt.calls_text([ToolCall("add", {"a": 1}), ToolCall("get_weather", {"city": "P", "unit": "C"})])
    assert text == ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{"a":1}\n```'
                    '<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                    '{"city":"P","unit":"C"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert not accepts(grammar(fmt), text.replace("\n<｜tool▁call▁begin｜>", "<｜tool▁call▁begin｜>"))
    assert not accepts(grammar(fmt), text.replace("```json", "```"))
    system = fmt.system_message("Be brief.", [ADD.definition])["content"]
    assert system.startswith("Be brief.\n\n## Tools\n\n### Function\n\nYou have the following functions "
                             'available:\n\n- `add`:\n```json\n{\n    "name": "add",')
    assert system.endswith("}\n```\n") and DeepSeekV31.knows(FAMILIES["deepseek_v31"].template)
    assert not DeepSeekV31.knows(FAMILIES["deepseek_r1"].template)


def test_phi4_mini_offers_tools_in_a_system_field_and_closes_its_calls():
    """Phi-4-mini's template reads the definitions from a system message's `tools` text (made with
    Microsoft's sentence where the conversation has none) and its calls end with <|/tool_call|>."""
    fmt = Phi4Mini.for_template(FAMILIES["phi4_mini"].template, FAMILIES["phi4_mini"].specials)
    assert fmt.native and fmt.template_tools([ADD.definition]) is None
    chat = [{"role": "user", "content": "hi"}]
    (system, user) = fmt.offered(chat, [ADD.definition])
    assert system["content"] == "You are a helpful assistant with some tools." and user == chat[0]
    assert json.loads(system["tools"])[0]["name"] == "add"
    assert template_messages([system, user], fmt)[0]["tools"] == system["tools"]  # kept for the template
    text = fmt.calls_text([ToolCall("add", {"a": 1})])
    assert text == '<|tool_call|>[{"name":"add","arguments":{"a":1}}]<|/tool_call|>'
    assert not accepts(grammar(fmt), text.removesuffix("<|/tool_call|>"))
    assert fmt.parse("ok" + text)[2] == len(text) + 2


def test_gemma4_writes_values_in_its_notation_under_the_schema():
    """Gemma 4's arguments: keys bare, strings raw between <|"|> tokens, nested objects and arrays in
    the same notation, under the schema (required keys, counts, bounds, a local $ref); what the
    notation cannot carry is a RequestError naming the tool and the keyword."""
    q = '<|"|>'
    spec = FunctionSpec("plan", {"$defs": {"Stop": {"type": "object", "properties": {
        "at": {"type": "string"}, "mins": {"type": "integer", "minimum": 1}}, "required": ["at"]}},
        "type": "object", "properties": {
            "title": {"type": "string", "maxLength": 9}, "stops": {"type": "array", "items": {"$ref": "#/$defs/Stop"},
                                                                   "minItems": 1, "maxItems": 2},
            "mode": {"enum": ["walk", "bus"]}, "fast": {"type": ["boolean", "null"]}},
        "required": ["stops"]})
    fmt = Gemma4()
    g = BYTE_COMPILER.compile_lark(fmt.grammar([spec], "required", None))
    args = {"title": 'a "b",{c}', "stops": [{"at": "x<y\n", "mins": 3}, {"at": ""}], "mode": "bus", "fast": None}
    text = fmt.calls_text([ToolCall("plan", args)])
    assert text == (f"<|tool_call>call:plan{{title:{q}a \"b\",{{c}}{q},stops:[{{at:{q}x<y\n{q},mins:3}},{{at:{q}{q}}}],"
                    f"mode:{q}bus{q},fast:null}}<tool_call|>")
    assert accepts(g, text) and fmt.parse(text)[1] == [ToolCall("plan", args)]
    for bad in ({**args, "stops": []}, {**args, "stops": args["stops"] * 2}, {"title": "t"},
                {**args, "title": "1234567890"}, {**args, "title": "a|b"}, {**args, "mode": "car"},
                {**args, "stops": [{"mins": 3}]}, {**args, "stops": [{"at": "x", "mins": 0}]}):
        assert not accepts(g, fmt.calls_text([ToolCall("plan", bad)])), bad
    progress = fmt.progress(text[:text.index("mode:")])
    assert progress[0].arguments_text == '{"title":"a \\"b\\",{c}","stops":[{"at":"x<y\\n","mins":3},{"at":""}]'
    for schema, word in (({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}, "pattern"),
                         ({"type": "object", "properties": {"a b": {"type": "string"}}}, "rename it"),
                         ({"type": "object", "properties": {"o": {"type": "object", "additionalProperties": True}}},
                          "additionalProperties")):
        with pytest.raises(RequestError, match=f"tool 'bad'.*{word}|{word}.*"):
            fmt.grammar([FunctionSpec("bad", schema)], "required", None, close_objects=False)


def test_pythonic_calls_go_back_structured_only_where_the_template_needs_them():
    """vLLM's Gemma 3 template checks that the turns without `tool_calls` alternate, so calls go back
    to it structured (it writes them); Llama 3.2's take them as the text the model wrote."""
    fam = FAMILIES["gemma3_pythonic"]
    fmt = Pythonic.for_template(fam.template, fam.specials)
    msg = fmt.assistant_message("", [ToolCall("add", {"a": 1}, "call_1")])
    assert fmt.structured and msg["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    llama = Pythonic.for_template(FAMILIES["pythonic"].template, FAMILIES["pythonic"].specials)
    assert not llama.structured and llama.assistant_message("", [ToolCall("add", {"a": 1})]) == {
        "role": "assistant", "content": "[add(a=1)]"}


def test_functiongemma_writes_googles_notation_after_its_trigger():
    """FunctionGemma's calls are Gemma 4's notation with its own markers and `<escape>` strings, and
    the developer turn ends with the sentence Google's guide says switches it to calling (once)."""
    fam = FAMILIES["functiongemma"]
    fmt = FunctionGemma.for_template(fam.template, fam.specials)
    text = fmt.calls_text([ToolCall("get_weather", {"city": "Tokyo, JP", "unit": "C"})])
    assert text == "<start_function_call>call:get_weather{city:<escape>Tokyo, JP<escape>,unit:<escape>C<escape>}" \
                   "<end_function_call>"
    assert accepts(grammar(fmt), text) and fmt.parse(text)[1] == [ToolCall("get_weather", {"city": "Tokyo, JP",
                                                                                            "unit": "C"})]
    offered = fmt.offered([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                          [WEATHER.definition])
    assert offered[0]["content"] == f"Be brief.\n\n{FunctionGemma.TRIGGER}"
    assert fmt.offered(offered, [WEATHER.definition]) == offered
