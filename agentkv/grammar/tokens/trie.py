"""The tokenizer's byte trie, flattened as the token walk reads it (tokens/walk.py, csrc/token_walk.c).

Nodes in pre-order over the tokens sorted by their bytes: node i is a byte at some depth, its
subtree is nodes [i + 1, next[i]) and its tokens are the sorted tokens [tok[i], tok[next[i]]) (a
subtree's tokens are contiguous in byte order), the first n_end[i] of which end at node i. So a
walk that finds no parser stack reading a node's byte skips the whole subtree, and every token
extending a prefix steps that prefix once.

`text_chars[i]` is, where every token below node i reads plain text from there on (printable
ASCII but the quote and backslash, and well-formed UTF-8 characters but U+2028 and U+2029, the
last one may be cut short), the most characters any of them reads past the node; -1 where one reads something else.
From a grammar state where every plain text of that many characters survives (a string body, an
open object's names, a string with room for that many more), the walk allows the subtree without
stepping it. `root_chars[i]` is the same counted from the tokens' first byte (-1 unless the path to
node i is plain text too), and `plain_masks[k]` the packed mask of the tokens that are plain text of
at most k characters: a walk from a state that reaches k characters takes that mask at once and
skips every subtree with root_chars within k (setting 100k bits one by one took ~0.3 ms).
`below_bytes[i]` is the set of bytes the tokens below node i read past it, and `depth_below[i]` the
most of them one token reads: from a state whose class of bytes carries any text of that class that
far (a loop over a class, `[a-z0-9-]+`; a counted repetition with that much room, `[^.]{1,32}`),
the subtree is allowed unwalked. Past ASCII a class is read by characters: `wide_below[i]` says the
tokens below read wide text (WIDE_PHASES), and a state whose class also takes every wide character
(`[^./]+`, `\\S+`, `.+`) allows such a subtree when its ASCII bytes are in the class.

Built with numpy a column (byte offset) at a time: ~0.2 s for a 151k vocabulary (333k nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

# Plain text as a byte automaton: phase -> (first byte, last byte, next phase). Phase 0 is a
# character boundary; the others are inside a UTF-8 character (the ranges RFC 3629 allows, so no
# surrogates and nothing past U+10FFFF). U+2028 and U+2029 (E2 80 A8/A9) are not plain: they are the
# line terminators an ECMA `.` refuses, so a string under a `.*` pattern reads every plain text (a
# text loop) and the few tokens holding them are stepped. Grammar states' reach in plain text
# (state_tables.text_reach) reads the same table.
NO_TOKENS = np.zeros(0, dtype=np.int64)
BOUNDARY = 0
TEXT_PHASES: tuple[tuple[tuple[int, int, int], ...], ...] = (
    ((0x20, 0x21, 0), (0x23, 0x5B, 0), (0x5D, 0x7E, 0), (0xC2, 0xDF, 1), (0xE0, 0xE0, 4), (0xE1, 0xE1, 2),
     (0xE2, 0xE2, 8), (0xE3, 0xEC, 2), (0xED, 0xED, 5), (0xEE, 0xEF, 2), (0xF0, 0xF0, 6), (0xF1, 0xF3, 3),
     (0xF4, 0xF4, 7)),
    ((0x80, 0xBF, 0),),   # 1: one continuation byte left
    ((0x80, 0xBF, 1),),   # 2: two
    ((0x80, 0xBF, 2),),   # 3: three
    ((0xA0, 0xBF, 1),),   # 4: after E0 (no overlong forms)
    ((0x80, 0x9F, 1),),   # 5: after ED (no surrogates)
    ((0x90, 0xBF, 2),),   # 6: after F0 (no overlong forms)
    ((0x80, 0x8F, 2),),   # 7: after F4 (nothing past U+10FFFF)
    ((0x80, 0x80, 9), (0x81, 0xBF, 1)),  # 8: after E2
    ((0x80, 0xA7, 0), (0xAA, 0xBF, 0)),  # 9: after E2 80 (not U+2028, U+2029)
)
# Wide text, the other alphabet the walk knows: any ASCII byte, and well-formed UTF-8 characters past
# ASCII but the spaces (those ECMA's `\s` matches: U+00A0, U+1680, U+2000-200A, U+2028, U+2029,
# U+202F, U+205F, U+3000, U+FEFF). A class of bytes (`[^./]`, `\S`, `.`) reads its ASCII bytes one by
# one and every wide character past ASCII: the walk checks the ASCII bytes below a node against the
# class (below_bytes) and the rest against this table (wide_below). Phases 1-7 are TEXT_PHASES'.
WIDE_PHASES: tuple[tuple[tuple[int, int, int], ...], ...] = (
    ((0x00, 0x7F, 0), (0xC2, 0xC2, 8), (0xC3, 0xDF, 1), (0xE0, 0xE0, 4), (0xE1, 0xE1, 9), (0xE2, 0xE2, 11),
     (0xE3, 0xE3, 14), (0xE4, 0xEC, 2), (0xED, 0xED, 5), (0xEE, 0xEE, 2), (0xEF, 0xEF, 16), (0xF0, 0xF0, 6),
     (0xF1, 0xF3, 3), (0xF4, 0xF4, 7)),
    *TEXT_PHASES[1:8],
    ((0x80, 0x9F, 0), (0xA1, 0xBF, 0)),  # 8: after C2 (not U+00A0)
    ((0x80, 0x99, 1), (0x9A, 0x9A, 10), (0x9B, 0xBF, 1)),  # 9: after E1
    ((0x81, 0xBF, 0),),  # 10: after E1 9A (not U+1680)
    ((0x80, 0x80, 12), (0x81, 0x81, 13), (0x82, 0xBF, 1)),  # 11: after E2
    ((0x8B, 0xA7, 0), (0xAA, 0xAE, 0), (0xB0, 0xBF, 0)),  # 12: after E2 80 (not U+2000-200A, 2028, 2029, 202F)
    ((0x80, 0x9E, 0), (0xA0, 0xBF, 0)),  # 13: after E2 81 (not U+205F)
    ((0x80, 0x80, 15), (0x81, 0xBF, 1)),  # 14: after E3
    ((0x81, 0xBF, 0),),  # 15: after E3 80 (not U+3000)
    ((0x80, 0xBA, 1), (0xBB, 0xBB, 17), (0xBC, 0xBF, 1)),  # 16: after EF
    ((0x80, 0xBE, 0),),  # 17: after EF BB (not U+FEFF)
)


@dataclass(frozen=True)
class TokenTrie:
    byte: np.ndarray        # [n] uint8
    next: np.ndarray        # [n] int32
    depth: np.ndarray       # [n] int32: bytes read at the node, its own included
    tok: np.ndarray         # [n + 1] int32: first sorted token of the subtree (tok[n] = number of tokens)
    n_end: np.ndarray       # [n] int32
    text_chars: np.ndarray  # [n] int32
    root_chars: np.ndarray  # [n] int32
    plain_masks: np.ndarray  # [max_len + 1, words] uint32
    below_bytes: np.ndarray  # [n, 4] uint64: the bytes any token below reads past the node (a 256-bit set)
    depth_below: np.ndarray  # [n] int32: the most bytes a token below reads past the node
    wide_below: np.ndarray  # [n] uint8: every token below reads wide text past the node (WIDE_PHASES)
    sorted_ids: np.ndarray  # [tokens] int32: token ids in byte order
    root_child: np.ndarray  # [256] int32: the root's child for each byte (-1: none)
    max_len: int

    @property
    def n_nodes(self) -> int:
        return len(self.byte)

    @cached_property
    def _lists(self) -> tuple[list, ...]:
        return tuple(x.tolist() for x in (self.byte, self.next, self.depth, self.tok, self.n_end, self.text_chars,
                                          self.root_chars, self.depth_below, self.wide_below))

    def lists(self) -> tuple[list, ...]:
        """byte, next, depth, tok, n_end, text_chars, root_chars, depth_below and wide_below as lists
        (the Python walk indexes them one at a time)."""
        return self._lists

    @cached_property
    def _below_sets(self) -> list[int]:
        return [int.from_bytes(r.tobytes(), "little") for r in self.below_bytes]

    def below_sets(self) -> list[int]:
        """below_bytes as Python ints (256-bit sets; the Python walk's)."""
        return self._below_sets

    @cached_property
    def _first_nodes(self) -> list[int]:
        """The root's child per byte (-2: none): a lookup's first step, past up to 256 siblings."""
        return [c if c >= 0 else -2 for c in self.root_child.tolist()]

    def node_of(self, text: bytes) -> int:
        """The node at the end of `text`'s path (-1: the root, for empty text; -2: no token starts so)."""
        if not text:
            return -1
        byte, nxt = self.lists()[:2]
        node = self._first_nodes[text[0]]
        for b in text[1:]:
            if node < 0:
                return -2
            i, end = node + 1, nxt[node]
            while i < end and byte[i] != b:
                i = nxt[i]
            if i >= end:
                return -2
            node = i
        return node

    def tokens_past(self, text: bytes) -> np.ndarray:
        """The ids of the tokens that start with `text` and run past its end."""
        node = self.node_of(text)
        if node == -2:
            return NO_TOKENS
        if node == -1:
            return self.sorted_ids.astype(np.int64)
        return self.sorted_ids[self.tok[node] + self.n_end[node]:self.tok[self.next[node]]].astype(np.int64)


def packed_has(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of the token `ids` has its bit set in the packed mask `words` (bool per id)."""
    return ((words.view(np.uint32)[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


def build_trie(info) -> TokenTrie:
    """The trie of `info`'s text tokens (TokenizerInfo: their bytes and byte order)."""
    sorted_ids = info.sorted_id_array
    n_tok = len(sorted_ids)
    lengths = info.lengths[sorted_ids].astype(np.int64)
    width = int(lengths.max(initial=0))
    # cols[d, k]: byte d of the k-th token in byte order (0 past its end), one contiguous row per offset
    flat = np.frombuffer(b"".join(info.vocab[i] for i in sorted_ids.tolist()), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    rows = np.repeat(np.arange(n_tok), lengths)
    cols = np.zeros((width, n_tok), dtype=np.uint8)
    cols[np.arange(len(flat)) - starts[rows], rows] = flat
    ids = np.arange(n_tok)  # (columns are already in byte order)
    # lcp[k]: bytes token k shares with token k - 1 (0 for the first)
    lcp = np.zeros(n_tok, dtype=np.int64)
    same = np.ones(max(n_tok - 1, 0), dtype=bool)
    for d in range(width):
        col = cols[d, ids]
        same &= (col[1:] == col[:-1]) & (d < lengths[1:]) & (d < lengths[:-1])
        if not same.any():
            break
        lcp[1:] += same
    new = lengths - lcp  # nodes each token adds (0 for a token with the same bytes as the one before)
    node_tok = np.repeat(np.arange(n_tok), new)
    first_node = np.concatenate([[0], np.cumsum(new)])  # [n_tok + 1]
    node_depth = lcp[node_tok] + 1 + np.arange(len(node_tok)) - first_node[node_tok]
    n = len(node_tok)
    byte = cols[node_depth - 1, ids[node_tok]].astype(np.uint8) if n else np.zeros(0, np.uint8)
    # tokens ending at a node: its own, and any with the same bytes right after it
    ends = new > 0
    own = np.flatnonzero(ends)
    run = np.diff(np.concatenate([own, [n_tok]]))
    n_end = np.zeros(n, dtype=np.int32)
    n_end[first_node[own + 1] - 1] = run
    # next[i]: the first node of the first token after the subtree, whose lcp is under the node's depth
    nxt = np.empty(n, dtype=np.int64)
    text_chars = np.full(n, -1, dtype=np.int32)
    root_chars = np.full(n, -1, dtype=np.int32)
    depth_below = np.zeros(n, dtype=np.int32)
    plain = _plain_suffixes(cols, ids, lengths, width, TEXT_PHASES)
    wide = _plain_suffixes(cols, ids, lengths, width, WIDE_PHASES)
    wide_below = np.zeros(n, dtype=np.uint8)
    # characters (bytes that are no UTF-8 continuation) per token, and in its first d bytes
    starts_char = (cols < 0x80) | (cols >= 0xC0)
    chars = (starts_char & (np.arange(width)[:, None] < lengths)).sum(axis=0).astype(np.int64)
    chars_before = np.zeros(n_tok, dtype=np.int64)
    bad0 = np.concatenate([[0], np.cumsum(~plain[0])])  # tokens not plain text from their first byte
    by_depth = np.argsort(node_depth, kind="stable")
    bounds = np.searchsorted(node_depth[by_depth], np.arange(width + 2))
    for d in range(1, width + 1):
        chars_before += starts_char[d - 1] & (d - 1 < lengths)
        at = by_depth[bounds[d]:bounds[d + 1]]
        if not len(at):
            continue
        cut = np.flatnonzero(lcp < d)
        after = np.searchsorted(cut, node_tok[at], side="right")
        after_tok = np.append(cut, n_tok)[after]
        nxt[at] = first_node[after_tok]
        bad = np.concatenate([[0], np.cumsum(~plain[d])])  # plain[d][k]: token k's bytes from d are plain text
        all_plain = bad[after_tok] == bad[node_tok[at]]
        # the most characters below: the ranges at one depth are disjoint and in order (reduceat)
        edges = np.stack([node_tok[at], after_tok], axis=1).reshape(-1)
        most = np.maximum.reduceat(np.append(chars, 0), edges)[::2]
        text_chars[at] = np.where(all_plain, most - chars_before[node_tok[at]], -1)
        bad_wide = np.concatenate([[0], np.cumsum(~wide[d])])
        wide_below[at] = bad_wide[after_tok] == bad_wide[node_tok[at]]
        root_plain = bad0[after_tok] == bad0[node_tok[at]]
        root_chars[at] = np.where(root_plain, most, -1)
        depth_below[at] = np.maximum.reduceat(np.append(lengths, 0), edges)[::2] - d
    tok = np.append(node_tok, n_tok).astype(np.int32)
    # plain_masks[k]: the tokens that are plain text of 1..k characters
    words = (info.vocab_size + 31) // 32
    token_chars = np.full(words * 32, width + 1, dtype=np.int64)
    token_chars[sorted_ids] = np.where(plain[0], chars, width + 1)
    plain_masks = np.zeros((width + 1, words), dtype=np.uint32)
    for k in range(1, width + 1):
        plain_masks[k] = np.packbits(token_chars <= k, bitorder="little").view(np.uint32)
    below = _below_bytes(byte, node_depth, by_depth, bounds, width)
    root_child = np.full(256, -1, dtype=np.int32)
    roots = np.flatnonzero(node_depth == 1)
    root_child[byte[roots]] = roots
    return TokenTrie(byte, nxt.astype(np.int32), node_depth.astype(np.int32), tok, n_end, text_chars, root_chars,
                     plain_masks, below, depth_below, wide_below, sorted_ids.astype(np.int32), root_child, width)


def _below_bytes(byte, node_depth, by_depth, bounds, width) -> np.ndarray:
    """Per node, the 256-bit set of the bytes below it, from the deepest nodes up (a node's parent is
    the last node one level up before it in pre-order)."""
    n = len(byte)
    below = np.zeros((n, 4), dtype=np.uint64)
    own = np.zeros((n, 4), dtype=np.uint64)  # each node's own byte as a set
    own[np.arange(n), byte >> 6] = np.left_shift(np.uint64(1), (byte & 63).astype(np.uint64))
    for d in range(width, 1, -1):
        kids = by_depth[bounds[d]:bounds[d + 1]]
        ups = np.sort(by_depth[bounds[d - 1]:bounds[d]])
        if not len(kids) or not len(ups):
            continue
        parent = ups[np.searchsorted(ups, kids) - 1]
        for w in range(4):
            np.bitwise_or.at(below[:, w], parent, below[kids, w] | own[kids, w])
    return below


def _plain_suffixes(cols, ids, lengths, width, table) -> dict[int, np.ndarray]:
    """offset d -> per sorted token, whether its bytes from d on are text of `table` (TEXT_PHASES or
    WIDE_PHASES) from a character boundary, the last character possibly cut short."""
    phases = len(table)
    ok = [np.ones(len(ids), dtype=bool) for _ in range(phases)]  # ok[p]: the rest accepted from phase p
    out = {}
    for d in range(width, -1, -1):
        if d < width:
            col = cols[d, ids]
            ended = d >= lengths
            nxt = []
            for p in range(phases):
                acc = ended.copy()
                for lo, hi, q in table[p]:
                    acc |= (col >= lo) & (col <= hi) & ok[q]
                nxt.append(acc)
            ok = nxt
        out[d] = ok[BOUNDARY]
    return out
