"""The per-tokenizer tables the token walk reads (masks.py), built on first use and shared by every
grammar compiled for the tokenizer: tokens grouped by first byte and by first plain character (as
id lists and as packed masks), which bytes occur after a token's first, and the characters of two
bytes or more that tokens hold (the tables of plain text runs are plain_tables.py's). "Plain" text
is what a JSON string body takes as is. TokenizerInfo (vocab.py) inherits these; it provides
`vocab`, `vocab_size`, `words`, `bytes_at`, `lengths`, `text_ids`, `plain_chars`, `plain_sorted`,
`plain_bounds`, `non_plain_ids` and `set_masks` (a BoundedCache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Characters a JSON string takes as they are, minus the ECMA line terminators U+2028/U+2029, which a
# pattern's `.` refuses: with them out, `.*` is a run of plain characters like any string body.
PLAIN_EXCLUDED = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x2028, 0x2029))
# The one-byte plain characters (where they do not all lead to one place, a state is not uniform).
ASCII_PLAIN = np.array([b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)])


def is_plain(c: str) -> bool:
    o = ord(c)
    return o >= 0x20 and o != 0x22 and o != 0x5C and o != 0x2028 and o != 0x2029  # PLAIN_EXCLUDED


@dataclass(frozen=True)
class FirstCharGroups:
    """Plain token ids grouped by first character (0-127: that ASCII byte; 256: any multi-byte
    character), each group ordered by character count."""

    ids: np.ndarray    # all groups, one after another
    edges: np.ndarray  # [258]: group g is ids[edges[g]:edges[g + 1]]
    under: np.ndarray  # [257, max characters + 2]: under[g, c], how many of group g have < c characters

    def group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[self.edges[g]:self.edges[g + 1]], self.under[g]


@dataclass(frozen=True)
class LongerChars:
    """The distinct characters of two or more bytes that plain tokens hold (after their first byte,
    or as their first character): stepping each from a state once tells every token holding it. Where
    a state's longer characters go different ways (a class without the Unicode spaces, `[^\\s]`), the
    tokens starting with one go on from where theirs leads, and those whose later ones all loop on a
    state are taken with the loop's block (plain_runs.py)."""

    chars: np.ndarray        # [C, 4] each character's UTF-8 bytes
    lengths: np.ndarray      # [C] its byte count
    first: np.ndarray        # plain tokens whose first character is one of them ...
    first_which: np.ndarray  # ... and its index
    by_first: tuple[np.ndarray, np.ndarray]  # those tokens by their first character, and its run's edges
    later: np.ndarray        # a plain token for each of them it holds after its first character ...
    later_which: np.ndarray  # ... and its index
    # A state's longer characters are stepped per distinct first two bytes, then the third and fourth
    # bytes of the characters that have them (token_groups.longer_char_steps):
    pair_bytes: tuple[np.ndarray, np.ndarray]  # the distinct pairs' first and second bytes ...
    pair_of: np.ndarray      # ... each character's pair,
    three: tuple[np.ndarray, np.ndarray]  # the characters of three bytes or more, and their third,
    four: tuple[np.ndarray, np.ndarray]   # those of four, and their fourth


class TokenTables:
    def _init_tables(self) -> None:
        self._later_bytes: np.ndarray | None = None
        self._first_byte_groups: list[np.ndarray] | None = None
        self._first_byte_masks: dict[int, np.ndarray] = {}
        self._non_plain_by_first_byte: list[np.ndarray] | None = None
        self._first_char_groups: FirstCharGroups | None = None
        self._first_char_masks: np.ndarray | None = None
        self._class_heads: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # class_chains.py
        self._longer_chars: LongerChars | None = None

    @property
    def first_byte_groups(self) -> list[np.ndarray]:
        """Per first byte, the text token ids that start with it (built on first use)."""
        if self._first_byte_groups is None:
            self._first_byte_groups = self._by_first_byte(self.text_ids)
        return self._first_byte_groups

    def first_byte_mask(self, b: int) -> np.ndarray:
        """Packed int32 mask of the text tokens that start with byte `b` (kept per byte)."""
        hit = self._first_byte_masks.get(b)
        if hit is None:
            bits = np.zeros(self.words * 32, dtype=bool)
            bits[self.first_byte_groups[b]] = True
            hit = self._first_byte_masks[b] = np.packbits(bits, bitorder="little").view("<i4")
            hit.flags.writeable = False
        return hit

    def _by_first_byte(self, ids: np.ndarray) -> list[np.ndarray]:
        """`ids` split by their first byte (256 arrays, each in the order of `ids`)."""
        first = self.bytes_at[0, ids]
        order = np.argsort(first, kind="stable")
        bounds = np.searchsorted(first[order], np.arange(257))
        return [ids[order[bounds[b]:bounds[b + 1]]] for b in range(256)]

    @property
    def non_plain_by_first_byte(self) -> list[np.ndarray]:
        """Per first byte, the text tokens that are not plain (built on first use)."""
        if self._non_plain_by_first_byte is None:
            self._non_plain_by_first_byte = self._by_first_byte(self.non_plain_ids)
        return self._non_plain_by_first_byte

    @property
    def first_char_groups(self) -> FirstCharGroups:
        """The plain tokens by first character (built on first use): group b for an ASCII byte b,
        group 256 for every multi-byte first character; within a group, by character count. A
        token mask from a state whose characters go different ways takes each group's short tokens
        as a block (walk_starts.py)."""
        if self._first_char_groups is None:
            plain = self.plain_chars
            top = int(plain.max(initial=0)) + 2
            ids = self.text_ids[plain[self.text_ids] > 0]
            first = self.bytes_at[0, ids].astype(np.int64)
            key = np.where(first < 0x80, first, 256)
            order = np.lexsort((plain[ids], key))
            ids, key = ids[order], key[order]
            edges = np.searchsorted(key, np.arange(258))
            under = np.stack([np.searchsorted(plain[ids[edges[g]:edges[g + 1]]], np.arange(top)) for g in range(257)])
            self._first_char_groups = FirstCharGroups(ids, edges, under)
        return self._first_char_groups

    @property
    def first_char_masks(self) -> np.ndarray:
        """[258, words] int32: packed masks of `first_char_groups` (row 256: a multi-byte first
        character), row 257 their union over the ASCII characters (built on first use)."""
        if self._first_char_masks is None:
            groups = self.first_char_groups
            out = np.zeros((258, self.words), dtype="<i4")
            bits = np.zeros(self.words * 32, dtype=bool)
            for g in [*ASCII_PLAIN.tolist(), 256]:
                ids = groups.group(g)[0]
                bits[ids] = True
                out[g] = np.packbits(bits, bitorder="little").view("<i4")
                bits[ids] = False
            out[257] = np.bitwise_or.reduce(out[ASCII_PLAIN], axis=0)
            out.flags.writeable = False
            self._first_char_masks = out
        return self._first_char_masks

    @property
    def later_bytes(self) -> np.ndarray:
        """[258, words] packed token masks (built on first use): row b, the tokens in which byte b
        occurs after the first byte; row 256, those with any byte from 0x80 there; row 257, those that
        also are not plain text. Where the first character leads to a state that loops on most bytes,
        the tokens whose other bytes all loop there are allowed at once (walk_starts.py)."""
        if self._later_bytes is None:
            tb = self.bytes_at.T
            rows, cols = np.nonzero(np.arange(1, tb.shape[1])[None, :] < self.lengths[:, None])
            has = np.zeros((258, self.words * 32), dtype=bool)
            has[tb[rows, cols + 1], rows] = True
            has[256] = has[0x80:256].any(axis=0)
            has[257, :self.vocab_size] = has[256, :self.vocab_size] & (self.plain_chars <= 0)
            self._later_bytes = np.packbits(has, axis=1, bitorder="little").view("<u4")
        return self._later_bytes

    def later_any(self, rows: tuple[int, ...]) -> np.ndarray:
        """Packed uint32, read-only: the tokens holding, after their first byte, one of the bytes
        `rows` (rows of `later_bytes`, 256 for any byte from 0x80), kept per set in `set_masks`: the
        bytes a state's loop is left by recur across states and grammars, and an OR of ~50 rows
        costs ~60 us at 151k."""
        def make() -> np.ndarray:
            out = np.bitwise_or.reduce(self.later_bytes[list(rows)], axis=0)
            out.flags.writeable = False
            return out

        return self.set_masks.get_or_put(("later", rows), make)

    @property
    def longer_chars(self) -> LongerChars:
        """The characters of two or more bytes in plain tokens, and where tokens hold them (built on
        first use; see LongerChars)."""
        if self._longer_chars is None:
            has = np.unpackbits(self.later_bytes[256].view(np.uint8), bitorder="little")[:self.vocab_size]
            index: dict[str, int] = {}
            later, later_which, first, first_which = [], [], [], []
            for t in np.nonzero(has.astype(bool) & (self.plain_chars > 0))[0].tolist():
                text = self.vocab[t].decode("utf-8")
                if ord(text[0]) >= 0x80:
                    first.append(t)
                    first_which.append(index.setdefault(text[0], len(index)))
                for c in set(text[1:]):
                    if ord(c) >= 0x80:
                        later.append(t)
                        later_which.append(index.setdefault(c, len(index)))
            chars = np.zeros((len(index), 4), dtype=np.int64)
            lengths = np.zeros(len(index), dtype=np.int64)
            for c, i in index.items():
                b = c.encode("utf-8")
                chars[i, :len(b)] = list(b)
                lengths[i] = len(b)
            pairs, pair_of = np.unique(chars[:, :2], axis=0, return_inverse=True)
            first, first_which = np.array(first, dtype=np.int64), np.array(first_which, dtype=np.int64)
            order = np.argsort(first_which, kind="stable")
            edges = np.searchsorted(first_which[order], np.arange(len(index) + 1))
            self._longer_chars = LongerChars(chars, lengths, first, first_which, (first[order], edges),
                                             np.array(later, dtype=np.int64), np.array(later_which, dtype=np.int64),
                                             (pairs[:, 0].copy(), pairs[:, 1].copy()), pair_of.reshape(-1),
                                             *((rows, chars[rows, k].copy()) for k, rows in
                                               ((2, np.flatnonzero(lengths >= 3)), (3, np.flatnonzero(lengths >= 4)))))
        return self._longer_chars
