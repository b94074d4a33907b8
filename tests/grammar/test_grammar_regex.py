"""Regexes: accept/refuse tables, agreement with Python's `re` on a shared dialect, clear errors."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.errors import GrammarError
from tests.grammar_helpers import BYTE_COMPILER, STRICT_BYTE_COMPILER, accepts, assert_language

TABLE = [
    (r"abc", ["abc"], ["ab", "abcd", ""]),
    (r"a|bc|", ["a", "bc", ""], ["b", "abc"]),
    (r"[a-c]+x?", ["a", "cab", "abx"], ["", "x", "ad"]),
    (r"[^a-c]", ["d", "é", "\n", "😀"], ["a", "", "dd"]),
    (r"\d{2,3}", ["12", "123"], ["1", "1234", "ab"]),
    (r"\d{2,}", ["12", "12345"], ["1"]),
    (r"a{3}", ["aaa"], ["aa", "aaaa"]),
    (r"(ab)*c", ["c", "abc", "ababc"], ["ac", "abab"]),
    (r"(?:x|y)+?", ["x", "xyx"], [""]),
    (r"(?P<n>a)(?<m>b)", ["ab"], ["a"]),
    (r"\w+\s\W", ["ab_9 !"], ["ab !!", "ab a"]),
    (r".", ["a", "é", "😀"], ["\n", "\r", "ab"]),
    (r"\x41\u00e9\u{1F600}", ["Aé😀"], ["A"]),
    (r"[\d.-]+", ["1.-2"], ["a"]),
    (r"[]a]", ["]", "a"], ["b"]),
    (r"^ab$", ["ab"], ["xab"]),
    (r"\.\*\+\?\(\)\[\]\{\}\|\\\/", [r".*+?()[]{}|\/"], ["a"]),
    (r"[α-ω]+", ["αβω"], ["a", "Α"]),
    (r"a{,2}", ["a{,2}"], ["a", "aa"]),  # not a quantifier in ECMA or Python: literal text
]


@pytest.mark.parametrize("pattern,good,bad", TABLE)
def test_regex_table(pattern, good, bad):
    assert_language(BYTE_COMPILER.compile_regex(pattern), good, bad, pattern)


@pytest.mark.parametrize("pattern,what", [
    (r"(?=a)b", "lookaround"),
    (r"^(?!a)b", "lookaround"),  # a whole-match regex (Lark terminal): its lookahead may read past the token
    (r"(a)\1", "backreference"),
    (r"\bword", "word boundary"),
    (r"\p{L}", "Unicode property"),
    (r"a(b", "')'"),
    (r"a)b", "')'"),
    (r"*a", "nothing to repeat"),
    (r"a{3,1}", "below its minimum"),
    (r"a^b", "anchor"),
])
def test_regex_errors_name_the_problem(pattern, what):
    with pytest.raises(GrammarError, match=re.escape(what)):
        BYTE_COMPILER.compile_regex(pattern)


ATOMS = ["a", "b", "[ab]", "[^a]", "\\d", ".", "(a|b)", "(ab)", "c"]


@st.composite
def patterns(draw, depth=0):
    kind = draw(st.integers(0, 3 if depth < 3 else 0))
    if kind == 0:
        return draw(st.sampled_from(ATOMS))
    if kind == 1:
        return draw(patterns(depth + 1)) + draw(patterns(depth + 1))
    if kind == 2:
        return f"(?:{draw(patterns(depth + 1))}|{draw(patterns(depth + 1))})"
    inner = draw(patterns(depth + 1))
    q = draw(st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,}"]))
    return f"(?:{inner}){q}"


@settings(max_examples=150, deadline=None)
@given(patterns(), st.lists(st.text(alphabet="abc1\n", max_size=6), min_size=5, max_size=5))
def test_regex_agrees_with_python_re(pattern, samples):
    g = BYTE_COMPILER.compile_regex(pattern)
    rx = re.compile(pattern, re.DOTALL if False else 0)
    for s in samples:
        assert accepts(g, s) == bool(rx.fullmatch(s)), (pattern, s)


# JSON Schema patterns (search semantics) with lookaheads right after a leading '^', from SchemaStore.
LOOKAHEAD_TABLE = [
    (r"^(?!@@)[\w@]+$", ["@a", "a@@", "ab"], ["@@a", "@@", "a b"]),
    (r"^(?!(?:meta|local)$).*$", ["metal", "x", "", "local "], ["meta", "local"]),
    (r"^(?!\.)(?!\./).+", ["a", "a./"], [".", "./a", ""]),
    (r"^(?!^lucene\.|builtin\.|mongodb\.).*", ["xbuiltin.", "mongodb", "lucene"], ["lucene.x", "builtin."]),
    (r"^(?=a)..$", ["ab", "aa"], ["ba", "a", "abc"]),
    (r"^(?![ \t\n]*\(default(.*)\))[\s\S]*", ["x(default)", "(default"], [" (default x)", "(default)"]),
    (r"^(?!a)b|^a", ["b", "a", "ab"], ["c", ""]),  # per branch
]


@pytest.mark.parametrize("pattern,good,bad", LOOKAHEAD_TABLE)
def test_pattern_lookahead_at_start(pattern, good, bad):
    g = BYTE_COMPILER.compile_json_schema({"type": "string", "pattern": pattern})
    for s in good:
        assert re.search(pattern, s) and accepts(g, json.dumps(s)), (pattern, s)
    for s in bad:
        assert not re.search(pattern, s) and not accepts(g, json.dumps(s)), (pattern, s)


@pytest.mark.parametrize("pattern", [r"a(?!b)", r"(?!b)a", r"^a(?!b)", r"^(?<!b)a", r"^((?!b)a)", r"^(?:(?!b))a",
                                     r"^(?!(?!a)b)c"])
def test_pattern_lookaround_elsewhere_is_refused(pattern):
    with pytest.raises(GrammarError, match="lookaround"):
        STRICT_BYTE_COMPILER.compile_json_schema({"type": "string", "pattern": pattern})
    relaxed = BYTE_COMPILER.compile_json_schema({"type": "string", "pattern": pattern}).relaxed
    assert [(r.pointer, r.keyword, r.checked) for r in relaxed] == [("#/pattern", "pattern", True)]


@settings(max_examples=100, deadline=None)
@given(patterns(), patterns(), st.booleans(), st.booleans(),
       st.lists(st.text(alphabet="abc1\n", max_size=6), min_size=6, max_size=6))
def test_pattern_lookahead_agrees_with_python_re(look, rest, negative, anchored_end, samples):
    pattern = f"^(?{'!' if negative else '='}{look}){rest}" + ("$" if anchored_end else "")
    try:
        g = BYTE_COMPILER.compile_json_schema({"type": "string", "pattern": pattern})
    except GrammarError as e:  # `^(?!a)a`: no string at all, so none of the samples either
        assert "accepts no string" in str(e), (pattern, e)
        g = None
    for s in samples:
        if anchored_end and s.endswith("\n"):
            continue  # Python's '$' also matches before a final newline; ECMA-262's does not
        assert (g is not None and accepts(g, json.dumps(s))) == bool(re.search(pattern, s)), (pattern, s)
