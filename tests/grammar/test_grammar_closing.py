"""The shortest completion of an output (budget closing's text, automata/shortest.py) against a
brute-force search over the grammar's configurations, and the digit bound on generated numbers."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.errors import GrammarError
from agentkv.grammar import GrammarCompiler, Matcher
from agentkv.grammar.compiled import DEAD
from tests.grammar_helpers import BYTE_COMPILER, BYTE_INFO, accepts

SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "population": {"type": "integer"}},
     "required": ["city", "population"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "minLength": 3},
                                               "minItems": 2},
                                      "score": {"type": "number", "minimum": 0.5},
                                      "kind": {"enum": ["alpha", "be", "gamma"]}},
     "required": ["tags", "kind", "score"]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                        "required": ["v", "kids"]}},
     "$ref": "#/$defs/node"},
    {"anyOf": [{"type": "object", "properties": {"a": {"type": "string", "pattern": "^x+y$"}}, "required": ["a"]},
               {"type": "array", "items": {"type": "boolean"}, "minItems": 3}]},
    True,
]
LARK = r"""
start: "call(" args ")"
args: arg ("," arg)*
arg: NAME "=" value
value: NUMBER | "[" value ("," value)* "]" | "'" NAME "'"
NAME: /[a-z]{2,5}/
NUMBER: /[0-9]+/
"""


def grammars():
    out = [BYTE_COMPILER.compile_json_schema(s, close_objects=True) for s in SCHEMAS]
    out.append(BYTE_COMPILER.compile_lark(LARK))
    out.append(BYTE_COMPILER.compile_regex(r"(ab|c)+-[0-9]{3}(x|yy)?"))
    return out


GRAMMARS = grammars()


def shortest_by_search(g, cid: int, limit: int = 80) -> int | None:
    """The fewest bytes that take configuration `cid` to one that may end: breadth first over every byte."""
    frontier, seen = [cid], {cid}
    for depth in range(limit):
        if any(g.can_end(c) for c in frontier):
            return depth
        nxt = []
        for c in frontier:
            for b in range(256):
                d = g.step(c, b)
                if d != DEAD and d not in seen:
                    seen.add(d)
                    nxt.append(d)
        frontier = nxt
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(GRAMMARS))), st.lists(st.integers(0, 1 << 16), max_size=40))
def test_the_completion_is_the_shortest_text_that_ends_the_output(which, choices):
    g = GRAMMARS[which]
    m, text = Matcher(g), b""
    for pick in choices:  # a random walk through text the grammar allows
        allowed = g.allowed_bytes(m._cfg)
        if not len(allowed):
            break
        b = int(allowed[pick % len(allowed)])
        assert m.accept_bytes(bytes([b]))
        text += bytes([b])
    completion = m.completion_bytes()
    assert completion is not None
    assert accepts(g, text + completion), (text, completion)
    assert len(completion) == shortest_by_search(g, m._cfg), (text, completion)
    toks = m.completion_tokens()
    assert BYTE_INFO.decode(toks) == completion and m.accept_tokens(toks) and m.can_terminate()


def test_a_completion_fills_required_keys_with_their_shortest_values():
    m = Matcher(GRAMMARS[1])
    assert m.completion_bytes() == b'{"tags":["aaa","aaa"],"score":1,"kind":"be"}'
    assert m.accept_bytes(b'{"tags":["ab')
    assert m.completion_bytes() == b'a","aaa"],"score":1,"kind":"be"}'
    m = Matcher(GRAMMARS[2])
    assert m.accept_bytes(b'{"v":12,"kids":[{"v":3,"kids":[{"v')
    done = b'{"v":12,"kids":[{"v":3,"kids":[{"v' + m.completion_bytes()
    assert json.loads(done) == {"v": 12, "kids": [{"v": 3, "kids": [{"v": 0, "kids": []}]}]}


def test_terminated_and_complete_outputs():
    m = Matcher(GRAMMARS[0])
    assert m.accept_bytes(b'{"city":"","population":7}')
    assert m.completion_bytes() == b"" and m.completion_tokens() == []
    assert m.accept_token(BYTE_INFO.eos_ids[0]) if isinstance(BYTE_INFO.eos_ids, list) else m.accept_token(256)
    assert m.completion_bytes() is None


# -- numbers held to a number of digits ---------------------------------------------------------------


def bounded(schema, digits=16):
    return GrammarCompiler(BYTE_INFO, number_digits=digits).compile_json_schema(schema)


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "integer"}, ["1234567890123456", "-1234567890123456", "0"], ["12345678901234567"]),
    ({"type": "number"}, ["1.1234567890123456", "1234567890123456.5", "1e1234567890123456"],
     ["1.12345678901234567", "12345678901234567", "1e12345678901234567"]),
    # a bound the schema gives is kept whole: the caps grow to hold it
    ({"type": "integer", "minimum": 10 ** 20}, ["100000000000000000000", "123456789012345678901"],
     ["1000000000000000000000"]),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-18}, ["0.0000000000000000005"], ["0"]),
    ({"type": "integer", "minimum": 0, "maximum": 10 ** 30}, [str(10 ** 30)], [str(10 ** 30 + 1)]),
    ({"type": "number", "multipleOf": 1e-20}, ["0.00000000000000000001"], ["0.000000000000000000001"]),
    (True, ["[1234567890123456]"], ["[12345678901234567]"]),
])
def test_numbers_stop_at_their_digit_bound(schema, good, bad):
    g = bounded(schema)
    for s in good:
        assert accepts(g, s), s
    for s in bad:
        assert not accepts(g, s), s
    exact = BYTE_COMPILER.compile_json_schema(schema)  # the compiler's default: exact to the spec
    for s in good + [b for b in bad if jsonschema.Draft202012Validator(schema).is_valid(json.loads(b))]:
        assert accepts(exact, s), s


def test_the_bound_is_configurable_and_checked():
    assert accepts(bounded({"type": "integer"}, 3), "999") and not accepts(bounded({"type": "integer"}, 3), "1000")
    assert accepts(bounded({"type": "integer"}, None), "1" * 40)
    with pytest.raises(GrammarError, match="number_digits"):
        bounded({"type": "integer"}, 0)


def test_lark_json_blocks_take_the_compilers_bound():
    g = GrammarCompiler(BYTE_INFO, number_digits=4).compile_lark('start: "n=" %json {"type": "integer"}')
    assert accepts(g, "n=1234") and not accepts(g, "n=12345")


@pytest.mark.parametrize("which", range(len(GRAMMARS)))
def test_every_states_distance_is_its_texts_length(which):
    g = GRAMMARS[which]
    sh, a = g._shortest, g.automaton
    for s in range(len(a.accept)):
        d = sh.distance(s)
        if d is not None:
            text = sh.text(s)
            assert len(text) == d, (s, text, d)


# -- objects closed by policy ----------------------------------------------------------------------


def test_closing_objects_keeps_the_names_a_schema_requires_without_declaring():
    """BFCL's `{"type": "dict", "required": ["adults", ...]}` (no properties): closed by policy, its
    required names are declared (any value), not refused, in a schema and in a tool's %json block;
    an `additionalProperties: false` the schema writes itself is kept as the spec reads it."""
    from agentkv.grammar.compiler import closed_schema

    schema = {"type": "object", "properties": {"p": {"type": "object", "required": ["adults", "kids"]}},
              "required": ["p"]}
    for g in (BYTE_COMPILER.compile_json_schema(schema, close_objects=True),
              BYTE_COMPILER.compile_lark(f"start: %json {json.dumps(closed_schema(schema))}")):
        assert accepts(g, '{"p":{"adults":2,"kids":[1]}}')
        assert not accepts(g, '{"p":{"adults":2,"kids":1,"pets":0}}') and not accepts(g, '{"p":{"adults":2}}')
    written = {"type": "object", "required": ["a"], "additionalProperties": False}
    with pytest.raises(GrammarError, match="accepts no string"):
        BYTE_COMPILER.compile_json_schema(written, close_objects=True)
