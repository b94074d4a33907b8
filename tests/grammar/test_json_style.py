"""JSON styles (grammar/schema/style.py): compact and spaced grammars write one canonical form each,
and the model's choice ("model") takes either at its first separator, then holds it. Checked on
instances of real schemas (hypothesis-jsonschema) as the compact grammar writes them, re-spaced."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from agentkv.errors import GrammarError
from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from agentkv.grammar.schema.walk import find_serialization
from tests.grammar_helpers import BYTE_INFO, accepts, assert_mask_is_brute_force

hypothesis_jsonschema = pytest.importorskip("hypothesis_jsonschema")

COMPILERS = {s: GrammarCompiler(BYTE_INFO, json_style=s) for s in ("compact", "spaced", "model")}
SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
     "required": ["city", "population"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b,c", "d: e"]},
                                               "maxItems": 3},
                                      "point": {"type": "array", "items": False, "minItems": 2,
                                                "prefixItems": [{"type": "number"}, {"type": "boolean"}]},
                                      "fixed": {"const": {"k": [1, {"x": None}], "w": "a,b"}}},
     "required": ["fixed"]},
    {"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["v"], "additionalProperties": False}},
     "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 2},
                                      "v": {"$ref": "#/$defs/leaf/properties/v"}}},
    {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "array", "items": {"type": "null"}, "maxItems": 3}]},
]


def respace(text: str, only: str | None = None) -> str:
    """Compact JSON text with `, ` and `: ` outside its strings; `only` "first" or "last": at that
    separator alone (a text that mixes the styles)."""
    at, in_string, escaped = [], False, False
    for i, c in enumerate(text):
        if in_string:
            in_string, escaped = not (c == '"' and not escaped), c == "\\" and not escaped
        elif c == '"':
            in_string = True
        elif c in ",:":
            at.append(i)
    if only is not None:
        at = at[:1] if only == "first" else at[-1:]
    for i in reversed(at):
        text = text[:i + 1] + " " + text[i + 1:]
    return text


def grammar(style: str, which: int):
    return COMPILERS[style].compile_json_schema(SCHEMAS[which], close_objects=True)


@pytest.mark.parametrize("which", range(len(SCHEMAS)))
def test_each_style_writes_its_own_separators_and_the_model_holds_its_first_choice(which):
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(value=hypothesis_jsonschema.from_schema(SCHEMAS[which]))
    def check(value):
        compact = find_serialization(grammar("compact", which), value)
        if compact is None:
            return  # (an instance the closed grammar leaves out: an extra key)
        spaced = respace(compact)
        assert accepts(grammar("spaced", which), spaced) and accepts(grammar("model", which), spaced)
        assert accepts(grammar("model", which), compact)
        if spaced != compact:
            assert not accepts(grammar("spaced", which), compact)
            assert not accepts(grammar("compact", which), spaced)
        for only in ("first", "last"):  # one style at the first separator, the other after it
            mixed = respace(compact, only)
            if mixed not in (compact, spaced):
                assert not accepts(grammar("model", which), mixed), mixed

    check()


def test_spaced_is_what_json_dumps_writes():
    g = grammar("spaced", 1)
    value = {"tags": ["b,c", "a"], "point": [1.5, True], "fixed": {"k": [1, {"x": None}], "w": "a,b"}}
    assert accepts(g, json.dumps(value, ensure_ascii=False))
    assert Matcher(g).completion_bytes() == b'{"fixed": {"k": [1, {"x": null}], "w": "a,b"}}'


def test_a_recursive_value_holds_its_style_at_every_depth():
    node = {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array",
                                                                               "items": {"$ref": "#"}}},
            "required": ["v", "kids"]}
    value = {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]}
    compact = json.dumps(value, separators=(",", ":"))
    for style, good in [("compact", [compact]), ("spaced", [respace(compact)]), ("model", [compact, respace(compact)])]:
        g = COMPILERS[style].compile_json_schema(node, close_objects=True)
        for text in (compact, respace(compact), respace(compact, "first"), respace(compact, "last")):
            assert accepts(g, text) == (text in good), (style, text)


def test_before_the_choice_the_text_both_styles_force_is_forced():
    m = Matcher(COMPILERS["model"].compile_json_schema({"const": {"a": [1, 2]}}))
    assert m.jump_forward_bytes() == b'{"a":'
    assert m.accept_bytes(b'{"a": ')
    assert m.jump_forward_bytes() == b"[1, 2]}"
    m = Matcher(COMPILERS["model"].compile_json_schema({"const": {"a": [1, 2]}}))
    assert m.accept_bytes(b'{"a":[')
    assert m.jump_forward_bytes() == b"1,2]}"


def test_a_value_without_separators_has_one_copy_of_its_rules():
    one = COMPILERS["model"].compile_json_schema({"type": "string", "maxLength": 3})
    two = COMPILERS["model"].compile_json_schema({"type": "array", "maxItems": 3})
    assert len(one.stacks(one.initial)) == 1 and len(two.stacks(two.initial)) == 2


def test_masks_under_the_model_choice_are_brute_force():
    words = [b"{", b"}", b'"', b"a", b":", b": ", b", ", b",", b"1", b'":', b'": ', b'":1', b' "', b"[", b"]", b" "]
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = GrammarCompiler(info, json_style="model").compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]})
    bits = np.zeros((1, info.words), dtype=np.int32)
    expected = {b'{"a":': {b" ", b"["}, b'{"a": [1,': {b" "}, b'{"a":[1,': {b"1"},
                b'{"a": [1': {b",", b", ", b"1", b"]"}, b'{"a":[1': {b",", b"1", b"]"}}
    for prefix in (b"", b'{"a', b'{"a":', b'{"a": [1', b'{"a":[1', b'{"a": [1,', b'{"a":[1,', b'{"a": [1, 1'):
        m = Matcher(g)
        assert m.accept_bytes(prefix)
        allowed = {words[t] for t in assert_mask_is_brute_force(m, bits) if t < len(words)}
        if prefix in expected:
            assert allowed == expected[prefix], prefix


def test_lark_blocks_name_their_style_or_take_the_compilers():
    schema = ('{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, '
              '"required": ["a", "b"]}')
    spaced, compact = '{"a": 1, "b": 2}', '{"a":1,"b":2}'
    for text, style, good, bad in [
        (f'start: "x" %json:spaced {schema}', "compact", [spaced], [compact]),
        (f'start: "x" %json:compact {schema}', "spaced", [compact], [spaced]),
        (f'start: "x" %json:model {schema}', "compact", [compact, spaced], ['{"a": 1,"b":2}']),
        (f'start: "x" %json {schema}', "spaced", [spaced], [compact]),
        (f'start: "x" %json {schema} "," %pyjson:spaced {{"const": {{"k": [true, null]}}}}', "compact",
         [compact + ',{"k": [True, None]}'], [compact + ',{"k":[True,None]}']),
    ]:
        g = GrammarCompiler(BYTE_INFO, json_style=style).compile_lark(text)
        for s in good:
            assert accepts(g, "x" + s), (text, s)
        for s in bad:
            assert not accepts(g, "x" + s), (text, s)


def test_unknown_styles_are_refused_naming_the_choices():
    with pytest.raises(GrammarError, match="%json:wide names no JSON style; write one of %json:compact"):
        GrammarCompiler(BYTE_INFO).compile_lark('start: %json:wide {"type": "integer"}')
    with pytest.raises(GrammarError, match="choose one of"):
        GrammarCompiler(BYTE_INFO, json_style="pretty")
    with pytest.raises(GrammarError, match="choose one of"):
        COMPILERS["compact"].compile_json_schema({"type": "integer"}, json_style="wide")


def test_the_engine_drops_tokens_the_tokenizer_would_not_end_where_the_grammar_forces_on(smollm_info):
    """After `"order_id":` spaced JSON forces ` "`, one BPE token: the grammar's mask allows a lone ` `
    (its text is valid), the engine's row does not; every other token stays as the mask has it."""
    tok = {smollm_info.vocab[t]: t for t in range(smollm_info.vocab_size) if smollm_info.vocab[t] is not None}
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["order_id", "n"]}
    g = GrammarCompiler(smollm_info, json_style="spaced").compile_json_schema(schema)
    words = (smollm_info.vocab_size + 31) // 32
    # (at the start `{` is dropped too: the forced `{"` is one token)
    for text, dropped in ((b'{"order_id":', {b" "}), (b'{"order_id": "A",', {b" "}), (b'{"order_id": "A', set()),
                          (b"", {b"{"})):
        m = Matcher(g)
        assert m.accept_bytes(text)
        exact, engine = np.zeros((1, words), dtype=np.int32), np.zeros((1, words), dtype=np.int32)
        m.fill_next_token_bitmask(exact)
        m.fill_next_token_bitmask(engine)
        m.drop_split_prefixes(engine)
        bits = [set(np.nonzero(np.unpackbits(b[0].view(np.uint8), bitorder="little"))[0]) for b in (exact, engine)]
        assert {smollm_info.vocab[t] for t in bits[0] - bits[1]} == dropped, text
        assert bits[1] <= bits[0] and bits[1]
        if text.endswith(b":"):
            assert tok[b' "'] in bits[1]  # (what the tokenizer writes there)


@pytest.mark.parametrize("style", ["compact", "spaced", "model"])
def test_the_engines_rows_never_empty_and_drop_only_split_prefixes(smollm_info, style):
    """Along random walks: every token dropped is a strict prefix of the forced text, and a row the
    grammar allows anything in still allows something (the longest prefix token stays)."""
    import random

    schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": SCHEMAS[1]},
              "required": ["name", "arguments"]}
    g = GrammarCompiler(smollm_info, json_style=style).compile_json_schema(schema, close_objects=True)
    words = (smollm_info.vocab_size + 31) // 32
    rnd = random.Random(0)
    for _ in range(6):
        m = Matcher(g)
        for _ in range(60):
            exact, row = np.zeros((1, words), dtype=np.int32), np.zeros((1, words), dtype=np.int32)
            m.fill_next_token_bitmask(exact)
            m.fill_next_token_bitmask(row)
            m.drop_split_prefixes(row)
            allowed, kept = (set(np.nonzero(np.unpackbits(b[0].view(np.uint8), bitorder="little"))[0])
                             for b in (exact, row))
            forced = m.jump_forward_bytes()
            assert kept <= allowed and (kept or not allowed)
            assert all(forced.startswith(smollm_info.vocab[t]) and len(smollm_info.vocab[t]) < len(forced)
                       for t in allowed - kept)
            if m.must_terminate() or not kept - set(smollm_info.eos_ids):
                break
            assert m.accept_token(rnd.choice(sorted(kept - set(smollm_info.eos_ids))))
