"""The token walk's parts against their definitions (the trie itself: test_grammar_trie.py): text
loops against plain text stepped byte by byte, byte classes against their texts, the native walk against
the Python one (the same StateTokens from every state), and masks against brute force on shapes
the walk treats specially (class chains, text loops beside declared names, UTF-8 cut short)."""

import itertools
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo, native
from agentkv.grammar.tokens import walk as tw
from agentkv.grammar.tokens import walk_tables
from tests.grammar_helpers import compile_one, masks_along_a_walk

E = "é".encode()
SHAPES = [
    ("schema", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "é1": {"type": "null"}}}),
    ("schema", {"type": "object", "properties": {"name": {"type": "integer"}, "nb": {"type": "null"}}}),
    ("schema", {"type": "array", "items": {"type": "string"}}),
    ("schema", {"type": "string", "pattern": "^[^é]*$"}),  # one two-byte character dies: no text loop
    ("schema", {"type": "string", "pattern": "^[^\\x00-\\x1f]*[^\\x00-\\x7F]$"}),
    ("schema", {"type": "string", "pattern": "^[ -\\x7f]*$"}),  # ASCII only
    ("schema", {"type": "string", "pattern": "^[^\u4e00-\u4e01]+$"}),  # two three-byte characters die
    ("schema", {"type": "string", "pattern": "^[a-c0-9-]{1,6}$"}),  # a class chain
    ("schema", {"type": "string", "pattern": "^([a-c]{3})+$"}),
    ("schema", {"type": "string", "pattern": "1.1"}),  # a text loop once matched
    ("schema", {"type": "string", "pattern": "^.+$"}),  # all but U+2028/9: a text loop (not plain)
    ("schema", {"type": "string", "pattern": "^[^ #.]+$"}),  # a class taking every wide character
    ("schema", {"type": "string", "pattern": "^\\S{1,4}$"}),  # a counted one
    ("schema",
     {"type": "object", "propertyNames": {"pattern": "^[a-c_]{2,5}$"}, "additionalProperties": {"type": "integer"}}),
    ("schema",
     {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}}}),
    (
        "schema",
        {
            "$defs": {"t": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/t"}}, {"type": "string"}]}},
            "$ref": "#/$defs/t",
        },
    ),  # recursion: calls pushed, returns below
    ("regex", "[ab]{2,5}1?"),  # the chain's later states may end the text: forks
    ("lark", 'start: w w\nw: /[^"\\x00-\\x1f]/'),  # a rule returning after each character
    ("lark", 'start: w "y"\nw: /[a-wA-W]+/ | "-" w'),
    ("schema", {"type": "string", "maxLength": 6}),
    ("regex", '[a-e"]+'), ("regex", "[a-f]+y?"),  # loops over a class, tokens leaving it deep below (abcdefgh)
    ("regex", "[a-i]{1,5}[0-9]?"), ("regex", "[a-c]{2,4}[0-9]{3}"),  # counted repetitions of a class
    ("schema", {"type": "object", "additionalProperties": {"type": "string", "minLength": 2, "maxLength": 4}}),
]
WORDS = (
    [bytes([c]) for c in range(0x20, 0x7F)]
    + [E, E[:1], E[1:], "中".encode(), "中".encode()[:2], b"\n", "\u2028".encode()[:2]]
    + [
        w.encode()
        for w in [
            '"',
            '":',
            '":"',
            '":{"',
            '":[',
            '",',
            '"}',
            '"],',
            "\\n",
            '\\"',
            "\\u00",
            'x":',
            "ab\\",
            'name":',
            'name":1',
            'nb":',
            'é"',
            'é":',
            "a\n",
            "aaaaaaa",
            "abcabc1",
            "a1a1",
            'ab"',
            '[["',
            '["ab"',
            '"]]',
            "-ab",
            "aby",
            "é中",
            "xy",
            'é1":',
            '{"é1":null}',
            "1.1",
            "x1.1y",
            # plain text of every length up to 9 characters, across a maximum length's room
            "ab",
            "abc",
            "abcd",
            "abcde",
            "abcdef",
            "abcdefg",
            "abcdefgh",
            "abcdefghi",
            "aéé",
            "中中中中",
            'abcd"',
            'abcdef"',
            "ab\\n",
            "Q1",
            "R12",
            "S123",
            "T1234",
            "U12345",
            "V123456",
            "W1234567",
            "X12345678",
            "Yé中é中é",
            "a\u2028",
            "a\u00a0",
            "\u3000",
            "中\u3000b",
            "ñ\u3000",
            "ñb",
            "é.b",
            "ab#",
            "中中中中中",
            "\u2029b",
        ]
    ]
)


def shape_info() -> TokenizerInfo:
    vocab = list(dict.fromkeys(WORDS))
    return TokenizerInfo(vocab + [None], eos_ids=[len(vocab)])


def compile_shape(info, kind, source):
    compiler = GrammarCompiler(info)
    return compiler.compile_lark(source) if kind == "lark" else compile_one(compiler, kind, source)


KEYED = {"type": "object", "patternProperties": {"^[a-z]+x$": {"type": "integer"}},
         "additionalProperties": {"type": "string"}}
DECLARED = {"type": "object", "properties": {"abc": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
SKIPPED = {"type": "object", "patternProperties": {"^a.c": {"type": "integer"}},
           "additionalProperties": {"type": "string"}}


@pytest.mark.parametrize("kind,source", SHAPES + [("schema", {"type": "string", "maxLength": 9}),
                                                  ("schema", {"type": "string", "pattern": "^[^a]{0,4}$"}),
                                                  ("schema", KEYED), ("schema", DECLARED),
                                                  ("schema", SKIPPED)])
def test_text_reach_is_what_survives(kind, source):
    # A state's reach: every plain text of that many characters survives (a character of 1-4 bytes,
    # cut short too); a text loop (reach: any token's length) every plain text. A state that is not
    # a loop loses some plain text of at most two characters, or does not keep plain ASCII on itself.
    g = compile_shape(shape_info(), kind, source)
    trans = g.automaton.trans
    longer = [c.encode() for c in "é\u07ff\u0800\ud7ff\ue000\uffff\U00010000\U0010ffff中\u4e00\u4e01"]
    singles = [bytes([c]) for c in range(0x20, 0x7F) if c not in b'"\\'] + longer
    texts = singles + [a + b for a in longer for b in longer] + [t[:k] for t in longer for k in range(1, len(t))]

    def survives(q, data):
        for b in data:
            q = trans[q, b]
            if q < 0:
                return False
        return True

    loops, reach = g.walk_tables.text_loop, g.walk_tables.text_reach
    for q in range(g.num_states):
        for k in range(1, min(reach[q], 3) + 1):  # (texts of up to 3 characters; longer ones: the chains)
            assert all(survives(q, b"".join(p)) for p in itertools.product(singles[::7], repeat=k)), (source, q, k)
        keeps_ascii = all(trans[q, c] == q for c in range(0x20, 0x7F) if c not in b'"\\')
        if loops[q]:
            assert all(survives(q, t) for t in texts), (source, q)
        else:
            assert not keeps_ascii or not all(survives(q, t) for t in texts), (source, q)


@pytest.mark.parametrize("schema", [KEYED, DECLARED, SKIPPED])
def test_a_key_that_is_free_or_constrained_is_a_text_loop(schema):
    """Inside a key that any text may be but some pattern or declared name gives another value, plain
    characters lead through the pattern's or the name's states while the free side keeps every text
    alive: those states are text loops too (a mask there takes plain tokens whole instead of stepping
    the trie), found by the greatest fixpoint over the (state, phase) pairs plain text reaches, which
    takes in a state whose characters all lead one way to a searched one (past a name's last
    letter)."""
    g = compile_shape(shape_info(), "schema", schema)
    loops, cid, seen = g.walk_tables.text_loop, g.advance(g.initial, b'{"'), set()
    for c in b"abcxx":  # (through the pattern's or the name's states)
        # (a declared name's own letters, one byte each, are a stack apart)
        seen.update(stack[-1] for stack in g.stacks(cid) if (g.automaton.trans[stack[-1]] >= 0).sum() > 1)
        cid = g.step(cid, c)
    assert len(seen) > 2 and all(loops[q] for q in seen)


@pytest.mark.parametrize(
    "kind,source",
    SHAPES + [("schema", {"type": "string", "pattern": "^[^.]{1,5}(\\.[^.]{1,5})*$"}), ("regex", "[a-c]{2,4}[0-9]{3}")])
def test_class_reach_is_what_survives(kind, source):
    # A state's class of bytes carries any text of that class as far as its reach says (strings of
    # up to 4 characters tried, drawn from the class, and from wide characters past ASCII where the
    # class takes them).
    g = compile_shape(shape_info(), kind, source)
    trans, tables = g.automaton.trans, g.walk_tables
    rnd = random.Random(0)
    wide = [c.encode() for c in "é\u0085\u07ff\u0800中\u2027\u202a\u3001\ufefe\uffff\U00010000\U0010ffff"]
    for q in range(g.num_states):
        members = [bytes([b]) for b in range(256) if tables.class_sets[q] >> b & 1]
        if tables.class_wide[q]:
            members += wide
        for k in range(1, min(int(tables.class_reach[q]), 4) + 1):
            for _ in range(20):
                s = q
                for b in b"".join(rnd.choice(members) for _ in range(k)):
                    s = trans[s, b]
                    assert s >= 0, (source, q, k)


@pytest.mark.parametrize("pattern,reads", [("^[^./]+$", "wide"), ("^\\S+$", "wide"), ("^[^é]+$", "narrow"),
                                           ("^[ -\\x7f]+$", "narrow"), ("^[^\u3001]+$", "narrow"),
                                           ("^[^\u3000]+$", "wide"), ("^.+$", "plain")])
def test_a_class_takes_wide_characters_where_each_leads_its_way(pattern, reads):
    """Past ASCII a class is read by characters: the walk allows a subtree of wide text whose ASCII
    bytes are in the class where every wide character past ASCII leads where the class does. A text
    loop (every plain text survives) is not asked: its plain-text reach allows more."""
    g = compile_shape(shape_info(), "schema", {"type": "string", "pattern": pattern})
    body = g.stacks(g.advance(g.initial, b'"ab'))[0][-1]
    tables = g.walk_tables
    assert (bool(tables.text_loop[body]), bool(tables.class_wide[body])) == {
        "wide": (False, True), "narrow": (False, False), "plain": (True, False)}[reads]


needs_native = pytest.mark.skipif(native.load() is None, reason=f"no native token walk: {native.unavailable_reason()}")


@needs_native
@pytest.mark.parametrize("kind,source", SHAPES)
def test_native_and_python_walks_agree_from_every_state(kind, source, monkeypatch):
    # The same tokens allowed, the same returns below (node and bytes read) and the same depth, from
    # every state with the frames below unknown; and the same tokens below a real stack.
    info = shape_info()
    g = compile_shape(info, kind, source)
    walks = {}
    for path in ("native", "python"):
        if path == "python":
            monkeypatch.setattr(native, "load", lambda: None)
        walks[path] = [tw.top_state_tokens(g, q) for q in range(g.num_states)]
    for q, (a, b) in enumerate(zip(walks["native"], walks["python"])):
        assert np.array_equal(a.allowed, b.allowed), (source, q)
        assert sorted(map(tuple, a.below.tolist())) == sorted(map(tuple, b.below.tolist())), (source, q)
        assert a.depth == b.depth, (source, q)
    monkeypatch.undo()
    for q, walk in enumerate(walks["native"]):
        if len(walk.below):
            out = {}
            for path in ("native", "python"):
                if path == "python":
                    monkeypatch.setattr(native, "load", lambda: None)
                words = np.zeros(info.words, dtype="<i4")
                tw.continue_below(g, (g.automaton.starts[0], q), walk.below, words)
                out[path] = words
            monkeypatch.undo()
            assert np.array_equal(out["native"], out["python"]), (source, q)


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("kind,source", SHAPES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rnd=st.randoms(use_true_random=False))
def test_masks_on_every_shape(kind, source, path, rnd, monkeypatch):
    if path == "python":
        monkeypatch.setattr(native, "load", lambda: None)
    elif native.load() is None:
        pytest.skip(native.unavailable_reason())
    m = Matcher(compile_shape(shape_info(), kind, source))
    masks_along_a_walk(m, rnd, 12)


def test_a_string_body_is_a_text_loop():
    # From a string body the plain-text subtrees are allowed unwalked; the masks stay right.
    words = [w.encode() for w in ["ab", "abc", "b", "a", "é", 'ab"', '"', '",', "x\\n", "\\", "n", ","]]
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = GrammarCompiler(info).compile_json_schema({"type": "array", "items": {"type": "string"}})
    m = Matcher(g)
    assert m.accept_bytes(b'["')
    masks_along_a_walk(m, random.Random(0), 6)
    (stack,) = g.stacks(g.advance(g.initial, b'["'))
    assert g.walk_tables.text_loop[stack[-1]]


def test_a_string_with_a_maximum_length_reaches_its_room():
    # Along `maxLength: 9`, the position after k characters reaches 9 - k more of any plain text; the
    # one past the end none (it closes the string).
    info = shape_info()
    g = GrammarCompiler(info).compile_json_schema({"type": "string", "maxLength": 9})
    cid = g.advance(g.initial, b'"')
    for k in range(10):
        (stack,) = [s for s in g.stacks(cid)]
        assert g.walk_tables.text_reach[stack[-1]] == 9 - k
        cid = g.advance(cid, "é".encode() if k % 2 else b"a")


def test_the_native_walk_builds_wherever_there_is_a_compiler():
    # (Its tests skip without it: a build broken by a change must fail here, not skip there.)
    import os
    import shutil

    if os.environ.get("AGENTKV_NATIVE_GRAMMAR") == "0" or not (os.environ.get("CC") or shutil.which("cc")
                                                                 or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler, or the native walk turned off")
    assert native._load()[0] is not None, native.unavailable_reason()


@needs_native
def test_walks_past_the_budget_are_evicted_and_masks_stay_right(monkeypatch):
    # A budget below one walk: each new top state's walk evicts the others (counted), and masks that
    # need them again walk again.
    monkeypatch.setattr(walk_tables, "MAX_WALK_BYTES", 1)
    info = shape_info()
    g = compile_shape(info, "schema", SHAPES[1][1])
    for seed in range(3):
        masks_along_a_walk(Matcher(g), random.Random(seed), 12)
        g._masks.clear()
    stats = g.cache_info()
    assert stats["walks"] == 1 and stats["walk_evictions"] == stats["walks_computed"] - 1 > 0
