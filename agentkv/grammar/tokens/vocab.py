"""TokenizerInfo: what the grammar layer needs to know of a tokenizer.

Token id -> the bytes it writes (None for special and unused ids, which never match grammar text),
the EOS ids, and an encoder used only to turn forced text into the tokenizer's own tokens (with the
pre-tokenizer's cuts, which tell jump-forward where no token can span; tokens/splits.py). Built
from a HF/`tokenizers` tokenizer (byte-level BPE through the GPT-2 byte map, or SentencePiece with
`<0xNN>` byte fallback), from a tiktoken ranks file, or from a plain list of bytes.
The arrays here are per tokenizer and shared by every grammar compiled for it; the byte trie the token
walk reads is built on first use (tokens/trie.py).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.tokens.splits import Splitter
from agentkv.grammar.tokens.trie import TokenTrie, build_trie
from agentkv.grammar.tokens.walk_tables import trie_struct

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


class TokenizerInfo:
    """Vocabulary bytes and EOS ids of one tokenizer (see the module docstring)."""

    def __init__(self, vocab: Sequence[bytes | None], eos_ids: Iterable[int] = (),
                 encode: Callable[[bytes], list[int]] | None = None, splitter: Splitter | None = None,
                 added_ids: Iterable[int] = ()):
        self.vocab: list[bytes | None] = [None if (b is None or len(b) == 0) else bytes(b) for b in vocab]
        # Added tokens (Qwen's <tool_call>, <think>) are matched in text before the pre-tokenizer cuts
        # it, so its cuts never keep one from standing anywhere (matcher.py's jump-forward)
        self.added_ids = frozenset(added_ids)
        self.vocab_size = len(self.vocab)
        self.eos_ids = tuple(sorted(set(eos_ids)))
        for e in self.eos_ids:
            if not 0 <= e < self.vocab_size:
                raise GrammarError(f"EOS id {e} is outside the vocabulary of {self.vocab_size} tokens")
            # an end token ends the output wherever it is sampled (Matcher.accept_token), so it is never
            # text a grammar matches, even one a tool format keeps as text (Gemma 4's <|tool_response>)
            self.vocab[e] = None
        self.encode_bytes = encode
        self.splitter = splitter  # the pre-tokenizer's pieces, where the encoder cuts text first
        self.lengths = np.array([0 if b is None else len(b) for b in self.vocab], dtype=np.int32)
        self.words = (self.vocab_size + 31) // 32
        # Lexicographic order: the tokens extending a given byte string are one contiguous run (the trie's).
        text_ids = np.nonzero(self.lengths > 0)[0].tolist()
        self.sorted_id_array = np.array(sorted(text_ids, key=lambda i: self.vocab[i]), dtype=np.int64)
        self.sorted_id_array.flags.writeable = False  # (lookups hand out views of it)

    @functools.cached_property
    def trie(self) -> TokenTrie:
        """The byte trie of the text tokens, as the token walk reads it (tokens/trie.py)."""
        return build_trie(self)

    @functools.cached_property
    def token_ids(self) -> dict[bytes, int]:
        """Each token's id by its bytes (jump-forward's test for tokens standing across a boundary)."""
        return {b: i for i, b in enumerate(self.vocab) if b is not None}

    @functools.cached_property
    def max_token_bytes(self) -> int:
        return int(self.lengths.max(initial=0))

    @functools.cached_property
    def trie_struct(self):
        """`trie` as the native walk's struct (tokens/walk_tables.py)."""
        return trie_struct(self.trie)

    # -- construction -------------------------------------------------------------------------------

    @classmethod
    def from_huggingface(cls, tokenizer, eos_ids: Iterable[int] | None = None) -> TokenizerInfo:
        """From a `tokenizers.Tokenizer`, a transformers tokenizer, or an agentkv engine Tokenizer.
        Special tokens write nothing grammar text can match, but for an engine Tokenizer's
        `kept_specials` (a tool format's markup), which write their text."""
        backend = _tokenizers_backend(tokenizer)
        if eos_ids is None:
            eos_ids = _eos_ids(tokenizer, backend)
        vocab_map = backend.get_vocab(with_added_tokens=True)
        size = max(backend.get_vocab_size(with_added_tokens=True), max(vocab_map.values()) + 1)
        specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special} \
            if hasattr(backend, "get_added_tokens_decoder") else set()
        specials -= set(getattr(tokenizer, "kept_specials", ()))
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

        added = backend.get_added_tokens_decoder() if hasattr(backend, "get_added_tokens_decoder") else {}
        return cls(vocab, eos_ids, encode, Splitter.from_tokenizers(backend),
                   added_ids=[i for i in added if i < size and vocab[i] is not None])

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
        return cls(vocab, eos, _rank_bpe_encoder(ranks, pattern), Splitter.from_pattern(pattern))

    # -- queries --------------------------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> bytes:
        return b"".join(self.vocab[i] or b"" for i in ids)


def _tokenizers_backend(tokenizer):
    """The `tokenizers.Tokenizer` behind a tokenizer: itself, a transformers fast tokenizer's
    `backend_tokenizer` (transformers 4 and 5; in 5, `.backend` is the backend's name, a string),
    or the agentkv engine Tokenizer's `backend`."""
    for candidate in (getattr(tokenizer, "backend_tokenizer", None), getattr(tokenizer, "backend", None), tokenizer):
        if hasattr(candidate, "get_vocab") and hasattr(candidate, "get_vocab_size") and hasattr(candidate, "encode"):
            return candidate
    raise GrammarError(f"cannot read a vocabulary from {type(tokenizer).__name__}; pass a tokenizers.Tokenizer, a "
                       "transformers fast tokenizer (use_fast=True), or TokenizerInfo(vocab_bytes, eos_ids)")


# End-of-sequence tokens by name, for a bare `tokenizers.Tokenizer` (it does not say which is EOS).
EOS_NAMES = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<eos>",
             "<end_of_turn>", "<|eom_id|>")


def _eos_ids(tokenizer, backend) -> list[int]:
    """EOS ids: the agentkv Tokenizer's set, a transformers tokenizer's `eos_token_id` (an int or a
    list), else the special tokens named as EOS tokens usually are."""
    ids = getattr(tokenizer, "eos_ids", None)
    if ids is not None:
        return list(ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        return [eos] if isinstance(eos, int) else list(eos)
    return [i for name in EOS_NAMES if (i := backend.token_to_id(name)) is not None]


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
