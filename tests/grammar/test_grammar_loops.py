"""Masks through loops over a class, against brute force over small vocabularies: a loop over some
longer characters and not others, long tokens through loops, tokens that leave a loop, and a first
character before a class loop."""

import numpy as np
import pytest

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from tests.grammar_helpers import assert_mask_is_brute_force, compile_one

pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: the native walk and the Python one

LONG = [b" " * 20, b" " * 12 + b"\n", b"-" * 30, b"-" * 9 + b"1", b"a" * 11 + b"1" + b"a" * 9, b"b" * 20,
        b"b" * 19 + b"x", b"a" + b"b" * 18 + b"x", b" " * 10 + b'"', b" " * 10 + "é".encode() * 3,
        b"x" * 10 + "é".encode()[:1], "é".encode() * 6, "é".encode() + b" " * 12, b"1" + b" " * 12]


@pytest.mark.parametrize("inside", ['"', '"a', '"a\u00e9'])
@pytest.mark.parametrize("more", [[], ["\u00fc", "\u0436x", "\u00df\u00df", "\u00f6 ", "\u00f6 a", "\u00e4\"",
                                   "\U0001f600", "\u0444\u00a0", "\u4e2d a", "\U0001f600 b", "\u00a0x", "\u00a0xa",
                                   "\u3000x"]])
@pytest.mark.parametrize("pattern", ["^\\S+$", "^\\S+( \\S+)*$", "^(\\S|\u00a0x)+$"])  # a space, a space with an x
def test_class_loops_over_some_longer_characters(inside, more, pattern):
    # `\S` loops on most characters but not on the Unicode spaces (U+00A0, U+3000): no text loop
    # (the walk steps each token), and a token holding a space after its first character dies.
    nbsp, ideo = "\u00a0", "\u3000"
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [w.encode() for w in [
        "\u00e9", "a\u00e9", "a\u00e9\u00e9b", "\u00e9a", "\u00e9\u00e9", "\u4e2d\u6587", "x\u4e2d",
        "a" + nbsp, "a" + nbsp + "b", nbsp, "\u00e9" + nbsp, "ab" + ideo, ideo + "a", "b\u00e9" + ideo, *more]]
    words += ["a\u00e9".encode()[:-1], "\u4e2d".encode()[:2]]  # ending inside a character
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    m = Matcher(GrammarCompiler(info).compile_json_schema({"type": "string", "pattern": pattern}))
    assert m.accept_bytes(inside.encode())
    allowed = assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    assert words.index("a\u00e9\u00e9b".encode()) in allowed
    assert (words.index(("a" + nbsp).encode()) in allowed) == (nbsp in pattern)  # (only an x after it)


@pytest.mark.parametrize("kind,source,inside", [
    # a substring the string must contain; a class; a class with multi-byte characters
    ("schema", {"type": "string", "pattern": "a1"}, '"'),
    ("schema", {"type": "string", "pattern": "a1"}, '"xa'),
    ("schema", {"type": "string", "pattern": "a1"}, '"a1'),
    ("schema", {"type": "string", "pattern": "^[^b]*$"}, '"'),
    ("schema", {"type": "string", "pattern": "^[ -~é]*$"}, '"x'),
    ("schema", {"type": "object", "additionalProperties": {"type": "string", "pattern": "1"}}, '{"'),
    # a loop in a rule that can return mid-token: its bytes may be read by the rule after it
    ("lark", 'start: w v\nw: /[ab]+/\nv: /bbbx/', ""),
    ("regex", r"[ab]+b*x|-+1?", ""),
])
def test_long_tokens_through_loops(kind, source, inside):
    # Tokens much longer than a walk's first steps, through states that loop on most characters:
    # the tokens whose other bytes all loop are allowed as a block, and a walk still going after a
    # few steps skips the looping bytes ahead (not on a state that can return, where a byte could
    # also be read by the caller).
    words = [bytes([c]) for c in b'ab1x- "\\'] + ["é".encode()] + LONG
    words += [b"b" * n + b"1" + b"b" * 8 for n in range(17, 27)]  # one byte that stops a loop, anywhere ahead
    info = TokenizerInfo(list(dict.fromkeys(words)) + [None], eos_ids=[len(dict.fromkeys(words))])
    compiler = GrammarCompiler(info)
    g = compiler.compile_lark(source) if kind == "lark" else compile_one(compiler, kind, source)
    m = Matcher(g)
    assert m.accept_bytes(inside.encode())
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    allowed = assert_mask_is_brute_force(m, bitmask)
    assert {info.vocab.index(t) for t in LONG} & allowed  # some long token is allowed: the walk had them


@pytest.mark.parametrize("kind,source,inside", [
    ("schema", {"type": "string", "pattern": "^[a-zA-Z]+( [a-zA-Z]+)*$"}, '"'),  # a space leaves the loop
    ("schema", {"type": "string", "pattern": "^[a-zA-Z]+( [a-zA-Z]+)*$"}, '"ab '),
    ("lark", 'start: w "y"\nw: /[a-wA-W]+/', ""),  # the loop's rule returns: "y" is read by its caller
    ("lark", 'start: w "y"\nw: /[a-wA-W]+/ | "-" w', "-"),
])
def test_tokens_leaving_a_class_loop(kind, source, inside):
    # From a state whose first characters lead into a loop over a class, a token that does not end in
    # the loop lives on only where it holds a byte the loop state reads elsewhere (a space, a quote);
    # where the loop's rule can return, any byte may be read by the caller.
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [
        b"ab cd", b'ab"', b'ab cd"', b"aby", b"Aby", b"ab.", b"ab\n", b"-ab", b"-aby", b'ab",', rb"ab\u", rb"ab\u00e9",
        "abé".encode(), "ab é".encode(), b"abcdefghij", b"ab cdefghi"]
    info = TokenizerInfo(list(dict.fromkeys(words)) + [None], eos_ids=[len(dict.fromkeys(words))])
    compiler = GrammarCompiler(info)
    g = compiler.compile_lark(source) if kind == "lark" else compile_one(compiler, kind, source)
    m = Matcher(g)
    assert m.accept_bytes(inside.encode())
    allowed = assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    leaving = [b"ab cd", b'ab"', b'ab cd"'] if kind == "schema" else [b"aby", b"Aby"]
    assert {info.vocab.index(t) for t in leaving} & allowed


@pytest.mark.parametrize("pattern", [
    "^[a-z0-9-]+(\\.[a-z0-9-]+)*$",  # a dot, then a hostname's label: its tokens end in the label
    "^[^.]+(\\.[^.]+)*$",  # the label takes longer characters too
    "^[a-z]+(\\.[a-z][a-z0-9]*)*$",  # the label loops on digits the dot does not lead to it
    "^[a-z]+(\\.[a-zA-Z\u00e9]+)*$",  # one longer character: the label's go different ways
    "^[a-z]+(\\.[a-zA-Z][a-zA-Z\u00e9]*)*$",  # and the dot does not lead it there
    "^[a-z]+(\\.[ -\\-/-\u007f][^.]*)*$",  # the label takes every longer character, the dot none
])
@pytest.mark.parametrize("inside", ['"ab', '"ab.cd'])
def test_a_first_character_before_a_class_loop(pattern, inside):
    # A first character (a dot) leading every plain byte to one state that loops over a class.
    words = [bytes([c]) for c in range(0x20, 0x7F)] + [w.encode() for w in [
        ".com", ".js", ".a1-b", ".ab.cd", ".Ab", ".a b", '.ab"', ".a\u00e9", ".\u00e9", ".ab\n", ".1a", "..", ".a.",
        ".abcdefghijkl", "ab.cd", "\u00e9", "a\u00e9b", ".\u00e9a", ".1", ".a\u00e9\u00e9"]]
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = GrammarCompiler(info).compile_json_schema({"type": "string", "pattern": pattern})
    m = Matcher(g)
    assert m.accept_bytes(inside.encode())
    allowed = assert_mask_is_brute_force(m, np.zeros((1, info.words), dtype=np.int32))
    assert words.index(".com".encode()) in allowed


@pytest.mark.parametrize("n", range(10, 22))
def test_skipping_a_loop_up_to_a_tokens_end(n):
    # The only long token left when the walk skips looping bytes may end exactly where the first
    # round of the skip does: the second round then has nothing to read (and the mask is the same).
    words = [bytes([c]) for c in b"ab-x"] + [b"-" + b"b" * n]
    info = TokenizerInfo(words + [None], eos_ids=[len(words)])
    g = compile_one(GrammarCompiler(info), "regex", r"-?[ab]+x")
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    assert 4 in assert_mask_is_brute_force(Matcher(g), bitmask)
