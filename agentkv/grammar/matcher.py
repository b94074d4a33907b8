"""Matcher: one request's position in a compiled grammar.

Cheap to create and copy (a configuration id and a short history); every expensive answer (token
masks, byte steps, forced text) comes from the CompiledGrammar's shared caches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.compiled import DEAD, CompiledGrammar

# The last bytes of accepted text, kept so that jump-forward can find the tokenizer's pre-tokenizer
# pieces around the forced text (tokens/splits.py); a tail shorter than this is the whole output.
TAIL_BYTES = 32
# Past this many allowed tokens that could run past the forced text, the back-off stands without
# asking the pre-tokenizer about each (a choice that wide is the model's anyway).
MAX_SPLIT_CHECKS = 32
# drop_split_prefixes looks at this many bytes of the forced text: the merges a model writes off its
# training across (` "`, `":`, `"}`) are short, and the step pays for each byte.
SPLIT_WINDOW = 16


class Matcher:
    """Token masks, accept, rollback and canonical jump-forward for one sequence."""

    def __init__(self, grammar: CompiledGrammar, max_rollback: int = 64):
        if max_rollback < 0:
            raise GrammarError("max_rollback must be >= 0")
        self.grammar = grammar
        self._cfg = grammar.initial
        self._terminated = False
        self._tail = b""
        self._history: deque = deque(maxlen=max_rollback)
        # Why the grammar allows nothing more where it failed mid-output (a composed part that could
        # not be linked when first reached, composer.py): the mask is empty and the token refused, so
        # this sequence ends at a dead end carrying the error, and other sequences go on.
        self.error: GrammarError | None = None

    # -- state ------------------------------------------------------------------------------------

    def is_terminated(self) -> bool:
        """True once EOS was accepted."""
        return self._terminated

    def can_terminate(self) -> bool:
        """True where the text so far is complete (EOS is allowed)."""
        return not self._terminated and self.grammar.can_end(self._cfg)

    def must_terminate(self) -> bool:
        """True where the text so far is complete and nothing may follow it (only EOS is allowed)."""
        return self._terminated or (self.grammar.can_end(self._cfg) and not self.grammar.stacks(self._cfg))

    def copy(self) -> Matcher:
        m = Matcher.__new__(Matcher)
        m.grammar, m._cfg, m._terminated, m._tail = self.grammar, self._cfg, self._terminated, self._tail
        m.error = self.error
        m._history = deque(self._history, maxlen=self._history.maxlen)
        return m

    def reset(self) -> None:
        self._cfg, self._terminated, self._tail = self.grammar.initial, False, b""
        self._history.clear()

    # -- advancing --------------------------------------------------------------------------------

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) where the grammar does not allow it."""
        if self._terminated:
            return False
        info = self.grammar.info
        if token_id in info.eos_ids:
            if not self.grammar.can_end(self._cfg):
                return False
            self._history.append((self._cfg, self._terminated, self._tail))
            self._terminated = True
            return True
        if not 0 <= token_id < info.vocab_size or info.vocab[token_id] is None:
            return False
        return self._advance(info.vocab[token_id])

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """All or nothing: on a refusal the matcher is left where it was."""
        saved = (self._cfg, self._terminated, self._tail, list(self._history))
        for t in token_ids:
            if not self.accept_token(t):
                self._cfg, self._terminated, self._tail = saved[:3]
                self._history.clear()
                self._history.extend(saved[3])
                return False
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw text (counts as one step for rollback)."""
        return not self._terminated and self._advance(bytes(data))

    def _advance(self, data: bytes) -> bool:
        try:
            nxt = self.grammar.advance(self._cfg, data)
        except GrammarError as e:
            self.error = e
            return False
        if nxt == DEAD:
            return False
        self._history.append((self._cfg, self._terminated, self._tail))
        self._cfg = nxt
        self._tail = (self._tail + data)[-TAIL_BYTES:]
        return True

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""
        if n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} are kept "
                               f"(raise Matcher(max_rollback=...))")
        for _ in range(n):
            self._cfg, self._terminated, self._tail = self._history.pop()

    # -- masks ------------------------------------------------------------------------------------

    def fill_next_token_bitmask(self, bitmask, row: int = 0) -> None:
        """Write the allowed-token bits into `bitmask[row]` (int32, one bit per token id)."""
        target = bitmask if isinstance(bitmask, np.ndarray) else bitmask.numpy()
        if target.dtype != np.int32:
            raise GrammarError(f"the bitmask must be int32, not {target.dtype}")
        out = target[row] if target.ndim == 2 else target
        if self._terminated or self.error is not None:
            out[:] = 0
            return
        try:
            m = self.grammar.mask(self._cfg)
        except GrammarError as e:
            self.error = e
            out[:] = 0
            return
        n = min(len(out), len(m))
        out[:n] = m[:n]
        out[n:] = 0

    def drop_split_prefixes(self, bitmask, row: int = 0) -> None:
        """Clear from `bitmask[row]` the tokens the tokenizer would not end where they end: a strict
        prefix of the text the grammar forces next, where a longer prefix of it is a token too (one
        the pre-tokenizer does not cut). A small model that takes the shorter writes off its
        training: after `"city":` spaced JSON forces ` "`, which a BPE vocabulary holds as one
        token; given a lone ` ` the model went on with `"}` inside the string it meant to close. The
        longest such prefix stays allowed, so the row never empties. The engine applies it to the
        rows it samples; `fill_next_token_bitmask` stays the grammar's exact mask."""
        if self._terminated or self.error is not None:
            return
        info = self.grammar.info
        forced = self.jump_forward_bytes()[:SPLIT_WINDOW]  # (the merges a model writes across are short)
        if len(forced) < 2:
            return
        prefixes = [(k, t) for k in range(1, len(forced) + 1) if (t := info.token_ids.get(forced[:k])) is not None]
        if len(prefixes) < 2:
            return
        longest = prefixes[-1][0]
        if info.splitter is not None and not info.added_ids.intersection(t for _, t in prefixes):
            firm = [c - len(self._tail) for c in info.splitter.firm_cuts(self._tail + forced, self._heads())]
            cut = min((c for c in firm if c > 0), default=len(forced))  # (no token stands across it)
            longest = max((k for k, _ in prefixes if k <= cut), default=0)
        out = (bitmask if isinstance(bitmask, np.ndarray) else bitmask.numpy())[row].view(np.uint32)
        for k, t in prefixes:
            if k < longest and k < len(forced):
                out[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)

    def allowed_token_ids(self) -> np.ndarray:
        """The allowed token ids as an array (for tests and debugging; the bitmask is the fast path)."""
        if self._terminated:
            return np.zeros(0, dtype=np.int64)
        bits = np.unpackbits(self.grammar.mask(self._cfg).view(np.uint8), bitorder="little")
        return np.nonzero(bits[:self.grammar.info.vocab_size])[0]

    # -- closing within a budget ----------------------------------------------------------------------

    def completion_bytes(self) -> bytes | None:
        """The shortest text that completes the output from here (empty where it may end now; None
        where no text does: terminated, or only through a composed part not linked yet)."""
        if self._terminated:
            return None
        return self.grammar.completion(self._cfg)

    def completion_tokens(self) -> list[int] | None:
        """`completion_bytes` as tokens: the tokenizer's own where it writes that text back exactly
        without an end token, else the longest vocabulary tokens from the left. None where there is
        no completion or the vocabulary cannot write it."""
        text = self.completion_bytes()
        if not text:
            return None if text is None else []
        info, toks = self.grammar.info, None
        if info.encode_bytes is not None:
            try:
                toks = info.encode_bytes(text)
            except Exception:
                toks = None
            if toks is not None and (info.decode(toks) != text or any(t in info.eos_ids for t in toks)):
                toks = None
        return toks if toks is not None else _longest_tokens(info, text)

    # -- jump-forward -----------------------------------------------------------------------------

    def jump_forward_bytes(self) -> bytes:
        """The text the grammar forces next (empty where there is a choice or the text may end)."""
        return b"" if self._terminated else self.grammar.forced_bytes(self._cfg)

    def jump_forward_tokens(self) -> list[int]:
        """Tokens for the forced text, as the tokenizer itself would write them once the model has
        written what follows. The tokens are not accepted; call `accept_tokens` with them.

        The tokens are kept up to the last boundary that no token of the vocabulary can span,
        whatever follows: BPE (and a unigram or WordPiece model) must cut there, and what it makes
        of the text before does not depend on what comes after; inside a span it may (with merges
        cd < bc < ab, "abc" is [a, bc] but "abcd" is [ab, cd]). A token spans a boundary if its
        text stands across it in the forced text, or starts in the forced text and could run past
        its end with text the grammar allows. A token the tokenizer's pre-tokenizer would cut in two
        where it stands does not count (tokens/splits.py); an added token always does.
        """
        g, info = self.grammar, self.grammar.info
        forced = self.jump_forward_bytes()
        if not forced or info.encode_bytes is None:
            return []
        forced = _complete_utf8(forced)
        if not forced:
            return []
        try:
            toks = info.encode_bytes(forced)
        except Exception:
            return []
        if info.decode(toks) != forced or any(t in info.eos_ids for t in toks):
            return []
        starts = np.cumsum([0] + [len(info.vocab[t]) for t in toks]).tolist()
        end = g.advance(self._cfg, forced)  # (where the model goes on from)
        # The first byte from which a token could run past the end: no boundary after it stands.
        limit = next((p for p in range(max(0, len(forced) - info.max_token_bytes + 1), len(forced))
                     if self._could_cross(end, forced, p)), len(forced))
        spanned = None  # (the boundaries tokens inside the forced text stand across: asked once)
        for j in range(len(toks), 0, -1):
            if starts[j] > limit:
                continue
            if j < len(toks):
                if spanned is None:
                    spanned = self._spanned_inside(forced)
                if starts[j] in spanned:
                    continue
            return toks[:j]
        return []

    def _could_cross(self, end: int, forced: bytes, p: int) -> bool:
        """Could the model write, from byte `p` of the forced text, a token running past its end
        (`end`: the configuration after the forced text)?"""
        info = self.grammar.info
        ids = self.grammar.tokens_past(end, forced[p:])
        if not ids or info.splitter is None or len(ids) > MAX_SPLIT_CHECKS or not info.added_ids.isdisjoint(ids):
            return bool(ids)  # (an added token stands wherever its text does: the pre-tokenizer never cuts it)
        # The pieces are found in the text as it would stand with each token in place, from the
        # accepted tail on (and from its middle too where the tail is not the whole output).
        head = self._tail + forced[:p]
        return any(not info.splitter.cut_inside(head + info.vocab[t], len(head), len(head) + len(info.vocab[t]),
                                                self._heads()) for t in ids)

    def _spanned_inside(self, forced: bytes) -> set[int]:
        """The byte offsets inside the forced text that a token of the vocabulary stands across
        (one whose text is there, not cut in two by the pre-tokenizer)."""
        info = self.grammar.info
        spans = []
        longest = min(info.max_token_bytes, len(forced))
        for p in range(len(forced) - 1):
            for e in range(p + 2, min(p + longest, len(forced)) + 1):
                t = info.token_ids.get(forced[p:e])
                if t is not None:
                    spans.append((p, e, t in info.added_ids))
        if spans and info.splitter is not None:  # (the pre-tokenizer runs only where a span needs judging)
            text = self._tail + forced
            firm = [c - len(self._tail) for c in info.splitter.firm_cuts(text, self._heads())]
            spans = [(p, e, added) for p, e, added in spans if added or not any(p < c < e for c in firm)]
        return {q for p, e, _ in spans for q in range(p + 1, e)}

    def _heads(self) -> tuple[int, ...]:
        """Where to scan the accepted tail from (its middle too where it is not the whole output)."""
        return (0,) if len(self._tail) < TAIL_BYTES else (0, TAIL_BYTES // 2)


def _longest_tokens(info, text: bytes) -> list[int] | None:
    """`text` as the longest vocabulary tokens from the left (no end token), or None where a byte
    has no token."""
    out, i, ids = [], 0, info.token_ids
    while i < len(text):
        for k in range(min(info.max_token_bytes, len(text) - i), 0, -1):
            t = ids.get(text[i:i + k])
            if t is not None and t not in info.eos_ids:
                out.append(t)
                i += k
                break
        else:
            return None
    return out


def _complete_utf8(data: bytes) -> bytes:
    """Drop a trailing partial UTF-8 character."""
    for cut in range(4):
        try:
            (data[:len(data) - cut] if cut else data).decode("utf-8")
            return data[:len(data) - cut] if cut else data
        except UnicodeDecodeError:
            continue
    return b""


def fill_next_token_bitmasks(matchers: Sequence[Matcher | None], bitmask) -> None:
    """One call for a batch: row i gets matcher i's mask; rows of `None` are left as they are."""
    for row, m in enumerate(matchers):
        if m is not None:
            m.fill_next_token_bitmask(bitmask, row)
