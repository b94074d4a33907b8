"""The walk's per-state tables in C (csrc/state_tables.c) against their numpy twin
(tokens/state_tables.py: text_reach and byte_classes): equal on every shape of the token walk's tests,
on random patterns over the classes the tables single out, on random automata built around the bytes
they look at (plain ASCII, UTF-8 lead and continuation bytes, "a", "0"), and where the text-loop
search is cut short. What the tables mean is tested in test_grammar_token_walk.py."""

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from agentkv.errors import GrammarError
from agentkv.grammar import native
from agentkv.grammar.tokens import state_tables
from tests.grammar.test_grammar_token_walk import DECLARED, KEYED, SHAPES, SKIPPED, compile_shape, shape_info

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native grammar code: {native.unavailable_reason()}")

# Bytes where a random row may change target: the edges of the classes the tables read.
CUTS = [0x00, 0x20, 0x22, 0x23, 0x30, 0x31, 0x5C, 0x5D, 0x61, 0x62, 0x7E, 0x7F, 0x80, 0x90, 0xA0, 0xA8, 0xAA, 0xC0,
        0xC2, 0xC3, 0xE0, 0xE1, 0xE2, 0xE3, 0xED, 0xEE, 0xF0, 0xF1, 0xF4, 0xF5]


def python_tables(trans, cap):
    reach = state_tables.text_reach(trans, cap)
    return (reach, *state_tables.byte_classes(trans, cap, reach >= cap))


def assert_same(trans, cap):
    trans = np.ascontiguousarray(trans, dtype=np.int32)
    c, p = state_tables.state_tables(trans, cap), python_tables(trans, cap)
    for name, x, y in zip(("text_reach", "class_bytes", "class_reach", "class_wide"), c, p):
        assert np.array_equal(np.asarray(x).astype(np.uint64), np.asarray(y).astype(np.uint64)), name


@pytest.mark.parametrize("kind,source", SHAPES + [("schema", KEYED), ("schema", DECLARED), ("schema", SKIPPED)])
def test_the_c_tables_equal_the_python_ones_on_every_shape(kind, source):
    info = shape_info()
    g = compile_shape(info, kind, source)
    assert_same(g.automaton.trans, info.trie.max_len)


PIECES = [".", "\\S", "[^ ]", "[^ é]", "[^é]", "[a-c]", "[^#.]", "[^\"]", "x", "[0-9]", "[^\u4e00]", "\\s"]
QUANTS = ["", "", "?", "*", "+", "{2}", "{1,3}", "{0,5}"]


@st.composite
def patterns(draw):
    """Regexes over classes the tables single out (plain, wide, spaces, one wide character left out)."""
    def run():
        return "".join(draw(st.sampled_from(PIECES)) + draw(st.sampled_from(QUANTS))
                       for _ in range(draw(st.integers(1, 4))))
    return "|".join(f"({run()})" for _ in range(draw(st.integers(1, 3))))


@settings(max_examples=150, deadline=None)
@given(patterns())
def test_the_c_tables_equal_the_python_ones_on_random_patterns(pattern):
    info = shape_info()
    for kind, source in (("regex", pattern), ("schema", {"type": "string", "pattern": f"^({pattern})$"})):
        try:
            g = compile_shape(info, kind, source)
        except GrammarError as e:  # (`.*` before bounded wide classes: past the state limit, not a case here)
            assert "too large" in str(e)
            reject()
        assert_same(g.automaton.trans, info.trie.max_len)


@st.composite
def automata(draw):
    n = draw(st.integers(1, 7))
    trans = np.full((n, 256), -1, dtype=np.int32)
    for s in range(n):
        cuts = sorted(set(draw(st.lists(st.sampled_from(CUTS), max_size=8))) | {0})
        for lo, hi in zip(cuts, cuts[1:] + [256]):
            trans[s, lo:hi] = draw(st.sampled_from([-1, s, *range(n)]))
    return trans


@settings(max_examples=300, deadline=None)
@given(automata(), st.integers(1, 6))
def test_the_c_tables_equal_the_python_ones_on_random_automata(trans, cap):
    assert_same(trans, cap)


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_text_loop_search_cut_short_takes_the_same_states_in_c(rounds, monkeypatch):
    # Past its rounds the search takes no candidate (a round leaves a superset): C must give up
    # after the same rounds as the twin, not keep what was left standing.
    monkeypatch.setattr(state_tables, "MAX_TEXT_ROUNDS", rounds)
    info = shape_info()
    for kind, source in SHAPES + [("schema", KEYED), ("schema", DECLARED), ("schema", SKIPPED)]:
        assert_same(compile_shape(info, kind, source).automaton.trans, info.trie.max_len)
