"""Masks against brute force over small vocabularies, on grammar shapes that once each had a walk of
their own: states whose characters go a few ways or many, open objects' names (and the text loop
shortcut there), literal text and trees of it, optional members, strings of bounded length. (Loops
over a class: test_grammar_loops.py; the trie: test_grammar_trie.py; the walk itself: test_grammar_token_walk.py.)"""

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from tests.grammar_helpers import (
    assert_mask_is_brute_force,
    masks_along_a_walk,
    masks_to_the_end,
)

pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: the native walk and the Python one


@pytest.mark.parametrize("pattern,inside", [("^[^b]*$", '"a'), ("^[^é]*$", '"a'), ("a1", '"0'), ("a1", '"xa1')])
def test_string_states_with_a_few_odd_characters(pattern, inside):
    # Most characters lead one way and a few another (no plain chain): the byte walk decides.
    words = [b"a", b"b", b"x", b"1", b"ab", b"xx", b"xb", b"x1a", b"aaaa", b"1xx", b"b1", b'x"', b'"', b"\\"]
    words += ["é".encode(), "xé".encode(), "éb".encode(), "é".encode()[:1], "é".encode()[1:]]  # multi-byte
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    m = Matcher(GrammarCompiler(info).compile_json_schema({"type": "string", "pattern": pattern}))
    assert m.accept_bytes(inside.encode())
    assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))


def test_plain_rest_longer_than_any_plain_token():
    # Here no plain token has more than one character, so a string body's chain shortcut stops at
    # one; a token that ends in a longer plain run (`{"{{`: a name starting "{{") still ends there.
    info = TokenizerInfo([bytes([c]) for c in b'{}":ab'] + [b'{"{{', b'{"ab"', None], eos_ids=[8])
    g = GrammarCompiler(info).compile_json_schema({"type": "object", "additionalProperties": {"type": "null"}})
    allowed = assert_mask_is_brute_force(Matcher(g), np.zeros((1, info.words), dtype=np.int32))
    assert {6, 7} <= allowed


WIDE = [  # (schema, text before the masks checked: where the first characters go many ways)
    ({"type": "object", "properties": {"ab": {"type": "integer"}, "x y": {"type": "null"}},
      "additionalProperties": {"type": "string"}}, '{"'),
    ({"type": "string", "pattern": "^[^b]"}, '"'),  # most first characters, then any text
    ({"type": "string", "pattern": "^[a-z0-9]"}, '"'),  # fewer than half of them
    ({"type": "string", "pattern": "^[a-z0-9_-]+$"}, '"'),  # all leading to one class loop
    ({"type": "object", "properties": {"ab": {"type": "integer"}}, "propertyNames": {"pattern": "^[a-z ]+$"}}, '{"'),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.text(alphabet=' abxyz019"{}:,é', min_size=2, max_size=5), min_size=10, max_size=60),
       which=st.sampled_from(range(len(WIDE))), rnd=st.randoms(use_true_random=False))
def test_many_first_characters(words, which, rnd):
    # Every printable ASCII character as a token: a property name or class then has many plain first
    # characters.
    cut = [w.encode()[:-1] for w in words if w.endswith("é")]  # a token ending inside a character
    vocab = list(dict.fromkeys([bytes([c]) for c in range(0x20, 0x7F)] + ["é".encode()] + [w.encode() for w in words]
                               + [w for w in cut if w]))
    info = TokenizerInfo(vocab + [None], eos_ids=[len(vocab)])
    schema, before = WIDE[which]
    m = Matcher(GrammarCompiler(info).compile_json_schema(schema))
    assert m.accept_bytes(before.encode())
    masks_along_a_walk(m, rnd, 8)


def test_names_of_an_open_object_take_every_prefix_of_plain_text_at_once():
    # Inside a name of an object that allows other names, plain text of any length stays a name: the
    # declared names' trie and the free part both read every character (the free part is a text
    # loop: its plain-text subtrees are allowed unwalked). A quote or backslash after plain text, a
    # stray continuation byte, a control character: walked.
    e = "é".encode()
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [e, e[:1], e[1:], b"na" + e[:1], b"nam", b"name", b'name"',
                                                      b'name":', b'x":', b'na\\', b"a\n", e + b'"', b"\t"]
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = GrammarCompiler(info).compile_json_schema(
        {"type": "object", "properties": {"name": {"type": "integer"}, "nb": {"type": "null"},
                                          "é1": {"type": "null"}}})
    m = Matcher(g)
    assert m.accept_bytes(b'{"')
    assert any(g.walk_tables.text_loop[s[-1]] for s in g.stacks(g.advance(m._cfg, b"x")))  # the free names
    allowed = assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    assert {words.index(w) for w in (e[:1], b"na" + e[:1], b'name":', b'x":')} <= allowed
    assert not {words.index(w) for w in (e[1:], b"a\n", b"\t")} & allowed
    assert m.accept_bytes(b"na")  # inside the trie: the same
    assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    # A name with a length limit is no text loop: plain text dies past it.
    g = GrammarCompiler(info).compile_json_schema({"type": "object", "propertyNames": {"maxLength": 3}})
    m = Matcher(g)
    assert m.accept_bytes(b'{"')
    assert not any(g.walk_tables.text_loop[s[-1]] for s in g.stacks(g.advance(m._cfg, b"x")))
    assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))


CLOSED_WORDS = [w.encode() for w in [
    '"', '\\', '":', '":"', '":{"', '":[', '": ', '":1', '",', '"}', '"],', '"]', '\\n', '\\"', '\\u00', '\\u00e9"',
    'x"', 'x":', 'x":"', 'x":{"', 'xy"', 'ab\\', 'ab\\n', 'ab\\nx"', 'na"', 'na":', 'name"', 'name":', 'name":1',
    'name":{"', 'nb":', 'x"}', '\u00e9"', '\u00e9":', 'a\n', '"\n', '\\x', 'name\\', 'x\\"', '"\u00e9']]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "integer"}, "nb": {"type": "null"}}},
    {"type": "object", "properties": {"name": {"type": "object"}}, "additionalProperties": {"type": "string"}},
    {"type": "array", "items": {"type": "string"}},
    {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}}},
])
def test_tokens_stopping_a_plain_text_closure(schema, seed):
    # From a string body or an open object's names, the tokens whose plain run stops at a quote or an
    # escape: stepped past that byte and the one after it from the state their run reaches (the
    # state itself where the run is empty; the free part where the first byte leads there), the
    # others walked (a declared name's prefix; a state past the stop byte that returns or calls).
    words = [bytes([c]) for c in range(0x20, 0x7F)] + ["é".encode()] + CLOSED_WORDS
    info = TokenizerInfo(list(dict.fromkeys(words)) + [None], eos_ids=[len(dict.fromkeys(words))])
    m = Matcher(GrammarCompiler(info).compile_json_schema(schema))
    masks_along_a_walk(m, random.Random(seed), 14)


@pytest.mark.parametrize("seed", range(6))
def test_literal_text_takes_the_tokens_inside_it_and_walks_those_past_it(seed):
    # From a state that reads one byte, then one again (a required name with its quotes and colon, a
    # keyword), the tokens that are a prefix of that text are looked up and those that run past it
    # walk on: into the value, out of the object, or past a name's end into the next name.
    words = [bytes([c]) for c in b'{}":,01aeklmnortu '] + [
        b'{"', b'{"na', b'{"name', b'{"name":', b'{"name":1', b'{"name":"', b'"name":tr', b'name":0,', b'":', b'":1',
        b'0,"', b'0,"ok":', b'0,"ok":t', b'1,"okay', b'tru', b'true', b'true}', b'true,"', b'fal', b'false}', b'nul',
        b'null', b'null}', b'"ok', b'ok":', b'ok":nu']
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = GrammarCompiler(info).compile_json_schema({
        "type": "object", "properties": {"name": {"type": "integer"}, "ok": {"type": ["boolean", "null"]}},
        "required": ["name", "ok"], "additionalProperties": False})
    seen = masks_to_the_end(Matcher(g), random.Random(seed))
    assert {words.index(w) for w in (b'{"name":1', b'0,"ok":t', b'true}')} & seen  # tokens past a literal


@pytest.mark.parametrize("seed", range(6))
def test_optional_members_commas_start_literal_text(seed):
    # Past SHARED_TAIL_AFTER optional properties, each member's tail is a rule: after a value, one
    # stack per property that may come next, each at a state that reads the comma and may also call
    # the next tail or return (a fork). From there the comma, the name and the colon are one literal.
    words = [bytes([c]) for c in b'{}":,0123abcdefnorstu'] + [
        b',"', b',"a', b',"ab', b',"ab":', b',"ab":1', b'1,"', b'1,"b', b'1,"bc":', b'0,"c":2', b'":', b'":3}',
        b'2}', b',"d', b',"de":', b'"e', b'e":', b'e":0,"f', b'f":1}', b'{"a', b'{"f":']
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    names = ["a", "ab", "bc", "c", "de", "e", "f"]
    g = GrammarCompiler(info).compile_json_schema({
        "type": "object", "properties": {n: {"type": "integer"} for n in names}, "additionalProperties": False})
    masks_to_the_end(Matcher(g), random.Random(seed))


TREE_WORDS = [bytes([c]) for c in b'{}":,0123abdegklmnoprtuyz'] + [
    b'{"', b'{"na', b'{"name', b'name":', b'me":1', b'med":', b'ed":2}', b'"nap', b'nap":', b'p":0,"', b'"ok',
    b'okay', b'ay":3', b'ok":', b'ze', b'zeta":"', b'"red"', b're', b'gr', b'green"', b'grey"}', b'ey', b'":"',
    b'"b', b'blue', b'ue"', b',"z', b'na', b'ta"']
TREE_SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "name": {"type": "integer"}, "named": {"type": "integer"}, "nap": {"type": "integer"}, "ok": {"type": "integer"},
    "okay": {"type": "integer"}, "zeta": {"enum": ["red", "green", "grey", "blue"]}}}


@pytest.mark.parametrize("seed", range(6))
def test_texts_branching_from_a_state(seed):
    # The names a strict object may write next, and listed string values, branch from one state into
    # literal texts; tokens run past a text's end into the value.
    info = TokenizerInfo(TREE_WORDS + [None], eos_ids=[len(TREE_WORDS)])
    g = GrammarCompiler(info).compile_json_schema(TREE_SCHEMA)
    masks_to_the_end(Matcher(g), random.Random(seed))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schema,start", [
    ({"type": "string", "maxLength": 24}, '"'), ({"type": "string", "minLength": 3, "maxLength": 31}, '"'),
    ({"type": "object", "properties": {"d": {"type": "string", "maxLength": 27}}, "required": ["d"],
      "additionalProperties": False}, '{"d":"'),
    ({"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2}, '["')])
def test_masks_along_a_long_string(schema, start, seed):
    # Along a string of at most N characters, up to the end, each mask is the brute-force one.
    words = [bytes([c]) for c in b'ab "\\nu0e9,[]{}d:'] + [
        b"ab", b"abab", b"abababa", b"ba b", b'b"', b'a"}', b'"]', b'",', b"\\n", b"a\\u00e9", b"\\u",
        "\u00e9".encode(), "a\u00e9b".encode(), "\u00e9".encode()[:1], "\u00e9".encode()[1:]]
    info = TokenizerInfo(list(dict.fromkeys(words)) + [None], eos_ids=[len(dict.fromkeys(words))])
    g = GrammarCompiler(info).compile_json_schema(schema)
    masks_to_the_end(Matcher(g), random.Random(seed))
    m = Matcher(g)
    assert m.accept_bytes(start.encode())
    for _ in range(6):  # positions 0, 2, .., 10: runs of shared walks start after a minLength too
        assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
        assert m.accept_bytes(b"ab")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 12},
                                    {"type": "object", "additionalProperties": {"type": "string", "maxLength": 9}}])
def test_tokens_with_a_plain_head_start_along_a_long_chain(schema, seed):
    # A string with a maximum length is a chain of states; a token that starts with plain text and
    # then has a quote, an escape or a cut character starts at the chain's state after that text.
    e = "é".encode()
    words = [bytes([c]) for c in b'{}":,abcx\\ '] + [
        e, b"abcdefghij", b"xxxxxxxxx", b"abc" + e, b'abcdefgh"', b'abc"', e + b'"', b'abcdefghijk"', b'ab\\n', b"a\n",
        b'abcdefghi\\u', e * 2 + e[:1], b'"', b'",', b'"}', b'{"ab":"', b'":"abcdefghij', b'x":"xx"}']
    info = TokenizerInfo(list(dict.fromkeys(words)) + [None], eos_ids=[len(dict.fromkeys(words))])
    m, rnd = Matcher(GrammarCompiler(info).compile_json_schema(schema)), random.Random(seed)
    masks_along_a_walk(m, rnd, 12)
