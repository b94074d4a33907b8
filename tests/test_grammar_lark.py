"""Lark grammars: accept/refuse tables, %json, %ignore, left recursion, errors with line and caret."""

import pytest

from agentkv.errors import GrammarError
from tests.grammar_helpers import BYTE_COMPILER, STRICT_BYTE_COMPILER, assert_language

CALC = r"""
?start: sum
sum: sum ("+" | "-") product | product
product: product ("*" | "/") atom | atom
atom: NUMBER | "-" atom | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""

TOOL_CALL = r"""
start: "<tool>" NAME "</tool>" args
args: %json {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
             "additionalProperties": false}
NAME: /[a-z_]+/
"""

TABLE = [
    (CALC, ["1", "1+2*3", "(1 + 2) * -3", "2.5 / (4-1)", "((1))"], ["", "1+", "(1", "1 2", "a"]),
    (TOOL_CALL, ['<tool>get_weather</tool>{"city":"Paris"}'],
     ['<tool>get_weather</tool>{"city":1}', '<tool>Get</tool>{"city":"x"}', "<tool>x</tool>{}"]),
    ('start: "a"i "b"+ ["c"] ("d" | "e"){2}', ["Abdd", "abbbcde", "Abbed"], ["ABdd", "abd", "abcdddd", "b"]),
    ('start: X ~ 2..3\nX: "a".."c"', ["ab", "cca"], ["a", "abca", "d"]),
    ("start: list\nlist: \"[\" [item (\",\" item)*] \"]\"\nitem: list | INT\n%import common.INT",
     ["[]", "[1,[2,[3,[]]],4]", "[[[[[[[[[[1]]]]]]]]]]"], ["[", "[1,]", "[[1]"]),
    ("start: A B\nA: /x+/\nB: A \"y\"   // terminals may use terminals", ["xxxy", "xxy"], ["xy", "x"]),
]


@pytest.mark.parametrize("grammar,good,bad", TABLE)
def test_lark_table(grammar, good, bad):
    assert_language(BYTE_COMPILER.compile_lark(grammar), good, bad, grammar)


@pytest.mark.parametrize("grammar,line,what", [
    ("start: a\na: b", 2, "rule 'b' is not defined"),
    ("start: X\nX: X \"a\"", 2, "refers to itself"),
    ("start: \"a\" (\"b\"", 1, "never closed"),
    ("start: \"a\" b\nb: /[0-9]+", 2, "this regex is not closed: end it with /"),
    ("start: \"a\nb\"", 1, "this string is not closed: end it with \""),
    ("start: /(?=a)/", 1, "lookaround"),
    ("start: x\nx: y | \"b\"\ny: x \"a\"", None, "left-recursive"),
    ("start: \"a\"\n%import other.X", 2, "only `%import common"),
    ("start: \"a\" %json {\"type\": \"integer\", \"not\": {\"minimum\": 3}}", None, "not"),
])
def test_lark_errors(grammar, line, what):
    with pytest.raises(GrammarError, match=what) as e:
        STRICT_BYTE_COMPILER.compile_lark(grammar)
    if line is not None:
        assert f"line {line}," in str(e.value) and "^" in str(e.value)


def test_missing_start_rule():
    with pytest.raises(GrammarError, match="start"):
        BYTE_COMPILER.compile_lark('main: "a"')
