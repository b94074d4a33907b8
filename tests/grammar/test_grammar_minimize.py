"""DFA minimization in Python (automata/minimize.py) and the top-state token sets (tokens/walk.py).

Minimized DFAs are checked against the DFA they came from (same language, explored pair by pair)
and against a plain Python partition refinement (same number of states); masks built from shared
top-state sets are checked against brute force, also where the nesting limit cuts a walk short.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentkv.grammar.automata.minimize as minimize_mod
import agentkv.grammar.compiled as compiled
from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from agentkv.grammar.automata.dfa import determinize
from agentkv.grammar.automata.minimize import minimize
from agentkv.grammar.automata.regex import search_expr
from tests.grammar.test_grammar_matcher import assert_mask_is_brute_force
from tests.grammar.test_grammar_regex import patterns
from tests.grammar_helpers import live_and_classes, same_language

pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: the native walk and the Python one

FAR = float("inf")


@settings(max_examples=80, deadline=None)
@given(patterns())
def test_minimized_dfa_is_equivalent_and_minimal(pattern):
    d = determinize(search_expr(pattern), FAR)
    m = minimize(d, FAR)
    assert same_language(d, m), pattern
    live, classes = live_and_classes(m)
    # No two live states are equivalent (states that can no longer accept are trimmed at link).
    assert live == classes == live_and_classes(d)[1], pattern


def test_hash_collisions_cannot_merge_different_states(monkeypatch):
    monkeypatch.setattr(minimize_mod, "_weights", lambda n: np.ones(n, dtype=np.uint64))
    for pattern in [r"ab|cd", r"1\.1", r"[0-9]{2,4}x", r"(ab)*c"]:
        d = determinize(search_expr(pattern), FAR)
        assert same_language(d, minimize(d, FAR)), pattern


def test_a_matched_pattern_tail_is_one_text_loop():
    # Unanchored "1.1": once it matched, any text may follow; minimized, that is one state every
    # plain character loops on (a text loop: the walk allows plain tokens there unwalked).
    info = TokenizerInfo([bytes([c]) for c in b'"1.xyz'] + [b"abc", None], eos_ids=[7])
    g = GrammarCompiler(info).compile_json_schema({"type": "string", "pattern": "1.1"})
    cid = g.advance(g.initial, b'"x1.1')
    (stack,) = g.stacks(cid)
    assert g.walk_tables.text_loop[stack[-1]]


ALPHABET = b'[]"a,'


@st.composite
def small_vocab(draw):
    words = draw(st.lists(st.binary(min_size=2, max_size=6).map(
        lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b)), min_size=3, max_size=30, unique=True))
    vocab = list(dict.fromkeys([bytes([c]) for c in ALPHABET] + words)) + [None]
    return TokenizerInfo(vocab, eos_ids=[len(vocab) - 1])


NESTED = {"$defs": {"t": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/t"}},
                                    {"type": "string", "maxLength": 3}]}}, "$ref": "#/$defs/t"}


@pytest.mark.parametrize("depth_limit", [4, 7, compiled.MAX_STACK_DEPTH])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(info=small_vocab(), choices=st.lists(st.integers(0, 10**6), min_size=30, max_size=30))
def test_masks_from_top_state_sets_equal_brute_force(monkeypatch, depth_limit, info, choices):
    # A low nesting limit makes some walks end on it: those stacks must take the exact walk.
    monkeypatch.setattr(compiled, "MAX_STACK_DEPTH", depth_limit)
    g = GrammarCompiler(info).compile_json_schema(NESTED)
    m = Matcher(g)
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    opening = info.vocab.index(b"[")
    for i, c in enumerate(choices):
        expected = assert_mask_is_brute_force(m, bitmask)
        if not expected:
            break
        # Go deep first (past the limit where one is set), then wander.
        tok = opening if i < 8 and opening in expected else sorted(expected)[c % len(expected)]
        assert m.accept_token(tok)
        if m.is_terminated():
            break
    # The same string and array states recur under different stacks: computed once each.
    assert g.cache_info()["states"] <= g.num_states
