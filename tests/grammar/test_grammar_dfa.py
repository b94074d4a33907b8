"""Rule automata built in C (csrc/dfa_build.c, dfa_minimize.c) against the Python twin
(automata/dfa_python.py, automata/minimize.py), and the linked automaton's live states (csrc/trim.c) against
automaton._cut_python.

The C result must be the minimal DFA of the same language: the same language as the Python one
(explored pair by pair), as many states as the Python DFA has live equivalence classes, and no state
that cannot reach acceptance. Equal languages give equal tables (breadth-first numbering). The
C cut of the linked table (dead edges, `has_bytes`) equals the Python one.
"""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.grammar import native
from agentkv.grammar.automata import automaton, dfa
from agentkv.grammar.automata.dfa_python import product
from agentkv.grammar.automata.expr import Alt, Diff, Intersect, Ref, Repeat, chars, lit, seq
from agentkv.grammar.automata.minimize import minimize
from agentkv.grammar.automata.regex import match_expr, search_expr
from agentkv.grammar.schema.numbers import multiple_of
from tests.grammar.test_grammar_regex import patterns
from tests.grammar_helpers import live_and_classes, same_language

FAR = float("inf")

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native grammar code: {native.unavailable_reason()}")


def python_dfa(expr):
    """The Python twin's minimal DFA (dfa.minimal_dfa with the native library hidden)."""
    saved = native.load
    native.load = lambda: None
    dfa.clear_cache()
    try:
        return dfa.minimal_dfa(expr, FAR)
    finally:
        native.load = saved
        dfa.clear_cache()


def native_dfa(expr):
    dfa.clear_cache()
    try:
        return dfa.minimal_dfa(expr, FAR)
    finally:
        dfa.clear_cache()


def assert_minimal_twin(expr):
    c, p = native_dfa(expr), python_dfa(expr)
    assert same_language(c, p), expr
    live, classes = live_and_classes(p)
    if not live:  # the empty language: one state with no way out
        assert len(c.accept) == 1 and not c.accept[0] and (c.table == -1).all() and not c.calls[0], expr
        return c
    # Every C state can still accept, and no two are equivalent.
    assert live_and_classes(c) == (len(c.accept), len(c.accept)) == (len(c.accept), classes), expr
    return c


@settings(max_examples=120, deadline=None)
@given(patterns())
def test_search_and_match_automata_equal_the_python_ones(pattern):
    assert_minimal_twin(search_expr(pattern))
    assert_minimal_twin(match_expr(pattern))


@settings(max_examples=60, deadline=None)
@given(patterns(), patterns(), st.booleans())
def test_products_equal_the_python_ones(left, right, intersect):
    a, b = match_expr(left), search_expr(right)
    expr = Intersect(a, b) if intersect else Diff(a, b)
    assert_minimal_twin(expr)
    # And the product itself, before minimization, against the Python product of the same DFAs.
    p = product(python_dfa(a), python_dfa(b), intersect, dfa.MAX_DFA_STATES, FAR)
    assert same_language(native_dfa(expr), minimize(p, FAR))


def test_equal_languages_give_equal_tables():
    one = native_dfa(match_expr("(ab|ac)*"))
    two = native_dfa(match_expr("(a(b|c))*"))
    assert np.array_equal(one.table, two.table) and np.array_equal(one.accept, two.accept)


def test_machines_and_calls():
    # A machine (multiples of 0.25 written out) and rule calls: calls are symbols like bytes.
    assert_minimal_twin(multiple_of(0.25, integer=False, where=None))
    expr = Alt((seq(lit("["), Ref("item"), Repeat(seq(lit(","), Ref("item")), 0, None), lit("]")),
                seq(lit("["), Ref("item"), lit("]")), seq(chars(("a", "z")), Ref("other"))))
    c = assert_minimal_twin(expr)
    assert sorted({name for row in c.calls for name, _ in row}) == ["item", "other"]


@settings(max_examples=60, deadline=None)
@given(patterns())
def test_a_kept_automaton_comes_back_as_it_was_built(pattern):
    """The cache keeps a rule automaton over its byte classes (its distinct columns); a hit gives
    back the table, calls and acceptance that were built, in fewer bytes than the 256 columns."""
    expr = Alt((match_expr(pattern), seq(lit("["), Ref("item"), lit("]"))))
    dfa.clear_cache()
    try:
        built = dfa.minimal_dfa(expr, FAR)
        kept = dfa.minimal_dfa(expr, FAR)
        assert kept is not built
        assert np.array_equal(kept.table, built.table) and np.array_equal(kept.accept, built.accept)
        assert kept.table.flags["C_CONTIGUOUS"]  # (C reads the rows of an embedded one)
        assert list(kept.calls) == list(built.calls)
        assert dfa.cache_info()["dfa_bytes"] < built.table.nbytes + 256 + 64 * len(built.accept)
    finally:
        dfa.clear_cache()


@settings(max_examples=40, deadline=None)
@given(patterns(), patterns(), st.booleans())
def test_a_product_of_kept_automata_is_the_product_built_afresh(left, right, intersect):
    """Intersections, differences and rules embedding them read their parts from the cache: the
    same automata as with nothing kept."""
    a, b = match_expr(left), search_expr(right)
    expr = seq(lit("<"), Intersect(a, b) if intersect else Diff(a, b), Ref("next"))
    fresh = native_dfa(expr)
    dfa.clear_cache()
    try:
        dfa.minimal_dfa(a, FAR), dfa.minimal_dfa(b, FAR)
        kept = dfa.minimal_dfa(expr, FAR)
    finally:
        dfa.clear_cache()
    assert np.array_equal(kept.table, fresh.table) and np.array_equal(kept.accept, fresh.accept)


def test_an_empty_language_is_one_state_that_accepts_nothing():
    c = native_dfa(Intersect(match_expr("a+"), match_expr("b+")))
    assert len(c.accept) == 1 and not c.accept[0] and (c.table == -1).all()
    assert dfa.is_empty(Intersect(match_expr("a+"), match_expr("b+")), FAR)


def test_limits_are_grammar_errors():
    from agentkv.errors import GrammarError

    with pytest.raises(GrammarError, match="automaton states"):
        native_dfa(Repeat(lit("abcdefgh"), 0, dfa.MAX_NFA_STATES // 4))
    with pytest.raises(GrammarError, match="timed out"):
        dfa.clear_cache()
        dfa.minimal_dfa(Repeat(search_expr("[a-z]{1,40}x"), 3, 3), 0.0)


def test_an_intersection_with_rule_calls_is_refused():
    from agentkv.errors import GrammarError

    expr = Intersect(seq(lit("a"), Ref("x")), match_expr("a+"))
    for build in (native_dfa, python_dfa):
        with pytest.raises(GrammarError, match="rule references"):
            build(expr)


LIVE_CASES = [
    # (rules, root): rules whose states die only through calls to rules that never end
    ({"root": Alt((Ref("a"), Ref("b"))), "a": seq(lit("x"), Ref("a")), "b": lit("y")}, "root"),
    ({"root": seq(Ref("a"), lit("!")), "a": Alt((seq(lit("("), Ref("a"), lit(")")), lit("x")))}, "root"),
    ({"root": Alt((seq(Ref("c"), lit("z")), lit("q"))), "c": seq(lit("c"), Ref("d")), "d": seq(lit("d"), Ref("c"))},
     "root"),
]


@pytest.mark.parametrize("rules,root", LIVE_CASES)
def test_live_states_in_c_equal_the_python_search(rules, root):
    raw = _untrimmed(rules, root)
    c, p = copy.deepcopy(raw), copy.deepcopy(raw)
    live_c, prod_c = automaton._cut_native(c)
    live_p, prod_p = automaton._cut_python(p)
    assert np.array_equal(live_c, live_p) and prod_c == prod_p
    assert live_p[raw.starts[0]]
    assert np.array_equal(c.trans, p.trans) and np.array_equal(c.has_bytes, p.has_bytes)
    # every edge left joins live states, and every edge between live states is kept
    kept = (raw.trans >= 0) & live_p[:, None] & live_p[np.maximum(raw.trans, 0)]
    assert np.array_equal(p.trans >= 0, kept) and np.array_equal(p.has_bytes, kept.any(axis=1))


def test_trimming_drops_what_never_ends():
    raw = _untrimmed(*LIVE_CASES[0])
    live, productive = automaton._cut_native(raw)
    assert dict(zip(raw.rule_names, productive)) == {"root": True, "a": False, "b": True} and not live.all()


def _untrimmed(rules, root):
    trim = automaton._trim
    automaton._trim = lambda a: None
    try:
        return automaton.link(rules, root, FAR)
    finally:
        automaton._trim = trim
