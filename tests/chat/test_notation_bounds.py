"""Every count and bound of a tool's parameters, at its limit and one past it, in each argument notation
that is not plain JSON: Gemma 4's value notation and the XML formats' (Qwen3-Coder's, GLM's). Checked
against a planted off-by-one in Gemma's maxItems (the rest of an array allowed `hi` more items, not
`hi - 1`): it fails here, where tests written at twice the limit passed it."""

from __future__ import annotations

import pytest

from agentkv.chat.calls import FunctionSpec, ToolCall
from agentkv.chat.formats import FORMATS
from tests.grammar_helpers import BYTE_COMPILER, accepts

SPEC = FunctionSpec("f", {"type": "object", "properties": {
    "xs": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    "s": {"type": "string", "minLength": 2, "maxLength": 5},
    "n": {"type": "integer", "minimum": 3, "maximum": 7},
    "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
    "required": ["xs", "s", "n", "x"], "additionalProperties": False})
GOOD = {"xs": [1, 2], "s": "ab", "n": 3, "x": 0.5}
# (at the limit, one past it) for each bound
CASES = [
    ({"xs": [1, 2]}, {"xs": [1]}), ({"xs": [1, 2, 3, 4]}, {"xs": [1, 2, 3, 4, 5]}),
    ({"s": "ab"}, {"s": "a"}), ({"s": "abcde"}, {"s": "abcdef"}),
    ({"n": 3}, {"n": 2}), ({"n": 7}, {"n": 8}),
    ({"x": 0.001}, {"x": 0}), ({"x": 0.999}, {"x": 1}),
]


@pytest.mark.parametrize("name", ["gemma4", "qwen3_xml", "glm"])
def test_each_bound_holds_at_its_limit_and_not_past_it(name):
    fmt = FORMATS[name]()
    fmt = fmt.bind([SPEC]) if hasattr(fmt, "bind") else fmt  # (the XML formats write by the offered schemas)
    grammar = BYTE_COMPILER.compile_lark(fmt.grammar([SPEC], "required", None))

    def written(args: dict) -> bool:
        return accepts(grammar, fmt.calls_text([ToolCall("f", {**GOOD, **args})]))

    assert written({})
    for at, past in CASES:
        assert written(at), (name, at)
        assert not written(past), (name, past)
