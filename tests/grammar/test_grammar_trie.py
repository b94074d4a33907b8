"""The tokenizer's byte trie (tokens/trie.py) against the vocabulary it holds: every token once in
byte order, and each node's plain-text and wide-text facts against Python's UTF-8 decoder."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.grammar import TokenizerInfo
from agentkv.grammar.tokens.trie import WIDE_PHASES, build_trie

E = "é".encode()
BYTES = [b"a", b"b", b"1", b'"', b"\\", b" ", b"\n", b"\x7f", b"{", b":", *(bytes([c]) for c in E),
         *(bytes([c]) for c in "中".encode()), b"\xed", b"\xa0", b"\xf0", b"\x9f", b"\xf4", b"\x90", b"\xc0",
         *(bytes([c]) for c in "\u2028".encode()), b"\xa9", b"\xc2", b"\xe3", b"\xef", b"\xbb", b"\xbf"]
SPACES = "\u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000\ufeff"


def whole_characters(data: bytes) -> str | None:
    """`data` decoded by Python's UTF-8 decoder, a last character cut short left out (None: not UTF-8)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.end != len(data) or not e.reason.startswith("unexpected end"):
            return None
        return whole_characters(data[:e.start])


def is_plain_text(data: bytes) -> bool:
    """token_trie's plain text: printable ASCII but the quote and backslash, and whole characters
    past ASCII but the line separators U+2028 and U+2029, the last of which may be cut short."""
    text = whole_characters(data)
    return text is not None and all(
        (ord(c) >= 0x80 and c not in "\u2028\u2029") or (0x20 <= ord(c) < 0x7F and c not in '"\\') for c in text)


def is_wide_text(data: bytes) -> bool:
    """token_trie's wide text: any ASCII, and whole characters past ASCII but the spaces ECMA's \\s
    matches, the last of which may be cut short."""
    text = whole_characters(data)
    return text is not None and not any(c in SPACES for c in text)


def n_chars(data: bytes) -> int:
    """Characters (a last one cut short counts) in plain text."""
    return sum(1 for c in data if not 0x80 <= c < 0xC0)


vocabs = st.lists(st.lists(st.sampled_from(BYTES), min_size=1, max_size=6).map(b"".join), min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(vocabs, st.integers(0, 3))
def test_the_trie_holds_every_token_once_in_byte_order(words, twins):
    vocab = words + words[:twins] + [None]  # twins: tokens with the same bytes
    info = TokenizerInfo(vocab, eos_ids=[len(vocab) - 1])
    trie = build_trie(info)
    ordered = [info.vocab[t] for t in trie.sorted_ids.tolist()]
    assert ordered == sorted(b for b in vocab if b)
    path: list[int] = []
    for i in range(trie.n_nodes):
        path = path[:trie.depth[i] - 1] + [int(trie.byte[i])]
        here = bytes(path)
        below = ordered[trie.tok[i]:trie.tok[trie.next[i]]]
        # the subtree holds exactly the tokens starting with its path, those ending here first
        assert below == [b for b in ordered if b.startswith(here)]
        assert below[:trie.n_end[i]] == [b for b in below if b == here]
        plain = all(is_plain_text(b[len(here):]) for b in below)
        most = max(n_chars(b[len(here):]) for b in below)
        assert trie.text_chars[i] == (most if plain else -1), (here, below)
        below_set = int.from_bytes(trie.below_bytes[i].tobytes(), "little")
        assert below_set == sum(1 << c for c in {c for b in below for c in b[len(here):]}), (here, below)
        assert trie.depth_below[i] == max(len(b) for b in below) - len(here)
        assert trie.wide_below[i] == all(is_wide_text(b[len(here):]) for b in below), (here, below)
        whole = all(is_plain_text(b) for b in below)
        assert trie.root_chars[i] == (max(map(n_chars, below)) if whole else -1), (here, below)
        if trie.next[i] > i + 1:
            assert trie.depth[i + 1] == trie.depth[i] + 1  # a first child
    assert trie.n_nodes == len({b[:k] for b in ordered for k in range(1, len(b) + 1)})
    roots = {int(trie.byte[i]): i for i in range(trie.n_nodes) if trie.depth[i] == 1}
    assert trie.root_child.tolist() == [roots.get(b, -1) for b in range(256)]
    for k in range(trie.max_len + 1):  # plain_masks[k]: the tokens that are plain text of at most k characters
        bits = np.unpackbits(trie.plain_masks[k].view(np.uint8), bitorder="little")
        assert set(np.flatnonzero(bits).tolist()) == {
            t for t, b in enumerate(vocab) if b and is_plain_text(b) and n_chars(b) <= k}


def test_wide_text_is_utf8_but_the_spaces():
    """WIDE_PHASES against Python's UTF-8: every character of the BMP and a sample past it, and the
    forms RFC 3629 forbids."""
    def accepted(data):
        p = 0
        for b in data:
            p = next((q for lo, hi, q in WIDE_PHASES[p] if lo <= b <= hi), None)
            if p is None:
                return False
        return p == 0
    for cp in [*range(0x110), *range(0x110, 0x10000, 3), *SPACES.encode("utf-32-le")[::4], 0x10000, 0x10FFFF]:
        c = chr(cp)
        if 0xD800 <= cp < 0xE000:
            continue
        assert accepted(c.encode()) == (c not in SPACES), hex(cp)
    for bad in (b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
                b"\x80"):
        assert not accepted(bad), bad
