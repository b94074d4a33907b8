"""A closure's walk taken from a state walked before (closure_walks.py), against the whole walk of
the same state: the same allowed tokens, the same tokens returning below (those not allowed already),
and no shallower a depth; and the masks of a grammar that takes them, against brute force."""

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from agentkv.grammar.closure_walks import MAX_DIFF_BYTES, closure_walk
from agentkv.grammar.masks import top_state_tokens
from tests.grammar_helpers import ALPHABET, masks_along_a_walk, vocabularies


def returning(st) -> set[tuple[int, int]]:
    """The (token, bytes read) that return below, of the tokens the walk does not allow already."""
    allowed = np.unpackbits(st.allowed.view(np.uint8), bitorder="little").astype(bool)
    return {(t, o) for t, o in zip(st.below_ids.tolist(), st.below_offsets.tolist()) if not allowed[t]}


def derived_pairs_match(g) -> int:
    """Each closure's state walked from each other one near enough equals its own whole walk;
    returns how many pairs were compared."""
    closed = [q for q in range(g.num_states) if g.plain_closed(q) is not None]
    whole = {q: top_state_tokens(g, q) for q in closed}
    trans, pairs = g.automaton.trans, 0
    for r in closed:
        for q in closed:
            if q == r or (trans[q] != trans[r]).sum() > MAX_DIFF_BYTES:
                continue
            g._closure_walks = [(r, whole[r])]
            got = closure_walk(g, q)
            assert got is not None
            assert np.array_equal(got.allowed, whole[q].allowed), (r, q)
            assert returning(got) == returning(whole[q]), (r, q)
            assert got.depth >= whole[q].depth
            pairs += 1
    g._closure_walks = []
    return pairs


names = st.lists(st.text("ab01", min_size=1, max_size=4), min_size=1, max_size=4, unique=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocabularies(), names, st.sampled_from([True, {"type": "string"}, {"type": "integer"}]))
def test_an_open_objects_names_walked_from_each_other(info, declared, extra):
    # The positions inside a declared name of an object that allows other names too are states of one
    # closure, each reading one more letter than the free part: near enough to walk from each other.
    schema = {"type": "object", "properties": {n: {"type": "string"} for n in declared},
              "additionalProperties": extra}
    derived_pairs_match(GrammarCompiler(info).compile_json_schema(schema))


def test_derived_walks_happen_and_keep_the_masks():
    # Tokens that fare differently from a declared name's positions and from the free part: `a":"a",`
    # returns below the names' rule after an extra member, unless its `a` completes "abba" (declared,
    # so no extra name); `":{"a` enters a nested object, deeper than the names' rule.
    words = [bytes([c]) for c in ALPHABET] + [b'"a', b'ab', b'a"', b'":', b'":"', b'",', b'"}', b'ba', b'\\"', b'01',
                                              b'a":"a",', b'a":"a"}', b'":{"', b'":{"a"']
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    declared = {"abba": {"type": "string"}, "ab01": {"type": "integer"}}
    for extra in ({"type": "object", "additionalProperties": {"type": "string"}}, {"type": "string"}):
        schema = {"type": "object", "properties": declared, "additionalProperties": extra}
        assert derived_pairs_match(GrammarCompiler(info).compile_json_schema(schema)) >= 4
    # (the test above can meet grammars with no pair near enough)
    # Along walks of a fresh grammar, where state_tokens takes derived walks as it meets the states:
    taken = []
    g = GrammarCompiler(info).compile_json_schema(schema)
    import agentkv.grammar.compiled as compiled

    def counted(grammar, q):
        st = closure_walk(grammar, q)
        taken.append(st is not None)
        return st

    original, compiled.closure_walk = compiled.closure_walk, counted
    try:
        for seed in range(6):
            masks_along_a_walk(Matcher(g), random.Random(seed), 12)
    finally:
        compiled.closure_walk = original
    assert any(taken)
