"""The per-tokenizer tables the token walk reads (masks.py), built on first use and shared by every
grammar compiled for the tokenizer: tokens grouped by first byte and by first plain character (as
id lists and as packed masks), how much of each token from each offset is plain text (`plain_suffix`,
`plain_ahead`), the plain tokens of up to n characters, and which bytes occur after a token's first.
"Plain" text is what a JSON string body takes as is. TokenizerInfo (vocab.py) inherits these; it
provides `vocab`, `vocab_size`, `words`, `bytes_at`, `lengths`, `text_ids`, `plain_chars`,
`plain_sorted`, `plain_bounds` and `non_plain_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Characters a JSON string takes as they are, minus the ECMA line terminators U+2028/U+2029, which a
# pattern's `.` refuses: with them out, `.*` is a run of plain characters like any string body.
PLAIN_EXCLUDED = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x2028, 0x2029))
# The one-byte plain characters (where they do not all lead to one place, a state is not uniform).
ASCII_PLAIN = np.array([b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)])
MAX_STOP_SETS = 64  # sets of bytes whose `stopped_by` tokens are kept (a few thousand ids each)


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


@dataclass(frozen=True)
class StoppedTokens:
    """`TokenTables.stopped_by`: text tokens whose plain run from the start stops at a given set of
    bytes, each with that run's length in bytes, the byte it stops at and the byte after it (256: the
    token ends there). From a plain-text closure, a token's first two bytes past its run decide most
    (walk_starts.py)."""

    ids: np.ndarray
    heads: np.ndarray
    stop: np.ndarray
    after: np.ndarray


class TokenTables:
    def _init_tables(self) -> None:
        self._plain_suffix: np.ndarray | None = None
        self._plain_ahead: np.ndarray | None = None
        self._plain_upto: dict[int, np.ndarray] = {}
        self._later_bytes: np.ndarray | None = None
        self._first_byte_groups: list[np.ndarray] | None = None
        self._non_plain_by_first_byte: list[np.ndarray] | None = None
        self._first_char_groups: FirstCharGroups | None = None
        self._first_char_masks: np.ndarray | None = None
        self._plain_prefixes: tuple[np.ndarray, list[np.ndarray]] | None = None
        self._stopped_by: dict[bytes, StoppedTokens] = {}
        self._class_heads: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # class_chains.py
        self._non_plain_heads: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._longer_chars: LongerChars | None = None

    @property
    def first_byte_groups(self) -> list[np.ndarray]:
        """Per first byte, the text token ids that start with it (built on first use)."""
        if self._first_byte_groups is None:
            self._first_byte_groups = self._by_first_byte(self.text_ids)
        return self._first_byte_groups

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
    def plain_suffix(self) -> np.ndarray:
        """[width + 1, vocab] int16: characters in the token's bytes from each offset if they are plain
        text starting on a character boundary (0 at the token's end), else -1 (built on first use,
        once per tokenizer)."""
        if self._plain_suffix is None:
            tb, width = self.bytes_at.T, self.bytes_at.shape[0]
            out = np.full((self.vocab_size, width + 1), -1, dtype=np.int16)
            ascii_ids = self.text_ids[(tb[self.text_ids] < 0x80).all(axis=1)]
            # ASCII tokens (most of a vocabulary) at once: plain from `off` unless a byte at or
            # after it is a quote, backslash or control character.
            sub, lengths = tb[ascii_ids], self.lengths[ascii_ids].astype(np.int16)[:, None]
            pos = np.arange(width, dtype=np.int16)[None, :]
            inside = pos < lengths
            bad = ((sub < 0x20) | (sub == 0x22) | (sub == 0x5C)) & inside
            bad_from = np.flip(np.logical_or.accumulate(np.flip(bad, 1), axis=1), 1)
            chars = lengths - pos
            chars[bad_from | ~inside] = -1
            out[ascii_ids, :width] = chars
            rows, cols, vals = [], [], []
            for i in np.setdiff1d(self.text_ids, ascii_ids).tolist():
                b = self.vocab[i]
                start = 0
                while start < len(b) and b[start] & 0xC0 == 0x80:  # the tail of a character
                    start += 1
                try:
                    text = b[start:].decode("utf-8")
                except UnicodeDecodeError:
                    continue  # a broken character: no suffix that includes it is plain
                off = len(b)
                for n, c in enumerate(reversed(text), 1):
                    if not is_plain(c):
                        break
                    o = ord(c)
                    off -= 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
                    rows.append(i)
                    cols.append(off)
                    vals.append(n)
            out[rows, cols] = vals
            out[self.text_ids, self.lengths[self.text_ids]] = 0  # all read: a rest of no characters
            self._plain_suffix = np.ascontiguousarray(out.T)
        return self._plain_suffix

    def plain_upto(self, n: int) -> np.ndarray:
        """Packed int32 token mask of the plain tokens of 1..n characters (cached per n): a state whose
        plain characters lead along a chain of n takes them as one block (walk_starts.py)."""
        hit = self._plain_upto.get(n)
        if hit is None:
            bits = np.zeros(self.words * 32, dtype=bool)
            bits[self.plain_sorted[:self.plain_bounds[min(n + 1, len(self.plain_bounds) - 1)]]] = True
            hit = self._plain_upto[n] = np.packbits(bits, bitorder="little").view("<i4")
            hit.flags.writeable = False
        return hit

    @property
    def plain_ahead(self) -> np.ndarray:
        """[width, vocab] uint8: bytes of the run of plain characters that starts at each offset of the
        token (0 off a character boundary or before a byte that is not plain text; built on first
        use). A walk in a state that every plain character leads back to moves past the run at once."""
        if self._plain_ahead is None:
            tb, width = self.bytes_at.T, self.bytes_at.shape[0]
            out = np.zeros((self.vocab_size, width), dtype=np.uint8 if width < 256 else np.uint16)
            ascii_ids = self.text_ids[(tb[self.text_ids] < 0x80).all(axis=1)]
            # ASCII tokens at once: from each offset to the next byte that is not plain (or the end).
            sub, lengths = tb[ascii_ids], self.lengths[ascii_ids][:, None]
            pos = np.arange(width)[None, :]
            stop = (pos >= lengths) | (sub < 0x20) | (sub == 0x22) | (sub == 0x5C)
            nxt = np.flip(np.minimum.accumulate(np.flip(np.where(stop, pos, width), 1), axis=1), 1)
            out[ascii_ids] = np.where(stop, 0, nxt - pos)
            for i in np.setdiff1d(self.text_ids, ascii_ids).tolist():
                b, at, chars = self.vocab[i], 0, []
                while at < len(b):
                    n = 1 if b[at] < 0xC0 else 2 if b[at] < 0xE0 else 3 if b[at] < 0xF0 else 4
                    try:
                        c = b[at:at + n].decode("utf-8")
                    except UnicodeDecodeError:
                        c = ""
                    ok = len(c) == 1 and is_plain(c)
                    chars.append((at, n if ok else 0))
                    at += n if ok else 1
                run = 0
                for at, n in reversed(chars):
                    run = run + n if n else 0
                    out[i, at] = run
            self._plain_ahead = np.ascontiguousarray(out.T)
        return self._plain_ahead

    @property
    def plain_prefixes(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(packed mask, groups), built on first use: the tokens that are a prefix of plain text (whole
        plain characters, the last one possibly cut short), and the other text tokens by the byte that
        ends their plain run. From a state where plain text of any length stays alive, the first are
        allowed and only those of the groups whose byte some state there reads need a walk (walk_starts.py)."""
        if self._plain_prefixes is None:
            ids = self.non_plain_ids
            stop_at = self.plain_ahead[0, ids].astype(np.int64)
            stop = self.bytes_at[stop_at, ids].astype(np.int64)
            partial = np.array([_cut_plain_char(self.vocab[t][k:]) for t, k in
                                zip(ids.tolist(), stop_at.tolist())], dtype=bool)
            bits = np.zeros(self.words * 32, dtype=bool)
            bits[self.plain_sorted] = True
            bits[ids[partial]] = True
            mask = np.packbits(bits, bitorder="little").view("<i4")
            mask.flags.writeable = False
            rest, stop = ids[~partial], stop[~partial]
            order = np.argsort(stop, kind="stable")
            bounds = np.searchsorted(stop[order], np.arange(257))
            self._plain_prefixes = (mask, [rest[order[bounds[b]:bounds[b + 1]]] for b in range(256)])
        return self._plain_prefixes

    def stopped_by(self, reads: np.ndarray) -> StoppedTokens:
        """The text tokens of `plain_prefixes`' groups whose byte is one of `reads` ([256] bool), with
        where each stops, kept per set of bytes (every string body and open object's names reads the
        same)."""
        key = np.packbits(reads).tobytes()
        hit = self._stopped_by.get(key)
        if hit is None:
            groups = self.plain_prefixes[1]
            ids = np.concatenate([groups[b] for b in np.flatnonzero(reads).tolist()] + [np.zeros(0, np.int64)])
            heads = self.plain_ahead[0, ids].astype(np.int64)
            width = len(self.bytes_at)
            nxt = self.bytes_at[np.minimum(heads + 1, width - 1), ids].astype(np.int64)
            after = np.where(heads + 1 < self.lengths[ids], nxt, 256)
            hit = StoppedTokens(ids, heads, self.bytes_at[heads, ids].astype(np.int64), after)
            for a in (hit.ids, hit.heads, hit.stop, hit.after):
                a.flags.writeable = False
            if len(self._stopped_by) >= MAX_STOP_SETS:
                self._stopped_by.clear()
            self._stopped_by[key] = hit
        return hit

    @property
    def non_plain_heads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, characters, bytes), built on first use: the text tokens that are not plain text, with
        the plain characters they start with and those characters' bytes. Along a state's character
        chain such a token's start is a lookup: the walk goes on from the chain's state at that
        character, at the first byte that is not plain (walk_starts.py)."""
        if self._non_plain_heads is None:
            ids = self.non_plain_ids
            heads = self.plain_ahead[0, ids].astype(np.int64)
            chars = np.array([len(self.vocab[t][:k].decode("utf-8")) for t, k in zip(ids.tolist(), heads.tolist())],
                             dtype=np.int64)
            self._non_plain_heads = (ids, chars, heads)
        return self._non_plain_heads

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


def _cut_plain_char(data: bytes) -> bool:
    """Are `data` (non-empty) the first bytes of a plain character of more bytes than that?"""
    lead = data[0]
    need = 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF5 else 0
    if len(data) >= need:
        return False
    fill = b"\x80" * (need - len(data) - 1)
    for b in range(0x80, 0xC0):  # the first missing byte decides validity (E0, ED, F0, F4 limit it)
        try:
            c = (data + bytes([b]) + fill).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if is_plain(c):
            return True
    return False
