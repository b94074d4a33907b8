"""The token walk's shortcuts (masks.py, walk_starts.py, plain_runs.py), each against the brute-force
mask over small vocabularies: states whose characters go a few ways or many, open objects' names,
literal text and trees of it, strings of bounded length; and the tables they read, against their
definitions. (Loops over a class: test_grammar_loops.py.)"""

import itertools
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo, char_steps, walk_starts
from agentkv.grammar.plain_tables import _cut_plain_char
from tests.grammar_helpers import (
    assert_mask_is_brute_force,
    masks_along_a_walk,
    masks_to_the_end,
    vocabularies,
)

pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: vectorized and one-token walks


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


@pytest.mark.parametrize("whole_group_mask", [0, 1 << 30])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.text(alphabet=' abxyz019"{}:,é', min_size=2, max_size=5), min_size=10, max_size=60),
       which=st.sampled_from(range(len(WIDE))), rnd=st.randoms(use_true_random=False))
def test_many_first_characters(monkeypatch, whole_group_mask, words, which, rnd):
    # Every printable ASCII character as a token: a property name or class then has many plain first
    # characters, taken together (`_by_first_char`), the whole groups as packed masks (set
    # WHOLE_GROUP_MASK to 0 so that a small group is one too).
    monkeypatch.setattr(walk_starts, "WHOLE_GROUP_MASK", whole_group_mask)
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
    # declared names' trie and the free part both read every character. Every token that is a prefix
    # of plain text (a character cut short at its end too) is allowed without a walk; the others
    # (a quote or backslash after plain text, a stray continuation byte, a control character) walk.
    e = "é".encode()
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [e, e[:1], e[1:], b"na" + e[:1], b"nam", b"name", b'name"',
                                                      b'name":', b'x":', b'na\\', b"a\n", e + b'"', b"\t"]
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = GrammarCompiler(info).compile_json_schema(
        {"type": "object", "properties": {"name": {"type": "integer"}, "nb": {"type": "null"},
                                          "é1": {"type": "null"}}})
    m = Matcher(g)
    assert m.accept_bytes(b'{"')
    closed = [r for s in g._configs[m._cfg][0] if (r := g.plain_closed(s[-1])) is not None]  # the free names
    assert closed and all(r[ord('"')] and not r[ord("\n")] for r in closed)
    allowed = assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    assert {words.index(w) for w in (e[:1], b"na" + e[:1], b'name":', b'x":')} <= allowed
    assert not {words.index(w) for w in (e[1:], b"a\n", b"\t")} & allowed
    assert m.accept_bytes(b"na")  # inside the trie: the same
    assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    # A name with a length limit is not closed: plain text dies past it.
    g = GrammarCompiler(info).compile_json_schema({"type": "object", "propertyNames": {"maxLength": 3}})
    m = Matcher(g)
    assert m.accept_bytes(b'{"')
    assert all(g.plain_closed(s[-1]) is None for s in g._configs[m._cfg][0])
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
    assert any(g.fork_states[q] and g.first_only[q] == ord(",") for q in range(g.num_states))


TREE_WORDS = [bytes([c]) for c in b'{}":,0123abdegklmnoprtuyz'] + [
    b'{"', b'{"na', b'{"name', b'name":', b'me":1', b'med":', b'ed":2}', b'"nap', b'nap":', b'p":0,"', b'"ok',
    b'okay', b'ay":3', b'ok":', b'ze', b'zeta":"', b'"red"', b're', b'gr', b'green"', b'grey"}', b'ey', b'":"',
    b'"b', b'blue', b'ue"', b',"z', b'na', b'ta"']
TREE_SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "name": {"type": "integer"}, "named": {"type": "integer"}, "nap": {"type": "integer"}, "ok": {"type": "integer"},
    "okay": {"type": "integer"}, "zeta": {"enum": ["red", "green", "grey", "blue"]}}}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tree_past", [2048, -1])
def test_texts_branching_from_a_state_are_looked_up(monkeypatch, seed, tree_past):
    # The names a strict object may write next, and listed string values, branch from one state into
    # literal texts: the tokens inside them are looked up, those past a text's end walk on from there
    # (TREE_PAST -1: every such state walks by first character instead). Same masks either way.
    from agentkv.grammar import literals

    monkeypatch.setattr(walk_starts, "TREE_PAST", tree_past)
    info = TokenizerInfo(TREE_WORDS + [None], eos_ids=[len(TREE_WORDS)])
    g = GrammarCompiler(info).compile_json_schema(TREE_SCHEMA)
    masks_to_the_end(Matcher(g), random.Random(seed))
    root = g.advance(g.initial, b'{"')
    (q,) = [s[-1] for s in g.stacks(root)]
    texts, ends = literals.literal_tree(g, q)
    assert sorted(texts) == [b'name":', b'named":', b'nap":', b'ok":', b'okay":', b'zeta":']
    assert all(g.fork_states[e] for e in ends)  # each ends where its value is called


def test_literal_tree_refuses_classes_and_long_lists():
    from agentkv.grammar import literals

    info = TokenizerInfo(TREE_WORDS + [None], eos_ids=[len(TREE_WORDS)])
    compiler = GrammarCompiler(info)
    g = compiler.compile_regex("[ -~]+")  # 95 bytes: more than TREE_ROOT
    assert literals.literal_tree(g, g.stacks(g.initial)[0][-1]) is None
    g = compiler.compile_regex("[a-z]+")  # 26 texts of one byte, each ending where 26 bytes go on
    texts, ends = literals.literal_tree(g, g.stacks(g.initial)[0][-1])
    assert len(texts) == 26 and len(set(ends)) == 1
    values = ["".join(p) for p in itertools.product("abcd", repeat=4)]  # 256 texts, 4 ways at each byte
    assert len(values) > literals.TREE_TEXTS
    many = compiler.compile_json_schema({"enum": values})
    (q,) = [s[-1] for s in many.stacks(many.advance(many.initial, b'"'))]
    assert literals.literal_tree(many, q) is None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schema,start", [
    ({"type": "string", "maxLength": 24}, '"'), ({"type": "string", "minLength": 3, "maxLength": 31}, '"'),
    ({"type": "object", "properties": {"d": {"type": "string", "maxLength": 27}}, "required": ["d"],
      "additionalProperties": False}, '{"d":"'),
    ({"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2}, '["')])
def test_positions_of_a_long_string_share_their_walk(schema, start, seed):
    # Along a string of at most N characters, a position whose chain end lies further than the longest
    # token walks every token like the next one (shifts.py): their masks are one walk, and right up
    # to the end, where they differ, each mask is still the brute-force one.
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
    walks = list(g._state_tokens.values())
    assert len({id(w) for w in walks}) < len(walks)  # some positions took another's walk


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


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 5}, {"type": "string", "minLength": 2, "maxLength": 4},
    *({"type": "string", "maxLength": n} for n in (6, 7, 8, 14, 15, 16, 40)),  # the longest token has 7 characters
    *({"type": "string", "pattern": f"^.{{{n}}}[ab]"} for n in (6, 7, 8)),  # a chain, then characters going two ways
    {"type": "string", "pattern": "^a{2,3}[^b]*$"}, {"type": "object", "propertyNames": {"maxLength": 3}},
    {"type": "array", "items": {"type": "string", "maxLength": 2}},
    r'start: w "\n" w' + "\n" + r'w: /[^"\\\x00-\x1f]+/',  # returns after any character: a chain ends on a fork
])
def test_plain_runs_follow_their_definition(schema):
    # plain_run fills in every state along the chain it followed; each must equal its own chain,
    # followed from that state (in any order of first use).
    info = TokenizerInfo([bytes([c]) for c in range(0x20, 0x7F)] + [b"abcdefg", None], eos_ids=[96])
    limit = len(info.plain_bounds) - 2

    def chain(g, q):
        seen, n = {q}, 0
        while n < limit:
            nxt = g.plain_next(q)
            if nxt == char_steps.ALL_DEAD:
                return n, "dead"
            if nxt == char_steps.NONUNIFORM:
                return n, "walk"
            if nxt in seen:
                return limit, "dead"
            n, q = n + 1, nxt
            if g.fork_states[nxt]:
                return n, "walk"
            seen.add(nxt)
        return n, "dead"

    for order in (1, -1):
        compiler = GrammarCompiler(info)
        g = compiler.compile_lark(schema) if isinstance(schema, str) else compiler.compile_json_schema(schema)
        for q in range(g.num_states)[::order]:
            assert g.plain_run(q) == chain(g, q), (schema, q)


@settings(max_examples=40, deadline=None)
@given(vocabularies(), st.integers(0, 6))
def test_plain_text_tables(info, n):
    # The vocabulary tables the walk's shortcuts read, against their definitions: plain_ahead, the
    # bytes of the run of plain characters from each offset (0 inside a character); plain_upto(n),
    # the plain tokens of 1..n characters.
    def plain_run(b: bytes, o: int) -> int:
        if o < len(b) and b[o] & 0xC0 == 0x80:
            return 0
        for k in range(len(b) - o, 0, -1):
            try:
                text = b[o:o + k].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if all(c >= " " and c not in '"\\\u2028\u2029' for c in text):
                return k
        return 0

    for t, b in enumerate(info.vocab):
        if b is not None:
            assert [int(info.plain_ahead[o, t]) for o in range(len(b))] == [plain_run(b, o) for o in range(len(b))], b
    bits = np.unpackbits(info.plain_upto(n).view(np.uint8), bitorder="little")[:info.vocab_size]
    assert set(np.nonzero(bits)[0].tolist()) == {t for t in range(info.vocab_size) if 1 <= info.plain_chars[t] <= n}
    # stopped_by(reads): the tokens whose plain run from the start stops at a byte of `reads`
    # (whole, not a plain character cut short), kept per set of bytes
    reads = np.zeros(256, dtype=bool)
    reads[[ord('"'), ord("\\"), 0x20 + n]] = True
    expected = {t for t, b in enumerate(info.vocab) if b and info.plain_ahead[0, t] < len(b)
                and reads[b[info.plain_ahead[0, t]]] and not _cut_plain_char(b[info.plain_ahead[0, t]:])}
    stopped = info.stopped_by(reads)
    assert set(stopped.ids.tolist()) == expected and stopped is info.stopped_by(reads.copy())
    # and where each stops: its plain run's bytes, the byte there and the byte after it (256: none)
    for t, h, c, a in zip(*(x.tolist() for x in (stopped.ids, stopped.heads, stopped.stop, stopped.after))):
        b = info.vocab[t]
        assert (h, c, a) == (info.plain_ahead[0, t], b[h], b[h + 1] if h + 1 < len(b) else 256)


@settings(max_examples=30, deadline=None)
@given(vocabularies(), st.lists(st.sets(st.sampled_from(b'ab01 {}[],:"\\'), min_size=1), min_size=2, max_size=6))
def test_set_masks_kept_per_set(info, sets):
    # The tokenizer keeps per set of bytes the packed masks a walk derives from its tables (several
    # sets in turn, often of one size, each asked twice): `groups_mask`, the plain tokens whose first
    # character is one of them; `later_any`, the tokens holding one of them after their first byte.
    from agentkv.grammar.token_groups import groups_mask

    def ids(words):
        return set(np.nonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:info.vocab_size])[0].tolist())

    for chars in sets * 2:
        plain = np.array(sorted(c for c in chars if c not in b'"\\'), dtype=np.int64)
        if len(plain):
            assert ids(groups_mask(info, plain)) == {
                t for t, b in enumerate(info.vocab) if b and info.plain_chars[t] > 0 and b[0] in plain.tolist()}
        rows = tuple(sorted(chars))
        assert ids(info.later_any(rows)) == {t for t, b in enumerate(info.vocab) if b and set(b[1:]) & chars}
