"""Matcher: masks equal a brute-force reference, accept/rollback/copy, EOS, errors, batched fill.
The token walk's shortcuts, each against the same reference: test_grammar_walk.py."""

import gc
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.errors import GrammarError
from agentkv.grammar import (
    GrammarCompiler,
    Matcher,
    TokenizerInfo,
    fill_next_token_bitmasks,
)
from tests.grammar_helpers import ALPHABET, BYTE_INFO, accepts, assert_mask_is_brute_force, compile_one, vocabularies

GRAMMARS = [
    ("schema", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
                "items": {"type": "string", "maxLength": 2}}}, "required": ["a"]}),
    ("schema", {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}},
                "$ref": "#/$defs/t"}),
    ("schema", {"anyOf": [{"type": "boolean"}, {"type": "object", "additionalProperties": {"type": "null"}}]}),
    ("schema", True),
    # Strings where most characters go one way and a few another (dead, or watching for a match).
    ("schema", {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[^b]*$"},
                                                 "t": {"type": "string", "pattern": "a1"}}}),
    ("regex", r"(ab|a)*b{1,3}"),
    # Plain characters going different ways, multi-byte ones all one way or not.
    ("regex", r'"(a|[^\x00-\x7F])b?"'),
    ("regex", r'"(a|é)[ab]?"'),
    ("regex", r'"[ab]*"(,"[01]+")?'),
]


pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: the native walk and the Python one


@settings(max_examples=60, deadline=None)
@given(vocabularies(), st.sampled_from(range(len(GRAMMARS))), st.randoms(use_true_random=False))
def test_masks_equal_brute_force(info, which, rnd):
    g = compile_one(GrammarCompiler(info), *GRAMMARS[which])
    m = Matcher(g)
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    for _ in range(25):
        expected = assert_mask_is_brute_force(m, bitmask)
        if not expected:
            break
        choice = rnd.choice(sorted(expected))
        assert m.accept_token(choice)
        if m.is_terminated():
            break


def test_a_rule_in_two_grammars():
    # The same pattern and the same string rule in two schemas, placed differently; and the
    # unconstrained JSON value (a rule calling only itself) in two: masks equal brute force in both.
    rnd = random.Random(0)
    words = [bytes(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 4))) for _ in range(80)]
    info = TokenizerInfo(list(dict.fromkeys([bytes([c]) for c in ALPHABET] + words)) + [None], eos_ids=[])
    info = TokenizerInfo(info.vocab, eos_ids=[len(info.vocab) - 1])
    pattern = {"type": "string", "pattern": "^[ab]*1"}
    first = {"type": "object", "properties": {"a": pattern, "b": {"type": "string"}}, "required": ["a", "b"]}
    second = {"type": "array", "items": pattern, "maxItems": 4}
    cases = [(info, first, '{"a":"ab1","b":"0"}'), (info, second, '["ab1","1","ba1"]'), (info, second, '[]')]
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [
        b'{"', b'":', b'":{"', b'":[', b'},"', b'"}', b'[{', b'tr', b'ue', b'12', b'.5', b'null', b'"a']
    json_info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    cases += [(json_info, {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False},
               '{"a":{"b":[1,true,null],"c":"d"}}'),
              (json_info, {"type": "array", "items": True, "maxItems": 3}, '[{"a":[]},"b",2.5]')]
    compilers = {id(i): GrammarCompiler(i) for i in (info, json_info)}
    for tok_info, schema, text in cases:
        m = Matcher(compilers[id(tok_info)].compile_json_schema(schema))
        bitmask = np.zeros((1, tok_info.words), dtype=np.int32)
        for b in text.encode():
            assert_mask_is_brute_force(m, bitmask)
            assert m.accept_token(tok_info.vocab.index(bytes([b])))
        assert_mask_is_brute_force(m, bitmask)
        assert m.is_terminated() or m.can_terminate()


def test_schemas_apart_only_in_property_order_keep_their_own_orders():
    # Members are written in the order the schema declares them (a Pydantic model's field order), so
    # a schema that declares them in another order is another grammar, at the compiler's cache and
    # at the converter's rules shared by equal sub-schemas alike.
    def obj(*names):
        return {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": sorted(names)}

    compiler = GrammarCompiler(BYTE_INFO)
    for names in (("a", "b"), ("b", "a")):
        g = compiler.compile_json_schema(obj(*names))
        assert accepts(g, '{"%s":1,"%s":2}' % names) and not accepts(g, '{"%s":1,"%s":2}' % names[::-1])
    nested = {"type": "object", "properties": {"x": obj("a", "b"), "y": obj("b", "a")}, "required": ["x", "y"]}
    g = compiler.compile_json_schema(nested)
    assert accepts(g, '{"x":{"a":1,"b":2},"y":{"b":3,"a":4}}')
    assert not accepts(g, '{"x":{"a":1,"b":2},"y":{"a":3,"b":4}}')


def test_rules_that_call_others_keep_their_walks_to_their_grammar():
    # Two schemas whose root rules read alike but call differently defined rules of the same name
    # (the value at /properties/a): no walk of the first may stand in for the second's.
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [b'":', b'":"', b'":1', b'1}', b'"}']
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    compiler = GrammarCompiler(info)
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    for value, text in (({"type": "string"}, '{"a":"1"}'), ({"type": "integer"}, '{"a":1}')):
        m = Matcher(compiler.compile_json_schema(
            {"type": "object", "properties": {"a": value}, "required": ["a"], "additionalProperties": False}))
        for b in text.encode():
            assert_mask_is_brute_force(m, bitmask)
            assert m.accept_token(info.vocab.index(bytes([b])))
        assert m.can_terminate()


def test_accept_rollback_copy_and_eos():
    info = TokenizerInfo([bytes([c]) for c in ALPHABET] + [b"ab", None], eos_ids=[len(ALPHABET) + 1])
    eos = len(ALPHABET) + 1
    g = GrammarCompiler(info).compile_regex(r"(ab)+")
    m = Matcher(g)
    tok = {info.vocab[i]: i for i in range(len(ALPHABET) + 1)}
    assert not m.accept_token(eos) and not m.accept_token(tok[b"b"])
    assert m.accept_token(tok[b"ab"]) and m.can_terminate()
    fork = m.copy()
    assert m.accept_token(tok[b"a"]) and not m.can_terminate()
    assert fork.can_terminate()  # the copy did not move
    m.rollback(1)
    assert m.can_terminate() and m.accept_token(eos) and m.is_terminated()
    assert not m.accept_token(tok[b"a"])
    m.rollback(2)
    assert not m.is_terminated() and m.accept_token(tok[b"a"])
    with pytest.raises(GrammarError, match="roll back"):
        m.rollback(5)
    assert not m.accept_tokens([tok[b"b"], tok[b"{"]])
    assert m.accept_tokens([tok[b"b"], tok[b"ab"]])


def test_batched_fill_and_terminated_rows():
    info = TokenizerInfo([b"a", b"b", None], eos_ids=[2])
    g = GrammarCompiler(info).compile_regex("ab")
    m1, m2 = Matcher(g), Matcher(g)
    m2.accept_token(0)
    bitmask = np.full((3, info.words), -1, dtype=np.int32)
    fill_next_token_bitmasks([m1, m2, None], bitmask)
    assert bitmask[0, 0] == 0b001 and bitmask[1, 0] == 0b010 and bitmask[2, 0] == -1
    m2.accept_token(1)
    m2.accept_token(2)
    m2.fill_next_token_bitmask(bitmask, 1)
    assert bitmask[1, 0] == 0
    with pytest.raises(GrammarError, match="int32"):
        m1.fill_next_token_bitmask(np.zeros((1, 1), dtype=np.int64))


def test_special_tokens_never_match_text():
    info = TokenizerInfo([b"a", None, b"<|im_end|>"], eos_ids=[1])
    m = Matcher(GrammarCompiler(info).compile_regex(r"[a<|>_imend]*"))
    allowed = set(m.allowed_token_ids().tolist())
    assert 0 in allowed and 1 in allowed  # EOS: the empty string is complete
    assert 2 in allowed  # a plain-text token spelling a special name is text, not special


def test_tokens_past_a_text_are_the_tries():
    # The tokens running past a text (jump-forward's boundary check): neither twin of the text itself
    info = TokenizerInfo([b"a", b"ab", None, b"abc", b"ab", b"b"], eos_ids=[2])  # "ab" twice
    assert info.trie.tokens_past(b"ab").tolist() == [3]
    assert sorted(info.trie.tokens_past(b"a").tolist()) == [1, 3, 4]
    assert info.trie.tokens_past(b"c").tolist() == [] and len(info.trie.tokens_past(b"")) == 5


@settings(max_examples=60, deadline=None)
@given(vocabularies(), st.lists(st.binary(min_size=0, max_size=8), min_size=1, max_size=6))
def test_tokens_past_match_their_definition(info, raw):
    texts = [bytes(ALPHABET[x % len(ALPHABET)] for x in r) for r in raw]
    vocab = [(t, b) for t, b in enumerate(info.vocab) if b]
    for text in texts:
        assert sorted(info.trie.tokens_past(text).tolist()) == sorted(
            t for t, b in vocab if b.startswith(text) and len(b) > len(text))


def test_deep_recursion_is_exact():
    info = TokenizerInfo([b"[", b"]", b"[]", b"[[", None], eos_ids=[4])
    g = GrammarCompiler(info).compile_json_schema(
        {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"})
    m = Matcher(g)
    depth = 60  # far past any unrolling depth
    assert all(m.accept_token(3) for _ in range(depth // 2))
    assert not m.can_terminate()
    assert all(m.accept_token(1) for _ in range(depth - 1))
    assert not m.can_terminate() and not m.accept_token(4)
    assert m.accept_token(1) and m.can_terminate()
    assert not m.accept_token(1)


def test_mask_cache_is_bounded(monkeypatch):
    import agentkv.grammar.compiled as compiled

    monkeypatch.setattr(compiled, "MAX_CACHED_MASKS", 2)
    info = TokenizerInfo([b"a", b"b", None], eos_ids=[2])
    g = GrammarCompiler(info).compile_regex("abab")
    m = Matcher(g)
    for tok in (0, 1, 0, 1):
        first = m.allowed_token_ids().tolist()
        assert first == m.allowed_token_ids().tolist() == [tok]
        assert g.cache_info()["masks"] <= 2
        m.accept_token(tok)
    assert m.allowed_token_ids().tolist() == [2]
    assert g.cache_info()["mask_evictions"] == 3 and g.cache_info()["mask_bytes"] == 2 * info.words * 4


def test_grammar_caches_count_what_they_evict(monkeypatch):
    from agentkv.grammar.automata import dfa

    info = TokenizerInfo([b"a", b"b", None], eos_ids=[2])
    compiler = GrammarCompiler(info, cache_size=1)
    before = dfa.cache_info()["dfa_evictions"]
    monkeypatch.setattr(dfa, "MAX_CACHED_DFA_BYTES", 1)  # every automaton kept pushes the last one out
    for pattern in ("a+b", "b+a", "(ab)+"):
        Matcher(compiler.compile_regex(pattern)).allowed_token_ids()
    info_ = compiler.cache_info()
    assert info_["grammars"] == 1 and info_["grammars_evicted"] == 2 and info_["masks"] == 1
    assert info_["dfa_evictions"] > before and info_["dfas"] == 1


def test_grammars_share_one_byte_budget():
    info = TokenizerInfo([b"a", b"b", None], eos_ids=[2])
    one = GrammarCompiler(info).compile_regex("a+b")
    budget = one.cache_bytes() * 2 + 1  # room for two grammars like these, not three
    compiler = GrammarCompiler(info, cache_bytes=budget)
    grammars = [compiler.compile_regex(p) for p in ("a+b", "b+a", "(ab)+")]
    assert compiler.cache_size() == 2 and compiler.cache_info()["grammars_evicted"] == 1
    assert compiler.compile_regex("b+a") is grammars[1]  # the newest two stay; the oldest went
    # Caches grow with use: masks count against the budget too, checked as grammars are looked up.
    for g in grammars[1:]:
        Matcher(g).allowed_token_ids()
    import agentkv.grammar.compiler as compiler_mod
    for _ in range(compiler_mod.BUDGET_CHECK_EVERY):
        compiler.compile_regex("(ab)+")
    assert compiler.cache_size() == 1 and compiler.cache_info()["grammars_evicted"] == 2


NESTED = 'start: v\nv: "[" [v ("," v)*] "]" | "1"'
NESTED_TOKENS = [b"[", b"]", b",", b"1", b"[[", None]
NESTED_TEXT = [4, 0, 3, 2, 0, 3, 2, 4, 3, 1, 1, 1, 2, 3, 1, 1, 1, 5]  # [[[1,[1,[[1]]],1]]], then EOS


def masks_along(m: Matcher, tokens) -> list[list[int]]:
    out = []
    for t in tokens:
        out.append(m.allowed_token_ids().tolist())
        assert m.accept_token(t)
    return out


def test_a_grammar_whose_tables_outgrow_their_bound_is_renewed(monkeypatch):
    """Configurations, steps and forced text count in a grammar's bytes; past MAX_TABLE_BYTES the
    compiler hands out the grammar renewed (empty tables, the same walks), while the matchers of the
    old one go on in it. Masks are the same in both, and the same as a grammar never renewed."""
    import agentkv.grammar.compiler as compiler_mod

    info = TokenizerInfo(NESTED_TOKENS, eos_ids=[5])
    reference = masks_along(Matcher(GrammarCompiler(info).compile_lark(NESTED)), NESTED_TEXT)
    compiler = GrammarCompiler(info)
    g = compiler.compile_lark(NESTED)
    old = Matcher(g)
    assert masks_along(old, NESTED_TEXT[:8]) == reference[:8]
    before = g.table_bytes()
    assert g.step(g.initial, ord("x")) == -1 and g.table_bytes() > before  # a step to nowhere is kept too
    assert g.cache_bytes() >= g.automaton.trans.nbytes + g.table_bytes()
    assert compiler.compile_lark(NESTED) is g  # within the bound
    monkeypatch.setattr(compiler_mod, "MAX_TABLE_BYTES", g.table_bytes() - 1)
    fresh = compiler.compile_lark(NESTED)
    assert fresh is not g and fresh.table_bytes() < g.table_bytes() and fresh.cache_info()["masks"] == 0
    assert compiler.compile_lark(NESTED) is fresh and compiler.cache_info()["grammars_renewed"] == 1
    assert masks_along(old, NESTED_TEXT[8:]) == reference[8:]  # the old grammar serves its matcher on
    assert masks_along(Matcher(fresh), NESTED_TEXT) == reference
    assert fresh.walk_tables is g.walk_tables  # the token walks are per automaton state: kept,
    assert fresh._lock is g._lock  # and guarded by one lock (the native walk cache is not thread-safe)


def test_accept_tokens_longer_than_rollback_window_is_all_or_nothing():
    info = TokenizerInfo([b"a", b"b", None], eos_ids=[2])
    m = Matcher(GrammarCompiler(info).compile_regex("a*"), max_rollback=4)
    assert m.accept_token(0)
    assert not m.accept_tokens([0] * 10 + [1])
    assert m.can_terminate() and m.accept_tokens([0] * 10)
    m.rollback(4)


def test_a_compile_frees_what_it_built_without_the_collector():
    """The compiler pauses Python's cyclic collector while it compiles, so what a compile builds and
    drops must go by reference counting alone: a reference cycle (a recursive closure holding its
    scope: the converter, the expressions, the encoded rules) waits for a collection, which then
    scans all of it (~18,000 objects a SchemaStore compile)."""

    info = TokenizerInfo([bytes([c]) for c in range(0x20, 0x7F)] + [None], eos_ids=[95])
    schema = {"type": "object", "properties": {
        "a": {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 1,
              "items": {"type": "object", "properties": {"b": {"type": "string", "pattern": "^x+$"}},
                        "required": ["b"]}},
        "c": {"$ref": "#/$defs/c"}}, "minProperties": 1,
        "$defs": {"c": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/c"}}]}}}
    compiler = GrammarCompiler(info)
    compiler.compile_json_schema(schema)  # (first uses: libraries' own caches, some built with cycles)
    other = json.loads(json.dumps(schema).replace("x+", "y+").replace('"b"', '"d"'))
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        compiler.compile_json_schema(other)
        compiler.compile_lark('start: "a" x\nx: /[0-9]+/ ("," /[0-9]+/)*\n')
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()
