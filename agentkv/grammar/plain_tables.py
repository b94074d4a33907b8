"""The per-tokenizer tables of plain text runs the token walk reads (masks.py, walk_starts.py), built
on first use and shared by every grammar compiled for the tokenizer: how much of each token from
each offset is plain text (`plain_suffix`, `plain_ahead`), the plain tokens of up to n characters,
the tokens whose plain run from the start stops at a given byte (`plain_prefixes`, `stopped_by`), and
the plain heads of the tokens that are not plain. TokenizerInfo (vocab.py) inherits these beside
TokenTables (token_tables.py), and provides the same vocabulary fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentkv.grammar.token_tables import is_plain

MAX_STOP_SETS = 64  # sets of bytes whose `stopped_by` tokens are kept (a few thousand ids each)


@dataclass(frozen=True)
class StoppedTokens:
    """`PlainTables.stopped_by`: text tokens whose plain run from the start stops at a given set of
    bytes, each with that run's length in bytes, the byte it stops at and the byte after it (256: the
    token ends there). From a plain-text closure, a token's first two bytes past its run decide most
    (walk_starts.py)."""

    ids: np.ndarray
    heads: np.ndarray
    stop: np.ndarray
    after: np.ndarray


class PlainTables:
    def _init_plain_tables(self) -> None:
        self._plain_suffix: np.ndarray | None = None
        self._plain_ahead: np.ndarray | None = None
        self._plain_upto: dict[int, np.ndarray] = {}
        self._plain_prefixes: tuple[np.ndarray, list[np.ndarray]] | None = None
        self._stopped_by: dict[bytes, StoppedTokens] = {}
        self._non_plain_heads: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

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
