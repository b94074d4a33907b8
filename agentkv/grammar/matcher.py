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

MAX_BACKOFF_TOKENS = 4
MAX_EXTENSION_CHECKS = 64


class Matcher:
    """Token masks, accept, rollback and canonical jump-forward for one sequence."""

    def __init__(self, grammar: CompiledGrammar, max_rollback: int = 64):
        if max_rollback < 0:
            raise GrammarError("max_rollback must be >= 0")
        self.grammar = grammar
        self._cfg = grammar.initial
        self._terminated = False
        self._history: deque = deque(maxlen=max_rollback)

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
        m.grammar, m._cfg, m._terminated = self.grammar, self._cfg, self._terminated
        m._history = deque(self._history, maxlen=self._history.maxlen)
        return m

    def reset(self) -> None:
        self._cfg, self._terminated = self.grammar.initial, False
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
            self._history.append((self._cfg, self._terminated))
            self._terminated = True
            return True
        if not 0 <= token_id < info.vocab_size or info.vocab[token_id] is None:
            return False
        nxt = self.grammar.advance(self._cfg, info.vocab[token_id])
        if nxt == DEAD:
            return False
        self._history.append((self._cfg, self._terminated))
        self._cfg = nxt
        return True

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """All or nothing: on a refusal the matcher is left where it was."""
        saved = (self._cfg, self._terminated, list(self._history))
        for t in token_ids:
            if not self.accept_token(t):
                self._cfg, self._terminated = saved[0], saved[1]
                self._history.clear()
                self._history.extend(saved[2])
                return False
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw text (counts as one step for rollback)."""
        if self._terminated:
            return False
        nxt = self.grammar.advance(self._cfg, data)
        if nxt == DEAD:
            return False
        self._history.append((self._cfg, self._terminated))
        self._cfg = nxt
        return True

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""
        if n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self._history)} are kept "
                               f"(raise Matcher(max_rollback=...))")
        for _ in range(n):
            self._cfg, self._terminated = self._history.pop()

    # -- masks ------------------------------------------------------------------------------------

    def fill_next_token_bitmask(self, bitmask, row: int = 0) -> None:
        """Write the allowed-token bits into `bitmask[row]` (int32, one bit per token id)."""
        target = bitmask if isinstance(bitmask, np.ndarray) else bitmask.numpy()
        if target.dtype != np.int32:
            raise GrammarError(f"the bitmask must be int32, not {target.dtype}")
        out = target[row] if target.ndim == 2 else target
        if self._terminated:
            out[:] = 0
            return
        m = self.grammar.mask(self._cfg)
        n = min(len(out), len(m))
        out[:n] = m[:n]
        out[n:] = 0

    def allowed_token_ids(self) -> np.ndarray:
        """The allowed token ids as an array (for tests and debugging; the bitmask is the fast path)."""
        if self._terminated:
            return np.zeros(0, dtype=np.int64)
        bits = np.unpackbits(self.grammar.mask(self._cfg).view(np.uint8), bitorder="little")
        return np.nonzero(bits[:self.grammar.info.vocab_size])[0]

    # -- jump-forward -----------------------------------------------------------------------------

    def jump_forward_bytes(self) -> bytes:
        """The text the grammar forces next (empty where there is a choice or the text may end)."""
        return b"" if self._terminated else self.grammar.forced_bytes(self._cfg)

    def jump_forward_tokens(self) -> list[int]:
        """Tokens for the forced text, as the tokenizer itself would write them.

        The forced text is encoded, then up to 4 trailing tokens are dropped while the text they
        cover could be the start of a longer allowed token (the model, not the jump, must choose how
        that text ends). The tokens are not accepted; call `accept_tokens` with them.
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
        keep = len(toks)
        first = max(0, len(toks) - MAX_BACKOFF_TOKENS)
        # From every byte of the last tokens: could an allowed token starting there run past the end?
        # Then the tokenizer may split that text differently once the model writes what follows.
        for p in range(len(forced) - 1, starts[first] - 1, -1):
            at = g.advance(self._cfg, forced[:p])
            if _longer_allowed_token(g, at, forced[p:]):
                keep = min(keep, next(j for j in range(len(toks)) if starts[j] <= p < starts[j + 1]))
        return toks[:keep]


def _complete_utf8(data: bytes) -> bytes:
    """Drop a trailing partial UTF-8 character."""
    for cut in range(4):
        try:
            (data[:len(data) - cut] if cut else data).decode("utf-8")
            return data[:len(data) - cut] if cut else data
        except UnicodeDecodeError:
            continue
    return b""


def _longer_allowed_token(g: CompiledGrammar, cid: int, suffix: bytes) -> bool:
    """Is some token allowed at `cid` that starts with `suffix` and goes past it?"""
    info = g.info
    lo, hi = info.extending(suffix)
    ids = [t for t in info.sorted_ids[lo:hi] if info.lengths[t] > len(suffix)]
    if not ids:
        return False
    if len(ids) > MAX_EXTENSION_CHECKS:  # many candidates: the mask answers at once
        mask = g.mask(cid)
        arr = np.asarray(ids)
        return bool(((mask[arr >> 5] >> (arr & 31)) & 1).any())
    return any(g.advance(cid, info.vocab[t]) != DEAD for t in ids)


def fill_next_token_bitmasks(matchers: Sequence[Matcher | None], bitmask) -> None:
    """One call for a batch: row i gets matcher i's mask; rows of `None` are left as they are."""
    for row, m in enumerate(matchers):
        if m is not None:
            m.fill_next_token_bitmask(bitmask, row)
