"""TokenizerInfo: what the grammar layer needs to know of a tokenizer.

Token id -> the bytes it writes (None for special and unused ids, which never match grammar text),
the EOS ids, and an encoder used only to turn forced text into the tokenizer's own tokens. Built
from a HF/`tokenizers` tokenizer (byte-level BPE through the GPT-2 byte map, or SentencePiece with
`<0xNN>` byte fallback), from a tiktoken ranks file, or from a plain list of bytes.
The arrays here are per tokenizer and shared by every grammar compiled for it.
"""

from __future__ import annotations

import base64
import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentkv.errors import GrammarError

# Characters a JSON string takes as they are, minus the ECMA line terminators U+2028/U+2029, which a
# pattern's `.` refuses: with them out, `.*` is a run of plain characters like any string body.
PLAIN_EXCLUDED = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x2028, 0x2029))
# The one-byte plain characters (where they do not all lead to one place, a state is not uniform).
ASCII_PLAIN = np.array([b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)])


def _is_plain(c: str) -> bool:
    o = ord(c)
    return o >= 0x20 and o != 0x22 and o != 0x5C and o != 0x2028 and o != 0x2029  # PLAIN_EXCLUDED


QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def gpt2_byte_decoder() -> dict[str, int]:
    """The GPT-2 byte-level alphabet: printable stand-ins for all 256 bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


MAX_LEAF_WALKS = 1024


class BoundedCache:
    """A thread-safe dict that drops its least recently used entry past `size`."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class FirstCharGroups:
    """Plain token ids grouped by first character (0-127: that ASCII byte; 256: any multi-byte
    character), each group ordered by character count."""

    ids: np.ndarray    # all groups, one after another
    edges: np.ndarray  # [258]: group g is ids[edges[g]:edges[g + 1]]
    under: np.ndarray  # [257, max characters + 2]: under[g, c], how many of group g have < c characters

    def group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[self.edges[g]:self.edges[g + 1]], self.under[g]


class TokenizerInfo:
    """Vocabulary bytes and EOS ids of one tokenizer (see the module docstring)."""

    def __init__(self, vocab: Sequence[bytes | None], eos_ids: Iterable[int] = (),
                 encode: Callable[[bytes], list[int]] | None = None):
        self.vocab: list[bytes | None] = [None if (b is None or len(b) == 0) else bytes(b) for b in vocab]
        self.vocab_size = len(self.vocab)
        self.eos_ids = tuple(sorted(set(eos_ids)))
        for e in self.eos_ids:
            if not 0 <= e < self.vocab_size:
                raise GrammarError(f"EOS id {e} is outside the vocabulary of {self.vocab_size} tokens")
        self.encode_bytes = encode
        lengths = np.array([0 if b is None else len(b) for b in self.vocab], dtype=np.int32)
        self.lengths = lengths
        width = max(1, int(lengths.max(initial=1)))
        # Token bytes padded to the longest token, `bytes_at[k, t]` the k-th byte of token t: a walk
        # reads one offset of many tokens at a time, a contiguous row. Padding is never read.
        mat = np.zeros((self.vocab_size, width), dtype=np.uint8)
        for i, b in enumerate(self.vocab):
            if b:
                mat[i, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.bytes_at = np.ascontiguousarray(mat.T)
        self.text_ids = np.nonzero(lengths > 0)[0].astype(np.int64)
        # Lexicographic order: the tokens extending a given byte string are one contiguous run.
        self.sorted_ids = sorted(self.text_ids.tolist(), key=lambda i: self.vocab[i])
        self.sorted_bytes = [self.vocab[i] for i in self.sorted_ids]
        self.words = (self.vocab_size + 31) // 32
        # "Plain" tokens: whole UTF-8 characters of PLAIN_CHARACTERS, text that a JSON string body
        # takes as is. Token masks move them by character count.
        plain = np.full(self.vocab_size, -1, dtype=np.int32)
        for i, b in enumerate(self.vocab):
            if b:
                try:
                    text = b.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if all(_is_plain(c) for c in text):
                    plain[i] = len(text)
        self.plain_chars = plain
        order = np.argsort(plain, kind="stable")
        order = order[plain[order] > 0]
        self.plain_sorted = order.astype(np.int64)  # plain token ids by character count
        self.plain_bounds = np.searchsorted(plain[order], np.arange(int(plain.max(initial=0)) + 2))
        self.non_plain_ids = self.text_ids[plain[self.text_ids] < 0]
        self._plain_suffix: np.ndarray | None = None
        self._plain_ahead: np.ndarray | None = None
        self._plain_upto: dict[int, np.ndarray] = {}
        self._later_bytes: np.ndarray | None = None
        self._first_byte_groups: list[np.ndarray] | None = None
        self._non_plain_by_first_byte: list[np.ndarray] | None = None
        self._first_char_groups: FirstCharGroups | None = None
        self._first_char_masks: np.ndarray | None = None
        # Token walks from states of rules that call no other, by (expression, DFA size, state): see
        # CompiledGrammar.state_tokens. Bounded: each holds a packed mask (19 KB at 151k tokens).
        self.leaf_walks = BoundedCache(MAX_LEAF_WALKS)

    # -- construction -------------------------------------------------------------------------------

    @classmethod
    def from_huggingface(cls, tokenizer, eos_ids: Iterable[int] | None = None) -> TokenizerInfo:
        """From a `tokenizers.Tokenizer`, a transformers tokenizer, or an agentkv engine Tokenizer."""
        backend = getattr(tokenizer, "backend", None) or getattr(tokenizer, "backend_tokenizer", None) or tokenizer
        if not hasattr(backend, "get_vocab"):
            raise GrammarError(f"cannot read a vocabulary from {type(tokenizer).__name__}; pass a tokenizers."
                               "Tokenizer, a transformers fast tokenizer, or TokenizerInfo(vocab_bytes, eos_ids)")
        if eos_ids is None:
            eos_ids = getattr(tokenizer, "eos_ids", None)
        if eos_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        vocab_map = backend.get_vocab(with_added_tokens=True)
        size = max(backend.get_vocab_size(with_added_tokens=True), max(vocab_map.values()) + 1)
        specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special} \
            if hasattr(backend, "get_added_tokens_decoder") else set()
        byte_level = _is_byte_level(backend)
        byte_map = gpt2_byte_decoder()
        vocab: list[bytes | None] = [None] * size
        for text, i in vocab_map.items():
            if text in specials:
                continue
            if byte_level:
                try:
                    vocab[i] = bytes(byte_map[c] for c in text)
                except KeyError:  # an added, non-byte-level token: its text is itself
                    vocab[i] = text.encode()
            elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                vocab[i] = bytes([int(text[3:5], 16)])
            else:
                vocab[i] = text.replace("\u2581", " ").encode()

        def encode(data: bytes) -> list[int]:
            return backend.encode(data.decode("utf-8"), add_special_tokens=False).ids

        return cls(vocab, eos_ids, encode)

    @classmethod
    def from_tiktoken(cls, path: str | Path, special_tokens: dict[str, int] | None = None,
                      eos_tokens: Iterable[str] = ("<|endoftext|>", "<|im_end|>"),
                      pattern: str = QWEN_PATTERN) -> TokenizerInfo:
        """From a tiktoken ranks file (base64 token, rank per line), e.g. Qwen's `qwen.tiktoken`."""
        ranks: dict[bytes, int] = {}
        for line in Path(path).read_text().splitlines():
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        if special_tokens is None:
            base = len(ranks)
            names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
            special_tokens = {n: base + i for i, n in enumerate(names)}
        size = max(max(ranks.values()), max(special_tokens.values(), default=0)) + 1
        vocab: list[bytes | None] = [None] * size
        for b, r in ranks.items():
            vocab[r] = b
        eos = [special_tokens[t] for t in eos_tokens if t in special_tokens]
        return cls(vocab, eos, _rank_bpe_encoder(ranks, pattern))

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
        as a block (masks.py)."""
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
                    if not _is_plain(c):
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
        plain characters lead along a chain of n takes them as one block (masks.py)."""
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
                    ok = len(c) == 1 and _is_plain(c)
                    chars.append((at, n if ok else 0))
                    at += n if ok else 1
                run = 0
                for at, n in reversed(chars):
                    run = run + n if n else 0
                    out[i, at] = run
            self._plain_ahead = np.ascontiguousarray(out.T)
        return self._plain_ahead

    @property
    def later_bytes(self) -> np.ndarray:
        """[258, words] packed token masks (built on first use): row b, the tokens in which byte b
        occurs after the first byte; row 256, those with any byte from 0x80 there; row 257, those that
        also are not plain text. Where the first character leads to a state that loops on most bytes,
        the tokens whose other bytes all loop there are allowed at once (masks.py)."""
        if self._later_bytes is None:
            tb = self.bytes_at.T
            rows, cols = np.nonzero(np.arange(1, tb.shape[1])[None, :] < self.lengths[:, None])
            has = np.zeros((258, self.words * 32), dtype=bool)
            has[tb[rows, cols + 1], rows] = True
            has[256] = has[0x80:256].any(axis=0)
            has[257, :self.vocab_size] = has[256, :self.vocab_size] & (self.plain_chars <= 0)
            self._later_bytes = np.packbits(has, axis=1, bitorder="little").view("<u4")
        return self._later_bytes

    # -- queries --------------------------------------------------------------------------------------

    def extending(self, prefix: bytes) -> tuple[int, int]:
        """[lo, hi) in `sorted_ids` of the tokens that start with `prefix`."""
        lo = bisect.bisect_left(self.sorted_bytes, prefix)
        hi = bisect.bisect_left(self.sorted_bytes, prefix + b"\xff" * 129, lo)
        return lo, hi

    def decode(self, ids: Iterable[int]) -> bytes:
        return b"".join(self.vocab[i] or b"" for i in ids)


def _is_byte_level(backend) -> bool:
    import json

    try:
        spec = json.loads(backend.to_str())
    except Exception:
        return True
    dec = spec.get("decoder") or {}
    kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders", []) or []}
    pre = spec.get("pre_tokenizer") or {}
    kinds |= {pre.get("type")} | {p.get("type") for p in pre.get("pretokenizers", []) or []}
    return "ByteLevel" in kinds


def _rank_bpe_encoder(ranks: dict[bytes, int], pattern: str) -> Callable[[bytes], list[int]]:
    """tiktoken's algorithm: split with the pre-tokenizer regex, then merge the lowest-ranked pair."""
    import regex

    splitter = regex.compile(pattern)

    def bpe(piece: bytes) -> list[int]:
        if piece in ranks:
            return [ranks[piece]]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [ranks[p] for p in parts]

    def encode(data: bytes) -> list[int]:
        out: list[int] = []
        for m in splitter.finditer(data.decode("utf-8")):
            out.extend(bpe(m.group().encode()))
        return out

    return encode
