"""Matcher: one request's position in a compiled grammar.

Cheap to create and copy (a configuration id and a short history); every expensive answer (token
masks, byte steps, forced text) comes from the CompiledGrammar's shared caches.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.compiled import DEAD, CompiledGrammar
from agentkv.grammar.splits import NON_ASCII_PROBES

MAX_BACKOFF_TOKENS = 4
# The last bytes of accepted text, kept so that jump-forward can find the tokenizer's pre-tokenizer
# pieces around the forced text (splits.py); a tail shorter than this is the whole output.
TAIL_BYTES = 32
# How many token boundaries back from the end of forced text a firm cut is looked for (none found:
# no forced tokens), and how far back an added token running past the end may start.
MAX_CUT_SEARCH = 16
MAX_ADDED_BYTES = 32


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
        nxt = self.grammar.advance(self._cfg, data)
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
        """Tokens for the forced text, as the tokenizer itself would write them once the model has
        written what follows. The tokens are not accepted; call `accept_tokens` with them.

        BPE merges within one pre-tokenizer piece can change as the piece grows (with merges
        cd < bc < ab, "abc" is [a, bc] but "abcd" is [ab, cd]), so where the tokenizer's
        pre-tokenizer is known (splits.py) the forced tokens stop at a cut no continuation moves:
        the end of the forced text where every character the grammar allows next starts a new
        piece (or nothing may follow), else the last such cut inside it; never past the start of
        an added token the model could still write across the end. Without a known pre-tokenizer,
        up to 4 trailing tokens are dropped while the text they cover could be the start of a
        longer allowed token.
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
        if info.splitter is None:
            return toks[:self._keep_uncrossed(toks, starts, forced, end)]
        return toks[:self._keep_to_firm_cut(toks, starts, forced, end)]

    def _keep_to_firm_cut(self, toks: list[int], starts: list[int], forced: bytes, end: int) -> int:
        """How many of the forced text's tokens end at a pre-tokenizer cut that stands whatever the
        model writes next (see jump_forward_tokens)."""
        info = self.grammar.info
        limit = self._added_limit(forced, end)
        text = self._tail + forced
        base = len(self._tail)
        heads = (0,) if len(self._tail) < TAIL_BYTES else (0, TAIL_BYTES // 2)
        firm = None  # (the cuts inside: asked only where the end is not one)
        for j in range(len(toks), max(0, len(toks) - MAX_CUT_SEARCH), -1):
            q = starts[j]
            if q > limit:
                continue
            if toks[j - 1] in info.added_ids or (j < len(toks) and toks[j] in info.added_ids):
                return j  # the tokenizer cuts around an added token before its pre-tokenizer runs
            if j == len(toks):
                if info.splitter.cut_at_end(text, self._next_probes(end), heads):
                    return j
                continue
            if firm is None:
                firm = info.splitter.firm_cuts(text, heads, self._next_probes(end))
            if base + q in firm:
                return j
        return 0

    def _added_limit(self, forced: bytes, end: int) -> int:
        """The earliest byte of the forced text from which the model could write an added token
        running past its end (the length of the text where there is none)."""
        info = self.grammar.info
        for p in range(max(0, len(forced) - MAX_ADDED_BYTES), len(forced)):
            rest = forced[p:]
            if rest in info.added_prefixes and not info.added_ids.isdisjoint(self.grammar.tokens_past(end, rest)):
                return p
        return len(forced)

    def _next_probes(self, end: int) -> tuple[str, ...]:
        """What may follow the forced text, for the pre-tokenizer (splits.py): a character of each
        kind the grammar allows next, as the GPT-2 / Llama 3 / Qwen patterns tell them apart."""
        return _probes(bytes(self.grammar.allowed_bytes(end).tolist()))

    def _keep_uncrossed(self, toks: list[int], starts: list[int], forced: bytes, end: int) -> int:
        """How many tokens to keep where the pre-tokenizer is unknown: back off from every byte of
        the last tokens from which an allowed token could run past the end."""
        keep = len(toks)
        first = max(0, len(toks) - MAX_BACKOFF_TOKENS)
        p = len(forced) - 1
        while p >= starts[first]:
            if self.grammar.tokens_past(end, forced[p:]):
                keep = next(j for j in range(len(toks)) if starts[j] <= p < starts[j + 1])
                p = starts[keep]
            p -= 1
        return keep


@functools.lru_cache(maxsize=4096)
def _probes(allowed: bytes) -> tuple[str, ...]:
    """One character per kind among the bytes `allowed` next: a letter (and `s`, which ends a
    contraction), a digit, the apostrophe, other punctuation, each whitespace character (and it
    followed by a letter: a run of whitespace is cut by what ends it), and where a byte outside ASCII
    may follow, a character of each kind there."""
    out: set[str] = set()
    for b in allowed:
        c = chr(b)
        if b >= 0x80:
            out.update(NON_ASCII_PROBES)
        elif c.isalpha():
            out.update(("a", "s"))
        elif c.isdigit():
            out.add("1")
        elif c.isspace():
            out.update((c, c + "a"))
        elif c == "'":
            out.add(c)
        else:
            out.add("!")
    return tuple(sorted(out))


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
