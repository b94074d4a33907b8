"""The expression extension (csrc/ext/expr_module.c) against the Python encoding it replaces.

Where Python's headers are, dfa_native.expression hands a rule's expression objects to the extension,
which encodes them in C. The code it builds must be dfa_native.encode's, int for int (the same node
numbering, names sorted, embedded DFAs in the same order), and the RuleDFA it hands back must equal
the one the ctypes path copies out. Errors keep their types, references stay balanced, and without the
extension (no headers, no compiler) the Python encoding still builds every rule.
"""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.errors import GrammarError
from agentkv.grammar import native
from agentkv.grammar.automata import dfa, dfa_native
from agentkv.grammar.automata.expr import Alt, Anchor, Diff, Intersect, Ref, Repeat, chars, lit, seq
from agentkv.grammar.automata.regex import match_expr, search_expr
from agentkv.grammar.schema.json_schema import JsonSchemaConverter
from agentkv.grammar.schema.numbers import multiple_of
from tests.grammar.test_grammar_regex import patterns

FAR = float("inf")
EXT = dfa_native._expr_module()  # (configured with the expression classes)

pytestmark = pytest.mark.skipif(EXT is None, reason=f"no expression extension: {native._expr_module()[1]}")

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", "ç"]}, "maxItems": 4}},
     "required": ["name"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,5}$"},
                                      "price": {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": 0},
                                      "when": {"type": "string", "format": "date-time"}}},
    {"$defs": {"node": {"type": "object",
                        "properties": {"v": {"type": "integer"},
                                       "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
     "$ref": "#/$defs/node"},
    {"anyOf": [{"type": "string", "pattern": "^x+$", "not": {"const": "xxx"}}, {"type": "boolean"}, {"type": "null"}]},
    {"type": "object", "additionalProperties": {"type": "number"}, "propertyNames": {"pattern": "^[a-z]+$"}},
]


def schema_rules() -> list:
    exprs = []
    for schema in SCHEMAS:
        exprs.extend(JsonSchemaConverter(schema, deadline=FAR).convert().values())
    return exprs


def python_encoding(expr):
    code, root, names, embedded = dfa_native.encode(expr, FAR, dfa.minimal_dfa)
    return code.tolist(), root, tuple(names), embedded


def ext_encoding(expr):
    code, root, names, embedded = EXT.encode(expr, FAR, dfa.minimal_dfa)
    return np.frombuffer(code, dtype=np.int32).tolist(), root, names, embedded


def assert_same_encoding(expr):
    py, c = python_encoding(expr), ext_encoding(expr)
    assert c[:3] == py[:3], expr
    assert [id(d) for d in c[3]] == [id(d) for d in py[3]] or all(
        np.array_equal(a.table, b.table) for a, b in zip(c[3], py[3], strict=True)), expr


def built(expr, with_ext: bool):
    """dfa_native.expression's RuleDFA, through the extension or through encode and ctypes."""
    with pytest.MonkeyPatch.context() as patch:
        if not with_ext:
            patch.setattr(dfa_native, "_expr_module", lambda: None)
        return dfa_native.expression(native.load(), expr, FAR, dfa.minimal_dfa)


def assert_same_result(expr):
    a, b = built(expr, True), built(expr, False)
    assert np.array_equal(a.table, b.table) and np.array_equal(a.accept, b.accept), expr
    assert a.calls == b.calls and a.rules == b.rules, expr
    assert all(np.array_equal(x, y) for x, y in zip(a.classes, b.classes, strict=True)), expr
    assert a.table.dtype == b.table.dtype and a.accept.dtype == b.accept.dtype


@settings(max_examples=150, deadline=None)
@given(patterns(), st.booleans())
def test_patterns_encode_as_python_does(pattern, search):
    assert_same_encoding(search_expr(pattern) if search else match_expr(pattern))


@settings(max_examples=60, deadline=None)
@given(patterns(), st.sampled_from(["one", "two", "a_rule"]))
def test_rule_calls_and_embedded_automata_encode_as_python_does(pattern, name):
    # Names met out of order (renumbered sorted), one node shared by two parents, a product embedded.
    shared = match_expr(pattern)
    expr = Alt((seq(Ref("zeta"), shared), seq(Ref(name), Repeat(shared, 1, 3)), Ref("alpha"),
                Intersect(search_expr(pattern), match_expr("[a-z]*")), Diff(shared, lit("x"))))
    assert_same_encoding(expr)


def test_schema_rules_encode_and_build_as_python_does():
    exprs = schema_rules()
    assert len(exprs) > 15
    for expr in exprs:
        assert_same_encoding(expr)
        assert_same_result(expr)


@settings(max_examples=60, deadline=None)
@given(patterns())
def test_built_automata_equal_the_ctypes_path(pattern):
    assert_same_result(seq(search_expr(pattern), Ref("next"), Repeat(chars(("0", "9")), 0, 4)))


def test_machines_and_long_literals():
    for expr in (multiple_of(0.25, integer=False, where=None), lit("x" * 300),
                 Alt(tuple(chars((chr(c), chr(c + 3))) for c in range(0x400, 0x4C0, 4)))):
        assert_same_encoding(expr)
        assert_same_result(expr)


def test_errors_keep_their_types():
    with pytest.raises(GrammarError, match="anchor"):
        EXT.expr_to_dfa(seq(lit("a"), Anchor("$")), FAR, 1e9, dfa.minimal_dfa, 1000, 1000)
    with pytest.raises(TypeError, match="not a grammar expression"):
        EXT.encode(seq(lit("a"), "b"), FAR, dfa.minimal_dfa)
    deep = lit("a")
    for _ in range(6000):
        deep = Repeat(deep, 0, 1)
    with pytest.raises(RecursionError):
        EXT.encode(deep, FAR, dfa.minimal_dfa)
    # Limits come back as error codes that dfa_native maps to the same messages as the ctypes path.
    dfa.clear_cache()
    with pytest.raises(GrammarError, match="automaton states"):
        dfa.minimal_dfa(Repeat(lit("abcdefgh"), 0, dfa.MAX_NFA_STATES // 4), FAR)
    with pytest.raises(GrammarError, match="timed out"):
        dfa.minimal_dfa(Repeat(search_expr("[a-z]{1,40}x"), 3, 3), 0.0)
    dfa.clear_cache()
    # An embedded automaton's error (minimal raises) comes back as raised.
    with pytest.raises(GrammarError, match="rule references"):
        EXT.encode(Intersect(seq(lit("a"), Ref("x")), match_expr("a+")), FAR, dfa.minimal_dfa)
    # And after all of them the extension still builds.
    assert EXT.expr_to_dfa(lit("ok"), FAR, 1e9, dfa.minimal_dfa, 1000, 1000)[0][0] == 3


def nodes(expr) -> list:
    """Every node of an expression and every value a node holds, each once."""
    out, seen, todo = [], set(), [expr]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        for field in getattr(e, "__dataclass_fields__", ()):
            v = getattr(e, field)
            todo.extend(v if type(v) is tuple and field == "items" else [v])
    return out


def test_references_stay_balanced():
    expr = seq(Ref("b"), search_expr("[a-z]+@(x|y)"), Ref("a"), Intersect(match_expr("a*"), match_expr("a{2,}")))
    EXT.expr_to_dfa(expr, FAR, 1e9, dfa.minimal_dfa, 100_000, 100_000)  # (what it caches, cached)
    held = [*nodes(expr), "a", "b"]
    before = [sys.getrefcount(o) for o in held]
    for _ in range(200):
        EXT.expr_to_dfa(expr, FAR, 1e9, dfa.minimal_dfa, 100_000, 100_000)
        EXT.encode(expr, FAR, dfa.minimal_dfa)
        with pytest.raises(TypeError):
            EXT.encode(seq(expr, 1), FAR, dfa.minimal_dfa)
    assert [sys.getrefcount(o) for o in held] == before


def test_without_headers_the_python_encoding_builds(monkeypatch):
    import sysconfig

    native._expr_module.cache_clear()
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": "/nonexistent"})
    try:
        assert native.expr_module() is None and "Python.h" in native._expr_module()[1]
    finally:
        monkeypatch.undo()
        native._expr_module.cache_clear()
    assert native.expr_module() is not None
