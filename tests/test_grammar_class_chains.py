"""Character-class chains (class_chains.py): masks from a counted repetition of a class against
brute force, the chains against their definition, and each token's head of class bytes against its
bytes."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from agentkv.grammar.class_chains import class_chain, class_heads, find_class_chain
from agentkv.grammar.token_tables import ASCII_PLAIN
from tests.grammar_helpers import assert_mask_is_brute_force, compile_one, masks_along_a_walk, vocabularies

pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: vectorized and one-token walks

E = "é".encode()
# Class-only tokens of every length past the chains below (and past 8 and 16, the head count's
# steps), each also with a quote, a character outside the classes, or a character of two bytes
# after it; class bytes after a first byte outside the class.
WORDS = [bytes([c]) for c in range(0x20, 0x7F)] + [E] + [
    w for n in (2, 3, 5, 6, 7, 8, 9, 15, 16, 17, 21) for w in
    (b"ab0-x"[:1] * n, b"a1" * (n // 2) + b"b" * (n % 2), b"c" * n + b'"', b"b" * n + b"Z", b"a" * n + E, b"x" * n)] + [
    b'"ab', b'"', b'",', b'"}', b"Zab", b"-ab", b"ab-", b"a_b", b"ab\\n", b"ab\n", E + b"ab", b"abcabc1", b"abc123"]


def fresh_info() -> TokenizerInfo:
    """(Per test: walks of a rule that calls none are shared through the tokenizer, `rule_walks`.)"""
    return TokenizerInfo(list(dict.fromkeys(WORDS)) + [None], eos_ids=[len(dict.fromkeys(WORDS))])


@pytest.mark.parametrize("kind,source,inside", [
    ("schema", {"type": "string", "pattern": "^[a-c0-9-]{1,6}$"}, '"'),  # the chain ends dead, then a quote
    ("schema", {"type": "string", "pattern": "^[a-c0-9-]{1,6}$"}, '"ab'),  # a later position on it
    ("schema", {"type": "string", "pattern": "^[a-c0-9-]{1,12}$"}, '"a'),  # longer than some class tokens
    ("schema", {"type": "string", "pattern": "^[a-c]{3,}x$"}, '"'),  # a chain, then a loop on the class
    ("schema", {"type": "string", "pattern": "^[a-c]{4,}$"}, '"b'),
    ("schema", {"type": "string", "pattern": "^[a-c]{2}[0-9]+$"}, '"'),  # then another class
    ("schema", {"type": "string", "pattern": "^([a-c]{3})+$"}, '"'),  # a cycle of the class
    ("schema", {"type": "object", "propertyNames": {"pattern": "^[a-c_]{2,5}$"},
                "additionalProperties": {"type": "integer"}}, '{"'),
    ("regex", "[ab]{2,5}1?", ""),  # the chain's later states may end the text: forks
    ("regex", "-[ab]{2,5}1?", "-"),
    # The rule returns after each class byte: every state after the first forks, so no chain.
    ("lark", 'start: w "Z"\nw: /[a-c0-9]{1,7}/', ""),
])
@pytest.mark.parametrize("seed", range(2))
def test_masks_along_a_class_chain(kind, source, inside, seed):
    compiler = GrammarCompiler(fresh_info())
    g = compiler.compile_lark(source) if kind == "lark" else compile_one(compiler, kind, source)
    m = Matcher(g)
    assert m.accept_bytes(inside.encode())
    masks_along_a_walk(m, random.Random(seed), 8)
    assert any(c is not None for c in g._class_chains.values()) == (kind != "lark")  # the route was taken


def test_a_class_chain_takes_whole_heads_and_walks_the_rest():
    # From `[a-c0-9-]{1,6}`'s first state: class tokens of up to 6 bytes end on the chain, longer ones
    # die; a quote after 1..6 class bytes ends the string; another byte after the head dies.
    info = fresh_info()
    g = GrammarCompiler(info).compile_json_schema({"type": "string", "pattern": "^[a-c0-9-]{1,6}$"})
    m = Matcher(g)
    assert m.accept_bytes(b'"')
    allowed = {info.vocab[t] for t in assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))}
    assert {b"a" * 6, b"c" * 5 + b'"', b"a1a1a1"} <= allowed
    assert not {b"a" * 7, b"c" * 7 + b'"', b"b" * 2 + b"Z", b"ab-" + b"x", b"a" * 2 + E} & allowed


@pytest.mark.parametrize("source", [
    {"type": "string", "pattern": "^[a-c0-9-]{1,20}$"}, {"type": "string", "pattern": "^[a-c]{3,}x$"},
    {"type": "string", "pattern": "^([a-c]{3})+$"}, {"type": "string", "pattern": "^[a-c]{2}[0-9]+$"},
    {"type": "string", "pattern": "^[a-z]{200}$"},  # longer than the longest token: cut there
    {"type": "object", "propertyNames": {"pattern": "^[a-c_]{2,5}$"}}, "regex:[ab]{2,5}1?",
])
def test_class_chains_follow_their_definition(source):
    # Every state's chain, asked in either order (a chain fills in the states along it), against the
    # definition: the class is the plain ASCII bytes the state reads, all leading to the chain's first
    # state and from each state to the next; no state but the last calls or returns; the end says what
    # the last state does with a class byte.
    info = TokenizerInfo([bytes([c]) for c in range(0x20, 0x7F)] + [b"a" * 40, None], eos_ids=[96])
    for order in (1, -1):
        compiler = GrammarCompiler(info)
        g = compiler.compile_regex(source[6:]) if isinstance(source, str) else compiler.compile_json_schema(source)
        trans = g.automaton.trans
        for q in range(g.num_states)[::order]:
            hit = class_chain(g, q)
            fresh = find_class_chain(trans, g.fork_states, q, len(info.bytes_at))
            assert (hit is None) == (fresh is None), (source, q)
            if hit is None:
                continue
            cb, chain, end = hit
            assert cb.tolist() == ASCII_PLAIN[trans[q, ASCII_PLAIN] >= 0].tolist()
            assert 2 <= len(chain) <= len(info.bytes_at)
            for s, t in zip([q, *chain[:-1].tolist()], chain.tolist()):
                assert (trans[s, cb] == t).all()
            assert not g.fork_states[chain[:-1]].any()
            last = trans[chain[-1], cb]
            assert end != "loop" or (last == chain[-1]).all()
            assert end != "dead" or (last < 0).all()


@settings(max_examples=40, deadline=None)
@given(vocabularies(), st.sets(st.sampled_from(b"ab01 ,:"), min_size=1))
def test_class_heads(info, chars):
    # Each text token starting with a class byte, with the count of its leading class bytes and
    # whether that is all of it; kept per class.
    cb = np.array(sorted(chars), dtype=np.int64)
    ids, heads, whole = class_heads(info, cb)
    expected = {}
    for t, b in enumerate(info.vocab):
        if b and b[0] in chars:
            n = next((k for k, c in enumerate(b) if c not in chars), len(b))
            expected[t] = (n, n == len(b))
    assert {t: (h, w) for t, h, w in zip(ids.tolist(), heads.tolist(), whole.tolist())} == expected
    assert class_heads(info, cb.copy())[0] is ids


def test_class_heads_past_eight_bytes():
    info = fresh_info()
    heads = dict(zip(*(a.tolist() for a in class_heads(info, np.array(sorted(b"abc"), dtype=np.int64))[:2])))
    for n in (8, 9, 15, 16, 17, 21):
        assert heads[info.vocab.index(b"c" * n + b'"')] == n
        assert heads[info.vocab.index(b"a" * n + E)] == n
