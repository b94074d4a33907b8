"""StructuralTag (chat/structural.py) without an engine: its grammar accepts free text and whole tags,
refuses a trigger that starts no tag, and the read-back checks each tag's JSON."""

import pytest

import agentkv as ak
from agentkv.chat.structural import StructuralTag
from tests.grammar_helpers import BYTE_COMPILER

UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
SPEC = {"triggers": ["<f="], "structures": [{"begin": "<f=a>", "schema": UNIQUE, "end": "</f>"},
                                           {"begin": "<f=b>", "schema": {"type": "boolean"}, "end": "</f>"}]}


def accepts(grammar, text: str) -> bool:
    from agentkv.grammar import Matcher

    m = Matcher(BYTE_COMPILER.compile_lark("start: answer\n" + grammar))
    return all(m.accept_token(b) for b in text.encode()) and m.can_terminate()


def test_the_grammar_frees_text_and_fixes_tags():
    g = StructuralTag.parse(SPEC).grammar()
    assert accepts(g, "plain text, < and <f and = alone") and accepts(g, "a <f=a>[1,2]</f> then <f=b>true</f>.")
    assert not accepts(g, "a <f=c>1</f>")  # the trigger starts no tag
    assert not accepts(g, "<f=b>1</f>")  # the tag's schema


def test_each_tag_is_checked_after_generation():
    tag = StructuralTag.parse(SPEC)
    tag.check("x <f=a>[1,2]</f> <f=b>false</f>")
    with pytest.raises(ak.OutputValidationError) as e:  # uniqueItems is not in the grammar: checked after
        tag.check("x <f=a>[1,1]</f>")
    assert e.value.keyword == "uniqueItems"
    # a tag that opens the reply is checked as one after text is (checked against a planted bug that
    # began the search after the reply's first character: this passed it)
    for opening in ("<f=a>[1,1]</f>", "<f=a>[1,1]</f> then text", "<f=b>true</f><f=a>[2,2]</f>"):
        with pytest.raises(ak.OutputValidationError) as e:
            tag.check(opening)
        assert e.value.keyword == "uniqueItems"
    tag.check("<f=a>[1,2]</f>")
    with pytest.raises(ak.RequestError, match="begin"):
        StructuralTag.parse({**SPEC, "structures": [{"begin": "<g>", "schema": True, "end": "</g>"}]})
