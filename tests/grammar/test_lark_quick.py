"""lark/quick.py reads the common subset of Lark's grammar text without Lark: where it reads a text,
Lark reads it too and lowering gives the same rules and terminals; where Lark refuses a text, it
declines (Lark then words the error). Over the Lark tests' grammars, every tool format's heads and
parts (which it must read: they are what a step with many tools compiles), and random texts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.chat.calls import FunctionSpec
from agentkv.chat.formats import FORMATS
from agentkv.errors import GrammarError, RequestError
from agentkv.grammar.composed import ComposedGrammar
from agentkv.grammar.lark import lower, quick
from agentkv.grammar.lark.quick import quick_definitions
from tests.grammar.test_composed import TOOLS
from tests.grammar.test_grammar_lark import CALC, TABLE, TOOL_CALL

ERRORS = ["start: a\na: b", 'start: X\nX: X "a"', 'start: "a" ("b"', 'start: X\nX: a\na: "b"', 'start: "a"\nstart: "b"',
          "start: A\n%declare A", 'start: "a"\n%ignore " "', 'start: "a" "b"??', 'start: "a"~', "start: a{x}"]


def _read(text: str):
    """(quick's reading or None, Lark's reading or its error): each (rules, terminals)."""
    g = lower._Grammar(text, None)
    quick = quick_definitions(g.src.text, g)
    try:
        lark = lower._Grammar(text, None)
        saved, lower.QUICK = lower.QUICK, False
        try:
            lark.load()
        finally:
            lower.QUICK = saved
        return quick, (lark.rules, lark.terminals)
    except GrammarError as e:
        return quick, e


def _agree(text: str) -> bool:
    """quick's reading is Lark's wherever it gives one; whether it gave one."""
    quick, lark = _read(text)
    if quick is None:
        return False
    assert not isinstance(lark, GrammarError), f"quick read a text Lark refuses ({lark}):\n{text}"
    assert quick == lark, text
    return True


def _format_texts() -> list[str]:
    out = []
    for cls in FORMATS.values():
        fmt = cls()
        for mode in ("auto", "required"):
            g = fmt.grammar(TOOLS, mode, None)
            if isinstance(g, ComposedGrammar):
                out += [g.text + f"\n{g.rule}: \"composed\"\n", *g.parts]
            elif g is not None:
                out.append(g)
    return out


@pytest.mark.parametrize("text", [CALC, TOOL_CALL, *(t[0] for t in TABLE), *ERRORS])
def test_the_lark_tests_grammars_read_alike(text):
    _agree(text)


def test_every_formats_parts_are_read_quickly_and_alike():
    texts = _format_texts()
    assert len(texts) > 40
    quick = [_agree(t) for t in texts]
    parts = [t for cls in FORMATS.values() for t in [cls().call_part(TOOLS[0], True)]]
    assert all(_agree(t) for t in parts), "a format's part goes through Lark (a step of many tools pays for it)"
    assert sum(quick) > len(texts) // 2


PIECES = ['"a"', '"b"i', '"\\""', '/[a-c]+/', "/x/s", "/(/", "a", "b", "_c", "X", "Y", "(", ")", "[", "]", "?", "*",
          "+", "~ 2", "~ 1..3", "~ 3..1", "|", "\n    |", "-> al", '"a".."c"', '"ab".."c"', "// c", "{", "%ignore",
          "\n", ".", "!", "?a"]


@given(st.lists(st.tuples(st.sampled_from(["start", "a", "b", "_c", "X", "Y"]),
                          st.lists(st.sampled_from(PIECES), max_size=8)), min_size=1, max_size=4),
       st.booleans())
@settings(max_examples=400, deadline=None)
def test_random_texts_are_read_alike_or_left_to_lark(defs, declare):
    text = "\n".join(f"{name}: {' '.join(body)}" for name, body in defs)
    if declare:
        text += "\n%declare Y"
    try:
        _agree(text)
    except GrammarError:
        pass  # (Source's own errors, before either reads the text)


def test_a_planted_difference_is_seen(monkeypatch):
    """The comparison sees a reading that differs from Lark's (here: quick reads `?` as `*`)."""
    expr = quick._Reader.expr

    def wrong(self, used):
        out = expr(self, used)
        return ("rep", out[1], 0, None) if out[0] == "rep" and out[2:] == (0, 1) else out

    monkeypatch.setattr(quick._Reader, "expr", wrong)
    with pytest.raises(AssertionError):
        _agree('start: "a"? "b"')


def test_a_tool_with_any_schema_is_read_alike():
    tool = FunctionSpec("odd", {"type": "object", "properties": {"q": {"type": "string", "pattern": "^a/b$"},
                                                                 "r": {"enum": ['x"y', "a\\b"]}}})
    for cls in FORMATS.values():
        try:
            part = cls().call_part(tool, True)
        except RequestError:
            continue  # (a format that cannot write such a schema says so)
        assert _agree(part)
