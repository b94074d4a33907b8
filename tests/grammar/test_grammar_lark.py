"""Lark grammars: accept/refuse tables, %json, %ignore, templates, imports, left recursion, errors with line and
caret in the text as written (the `lark` package parses it; %json blocks and {m,n} are rewritten first)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.errors import GrammarError
from tests.grammar_helpers import (
    BYTE_COMPILER,
    STRICT_BYTE_COMPILER,
    accepts,
    assert_language,
)

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
    # Lark's own syntax, which the grammar of grammars parses: templates, imports by list and alias,
    # anonymous %ignore, priorities, aliases, rules continued on the next line
    ('start: _sep{item, ","}\n_sep{x, sep}: x (sep x)*\nitem: "a" | "b"', ["a", "a,b,a"], ["", "a,", ",a", "ab"]),
    ('start: WORD ":" S\n%import common (WORD, WS)\n%import common.ESCAPED_STRING -> S\n%ignore WS',
     ['ab:"x"', 'ab : "x\\"y"', ' ab:""'], ['ab:"x', 'a:"\\"', '1:"x"']),
    ('start: x | y -> alias\nx.2: A\ny: "b"\n    | "c"\nA.3: "a"\n%ignore " "', ["a", " b ", "c"], ["ab", "d"]),
    ('start: "a"{2,} "b"{0,1} "c"{1}', ["aac", "aaaabc"], ["ac", "aabbc", "aab"]),
    # text that looks like the rewritten extensions, inside strings, regexes and comments, stays as it is
    ('start: "%json {" /[{]2}/ "{2}"  // %json {"type": "integer"} and x{2}', ['%json {{2}{2}'], ['%json {{{2}']),
    # a regex may hold raw newlines (as Lark lexes it; Qwen's XML format writes one): what follows them is
    # still the regex's, repetition braces included
    ('start: /x\n{2}/ "!"', ["x\n\n!"], ["x\n!", "x ~ 2..2!"]),
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
    # positions are in the text as written, after a %json block that spans lines was lifted out
    ('start: %json {"type":\n  "integer"} b\nb: "a"{3,1}', 3, "repetition bounds out of order"),
    ('start: %json {"type":\n  "integer"} b\nb: "ab".."c"', 3, "a range needs two single characters"),
    ("start: x\nx: \"a\"\nx: \"b\"", 3, "'x' is defined twice"),
    ('start: X\nX: y\ny: "a"', 2, "terminal X uses the rule 'y'"),
    ('start: X\nX: "a" %json {}', 2, "%json cannot appear inside a terminal"),
    ('start: X\n%declare X', 1, "terminal 'X' is declared but never defined"),
    # found by mutating grammars: a lowercase %declare is a rule with no definition (an AttributeError before)
    ('start: x\n%declare x', 1, "rule 'x' is declared but never defined"),
    ('start: X\n%import common.NOPE', 2, "Lark's common grammar has no NOPE"),
    ('start: "a"\n%ignore B', 2, "terminal 'B' is not defined"),
    ('start: _t{"a"}\n_t{x, y}: x y', None, "Wrong number of template arguments"),
    ('start: ["a"', 1, "'\\[' is never closed"),
    ("start: \"a\" %json {\"type\": 1", 1, "not closed"),
    ("start: \"a\"\n%import .grammar.X", 2, "only `%import common"),
    ("start: X\n%import common.sub.X", 2, "only `%import common"),
    # found by mutating grammars: Lark reads `%importmmon.` as an import of mmon, and its own error
    # report raises a TypeError on this text
    ("start: X\n%importmmon. common.X", 2, "only `%import common"),
    ('start: i\ni: "a" | ITEM\nITEM:" | ""c".."f" ~ 1 (sep..3', None, "Lark could not read it"),
])
def test_lark_errors(grammar, line, what):
    with pytest.raises(GrammarError, match=what) as e:
        STRICT_BYTE_COMPILER.compile_lark(grammar)
    if line is not None:
        assert f"line {line}," in str(e.value) and "^" in str(e.value)


def test_missing_start_rule():
    with pytest.raises(GrammarError, match="start"):
        BYTE_COMPILER.compile_lark('main: "a"')


def test_no_file_is_read_for_an_import(tmp_path, monkeypatch):
    """A grammar from a request must not read files: an import of anything but Lark's common grammar is
    refused before Lark would look for it (Lark opens a path relative to the working directory)."""
    (tmp_path / "secret.lark").write_text("X: \"leaked\"\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GrammarError, match="only `%import common"):
        BYTE_COMPILER.compile_lark("start: X\n%import secret.X")


def test_imports_are_read_once_and_never_shared():
    """common.lark is read once per import; a grammar that extends or builds on an imported terminal
    leaves it as it is for the next grammar."""
    extended = BYTE_COMPILER.compile_lark('start: INT\n%import common.INT\n%extend INT: "x"')
    assert_language(extended, ["12", "x"], ["a"], "extended")
    built_on = BYTE_COMPILER.compile_lark('start: B\nB: INT "y"\n%import common.INT')
    assert_language(built_on, ["12y"], ["12", "x", "xy"], "built on")
    plain = BYTE_COMPILER.compile_lark('start: INT "."\n%import common.INT')
    assert_language(plain, ["12."], ["x.", "12y."], "plain")


def test_positions_after_several_rewrites():
    """Line and column are the text's as written after two %json blocks spanning lines and a {m,n}
    were rewritten before the error."""
    text = 'start: %json {"type":\n "integer"} %json {"type":\n  "string"} "x"{2,3} b\nb: "y"  "ab".."c"'
    with pytest.raises(GrammarError, match="a range needs") as e:
        BYTE_COMPILER.compile_lark(text)
    assert "line 4, column 9:" in str(e.value) and str(e.value).endswith("\n" + " " * 10 + "^")


def test_nesting_past_the_parsers_reach_is_a_grammar_error():
    """Parentheses 2,000 deep overflow Lark's recursive tree walks: a GrammarError naming the fix,
    not a RecursionError (a server's 500)."""
    assert accepts(BYTE_COMPILER.compile_lark("start: " + "(" * 100 + '"a"' + ")" * 100), "a")
    with pytest.raises(GrammarError, match="nests too deeply"):
        BYTE_COMPILER.compile_lark("start: " + "(" * 2000 + '"a"' + ")" * 2000)


def test_templates_that_instantiate_without_end_are_refused():
    """Templates whose uses nest their own arguments deeper at each step make a new instance at each:
    refused once the nesting passes the parser's reach, in bounded memory (instances are numbered, not
    named by their arguments, whose spelling doubled its escapes at each level)."""
    with pytest.raises(GrammarError, match="nests too deeply"):
        BYTE_COMPILER.compile_lark('start: _t{"a"}\n_t{x}: x "b" | _w{x}\n_w{z}: _t{_w{z}}')
    same = BYTE_COMPILER.compile_lark('start: _l{"a"} _l{"a"} _l{"b"}\n_l{x}: x | x _l{x}')
    assert_language(same, ["aab", "aaaabb"], ["ab", "aabc"], "recursive template")


def test_lark_itself_imports_nothing_but_common():
    """The builder Lark is handed refuses any import but its common.lark (an import of another path
    opens a file relative to the working directory)."""
    from agentkv.grammar.lark.lower import _Builder, _ImportRefused

    for path, base in ((("secret",), None), (("common", "sub"), None), (("common",), "/tmp")):
        with pytest.raises(_ImportRefused):
            _Builder().do_import(path, base, {"X": "X"})
    _Builder().do_import(("common",), None, {"INT": "INT"})


SEEDS = [CALC, TOOL_CALL,
         'start: _sep{item, ","}\n_sep{x, sep}: x (sep x)*\nitem: "a" | "b"{2,3} | ITEM\nITEM: "c".."f" ~ 1..3',
         'start: x | y -> alias\nx.2: A\ny: "b"\n    | "c"\nA.3: "a"i\n%ignore " "\n%import common.INT']
PIECES = list('()[]{}|?*+~.:,"/%\\-> \n_aAx0') + ["%json", "%import", "%ignore", "%declare", "%override", "%extend",
                                                 "common.", "..", "->", "{2,}", "%pyjson {}"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.floats(0, 1), st.sampled_from(PIECES), st.booleans()),
                                        min_size=1, max_size=4))
def test_mutated_grammars_compile_or_say_why(seed, edits):
    """Whatever a request sends as grammar text, the answer is a compiled grammar or a GrammarError
    (a server's 400), never another exception (a 500)."""
    text = seed
    for where, piece, insert in edits:
        i = int(where * len(text))
        text = text[:i] + piece + text[i:] if insert else text[:i] + text[i + len(piece):]
    try:
        BYTE_COMPILER.compile_lark(text)
    except GrammarError:
        pass


def test_a_schema_cannot_be_ignored():
    """`%ignore %pyjson {}` (the mutation test found it): a GrammarError, not a KeyError."""
    with pytest.raises(GrammarError, match="%ignore` takes terminals"):
        BYTE_COMPILER.compile_lark('%ignore %pyjson {}\nstart: "a"\n')
