"""Where plain characters lead from a state, decided for many states at once (char_steps.char_steps),
equals the per-state simulation of the one-character automaton (char_steps.uniform_char_step)."""

import numpy as np
import pytest

from agentkv.grammar import GrammarCompiler, TokenizerInfo
from agentkv.grammar import char_steps as P
from agentkv.grammar.token_groups import longer_char_steps

INFO = TokenizerInfo([bytes([c]) for c in range(0x20, 0x7F)] + ["é".encode(), None], eos_ids=[96])
SOURCES = [
    ("schema", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "é1": {"type": "null"}}}),
    ("schema", {"type": "string", "pattern": "^[^é]*$"}),  # one two-byte character dies
    ("schema", {"type": "string", "pattern": "^[^\\x00-\\x1f]*[^\\x00-\\x7F]$"}),  # longer characters go two ways
    ("schema", {"type": "string", "pattern": "^[ -\\x7f]*$"}),  # ASCII only: every longer character dies
    ("schema", {"type": "string", "pattern": "^[^\u4e00-\u4e01]+$"}),  # two three-byte characters die
    ("schema", {"type": "string", "pattern": "^([ -\\x7f]|[\u00e0-\u00ff])*$"}),  # some two-byte ones live
    ("lark", 'start: w w\nw: /[^"\\x00-\\x1f]/'),  # a rule returning after each character (a fork at its end)
]


@pytest.mark.parametrize("kind,source", SOURCES)
def test_char_steps_equal_the_per_state_simulation(kind, source):
    compiler = GrammarCompiler(INFO)
    g = compiler.compile_lark(source) if kind == "lark" else compiler.compile_json_schema(source)
    trans, fork = g.automaton.trans, g.fork_states
    states = np.nonzero(g._ascii_lo >= 0)[0]  # those it is asked about: every ASCII character lives
    uniform = g._ascii_lo[states] == g._ascii_hi[states]
    plain, multi = P.char_steps(trans, fork, states, uniform)
    assert len(states)
    for i, q in enumerate(states.tolist()):
        assert multi[i] == P.uniform_char_step(trans, fork, q, multibyte=True), (source, q)
        if uniform[i]:
            assert plain[i] == P.uniform_char_step(trans, fork, q), (source, q)
        else:
            assert plain[i] == P.UNKNOWN
    # and what a grammar decided when built (or along a chain) is the same, as is what it decides
    # when asked later (a state whose ASCII characters go different ways: at once)
    for q, nxt in g._plain_next.items():
        assert nxt == P.uniform_char_step(trans, fork, q)
    for q in range(g.num_states):
        assert g.plain_next(q) == P.uniform_char_step(trans, fork, q), (source, q)


OPEN_OBJECTS = [  # the names of an object that allows others: a trie of declared names beside the free part
    {"type": "object", "properties": {"name": {"type": "string"}, "named": {"type": "integer"}, "é": {"type": "null"}}},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"ab": {"type": "string"}}}}},
]


@pytest.mark.parametrize("source", OPEN_OBJECTS + [s for k, s in SOURCES if k == "schema"])
def test_plain_closure_reads_two_way_states_without_their_rows(source):
    # A state whose plain ASCII characters lead to at most two places (the next letter of a declared
    # name, or the free part) is searched from its least and greatest step alone, and a state whose
    # longer characters all lead to one place (decided when the grammar was built) is not simulated:
    # the same closure as from whole rows and simulations, for every state the walk asks about.
    g = GrammarCompiler(INFO).compile_json_schema(source)
    assert g._multibyte_next  # (decided at build: the shortcut is taken)
    trans, fork = g.automaton.trans, g.fork_states
    two = g._ascii_two_ways
    assert (two == [len(set(row.tolist())) <= 2 for row in g._ascii_steps]).all()
    closures, branching = 0, False
    for q in np.nonzero(g._ascii_lo >= 0)[0].tolist():
        plain = P.plain_closure(trans, g._ascii_steps, g._ascii_lo, fork, q, g._ascii_hi, np.zeros_like(two), {})
        quick = P.plain_closure(trans, g._ascii_steps, g._ascii_lo, fork, q, g._ascii_hi, two, g._multibyte_next)
        assert (plain[0] is None) == (quick[0] is None) and plain[1] == quick[1], (source, q)
        if plain[0] is not None:
            closures += 1
            assert plain[0].tolist() == quick[0].tolist()
            branching |= any(two[s] and g._ascii_lo[s] != g._ascii_hi[s] for s in plain[0].tolist())
    assert (closures and branching) or source not in OPEN_OBJECTS  # (a trie's states step two ways)


LONGER = ["é", "ü", "ж", "ß", "中", "文", "\u00a0", "\u3000", "\U0001f600", "\U0001f680",
          "ab\u00e9\u4e2d\U0001f600"]


@pytest.mark.parametrize("kind,source", SOURCES + [
    ("schema", {"type": "string", "pattern": "^\\S+$"}),  # all but the Unicode spaces
    ("schema", {"type": "string", "pattern": "^[\U0001f600-\U0001f64f]{2}[\u4e00-\u9fff]?$"}),  # four and three bytes
])
def test_longer_character_steps_step_each_character(kind, source):
    # `longer_char_steps` (per distinct first two bytes, then the third and fourth) against each
    # character's bytes stepped one at a time, from every state.
    info = TokenizerInfo([bytes([c]) for c in range(0x20, 0x7F)] + [w.encode() for w in LONGER] + [None],
                         eos_ids=[95 + len(LONGER)])
    compiler = GrammarCompiler(info)
    g = compiler.compile_lark(source) if kind == "lark" else compiler.compile_json_schema(source)
    trans, fork, chars = g.automaton.trans, g.fork_states, info.longer_chars
    assert sorted(chars.lengths.tolist()) == [2] * 5 + [3] * 3 + [4] * 2
    for q in range(g.num_states):
        expected, forks = [], False
        for c, n in zip(chars.chars.tolist(), chars.lengths.tolist()):
            s = q
            for k in range(n):
                if k and s >= 0 and fork[s]:
                    forks = True
                s = int(trans[s, c[k]]) if s >= 0 else -1
            expected.append(s)
        got = longer_char_steps(g, q)
        assert (got is None) if forks else got.tolist() == expected, (source, q)


TWINNED = [  # escapes beside a string's character chain
    ("schema", {"type": "string", "minLength": 2, "maxLength": 6}),
    ("schema", {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]}),
]


NEAR_TWINS = [  # after `a` and after `b`, characters of two bytes lead alike, those of three do not
    ("schema", {"type": "string", "pattern": "^(a[\u0080-\u07ff]|b[^\\x00-\\x7f])$"}),
]


@pytest.mark.parametrize("order", [1, -1])
@pytest.mark.parametrize("kind,source", SOURCES + TWINNED + NEAR_TWINS)
def test_states_decided_one_at_a_time_take_a_twins_answer(monkeypatch, kind, source, order):
    # In a grammar too large to decide every state when built, a state asked alone whose lead bytes
    # (0xC2-0xF4) lead where an answered state's do takes that state's answer for its characters of
    # two or more bytes (a string's state after an escape, beside its character chain): the same
    # answers as the simulation, from fewer simulations.
    from agentkv.grammar import plain_runs
    monkeypatch.setattr(plain_runs, "MAX_STATES_AT_BUILD", 0)
    simulated = []

    def counted(trans, fork, q, multibyte=False):
        simulated.append(q)
        return P.uniform_char_step(trans, fork, q, multibyte)

    monkeypatch.setattr(plain_runs, "uniform_char_step", counted)
    compiler = GrammarCompiler(INFO)
    g = compiler.compile_lark(source) if kind == "lark" else compiler.compile_json_schema(source)
    assert not g._multibyte_next  # (nothing decided at build)
    trans, fork = g.automaton.trans, g.fork_states
    for q in range(g.num_states)[::order]:
        assert g.multibyte_next(q) == P.uniform_char_step(trans, fork, q, multibyte=True), (source, q)
        assert g.plain_next(q) == P.uniform_char_step(trans, fork, q), (source, q)
    assert len(set(simulated)) < g.num_states or (kind, source) not in TWINNED  # (some took a twin's answer)
