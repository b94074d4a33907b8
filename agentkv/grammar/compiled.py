"""CompiledGrammar: the automaton of one grammar for one tokenizer, and everything derived from it lazily.

A parser configuration is the set of stacks the input so far can have left (several only where the
grammar is ambiguous at a rule call). Each stack is a tuple of automaton states, bottom first: the
top is the current state, the others are return states. Configurations are *expanded* (every
possible call pushed and every possible return popped) and interned to small integers, so that a
byte step, a token mask and the forced text are each computed once per configuration and then
shared by every request using this grammar.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from agentkv.grammar.automaton import Automaton
from agentkv.grammar.masks import (
    ALL_DEAD,
    BELOW,
    NONUNIFORM,
    StateTokens,
    continue_below,
    stack_walk,
    top_state_tokens,
)
from agentkv.grammar.vocab import ASCII_PLAIN, TokenizerInfo

MAX_STACK_DEPTH = 512       # nesting deeper than this is refused (the token that would open it is masked)
MAX_FORCED_BYTES = 4096
MAX_CACHED_MASKS = 4096     # per grammar: 4096 x 19 KB at a 151k vocabulary
MAX_CACHED_STATES = 4096    # per grammar, top-state token sets (masks.py): as many again
DEAD = -1
LOOP_BLOCK_MIN = 32         # loops on fewer ASCII characters: the byte walk is cheaper than the block


class CompiledGrammar:
    """Shared by all matchers of one grammar; thread-safe (caches are filled under a lock)."""

    def __init__(self, automaton: Automaton, info: TokenizerInfo, description: str = "grammar"):
        self.automaton = automaton
        self.info = info
        self.description = description
        a = automaton
        # A state needs a fork in the token walk when it can call a rule or return from one.
        self.fork_states = a.accept.copy()
        self.fork_states[list(a.calls)] = True
        self.fork_list = self.fork_states.tolist()  # the same, for walks of a single token (masks.py)
        # A return state with nothing after it: a call from there replaces the frame (tail call), so
        # right-recursive chains (object member tails, Lark lists) do not deepen the stack.
        self.tail_states = a.accept & ~a.has_bytes
        self.tail_states[list(a.calls)] = False
        self._lock = threading.RLock()
        self._expanded: dict[tuple, tuple[tuple[tuple, ...], bool]] = {}
        self._deepest: dict[tuple, int] = {}
        self._state_tokens: dict[int, StateTokens] = {}
        self._configs: list[tuple[tuple[tuple, ...], bool]] = []
        self._ids: dict[tuple, int] = {}
        self._steps: dict[tuple[int, int], int] = {}
        self._masks: dict[int, np.ndarray] = {}
        self._forced: dict[int, bytes] = {}
        self._plain_next: dict[int, int] = {}
        self._rows: dict[int, list[int]] = {}
        self._multibyte_next: dict[int, int] = {}
        self._plain_run: dict[int, tuple[int, str]] = {}
        self._looping: dict[int, np.ndarray | None] = {}
        self._runs = np.full(len(automaton.accept), -1, dtype=np.int32)
        # Whether every plain character leads a state back to itself (a string body) and it does not
        # call or return: a walk moves past a run of plain text there at once (plain_loops).
        self._plain_loop: np.ndarray | None = None
        self._ascii_steps: tuple[np.ndarray, np.ndarray] | None = None
        self._runs_started = False
        self.initial = self._intern([(a.starts[0],)])

    def __repr__(self) -> str:
        return f"CompiledGrammar({self.description}, {len(self.automaton.accept)} states)"

    @property
    def num_states(self) -> int:
        return len(self.automaton.accept)

    # -- configurations ----------------------------------------------------------------------------

    def expand(self, stack: tuple) -> tuple[tuple[tuple, ...], bool]:
        """Stacks reachable from `stack` by calls and returns alone whose top can read a byte; can end?

        A relative stack (bottom `BELOW`, see masks.py) "can end" where it returns below its frames."""
        hit = self._expanded.get(stack)
        if hit is not None:
            return hit
        a = self.automaton
        out, can_end, seen, todo = [], False, set(), [stack]
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            top = s[-1]
            if top == BELOW:
                can_end = True
                continue
            if a.has_bytes[top]:
                out.append(s)
            if len(s) < MAX_STACK_DEPTH:
                for rule, ret in a.calls.get(top, ()):
                    todo.append(s[:-1] + ((a.starts[rule],) if self.tail_states[ret] else (ret, a.starts[rule])))
            if a.accept[top]:
                if len(s) == 1:
                    can_end = True
                else:
                    todo.append(s[:-1])
        result = (tuple(sorted(out)), can_end)
        self._expanded[stack] = result
        self._deepest[stack] = max(map(len, seen))
        return result

    def deepest(self, stack: tuple) -> int:
        """The longest stack `expand(stack)` considered (where the depth limit could have applied)."""
        self.expand(stack)
        return self._deepest[stack]

    def _intern(self, stacks) -> int:
        out, can_end = set(), False
        for s in stacks:
            ex, end = self.expand(s)
            out.update(ex)
            can_end |= end
        if not out and not can_end:
            return DEAD
        key = (tuple(sorted(out)), can_end)
        cid = self._ids.get(key)
        if cid is None:
            cid = len(self._configs)
            self._configs.append(key)
            self._ids[key] = cid
        return cid

    def can_end(self, cid: int) -> bool:
        return self._configs[cid][1]

    def stacks(self, cid: int) -> tuple[tuple, ...]:
        return self._configs[cid][0]

    def step(self, cid: int, byte: int) -> int:
        key = (cid, byte)
        nxt = self._steps.get(key)
        if nxt is None:
            with self._lock:
                trans = self.automaton.trans
                moved = [s[:-1] + (int(trans[s[-1], byte]),) for s in self._configs[cid][0] if trans[s[-1], byte] >= 0]
                nxt = self._intern(moved) if moved else DEAD
                self._steps[key] = nxt
        return nxt

    def advance(self, cid: int, data: bytes) -> int:
        for b in data:
            cid = self.step(cid, b)
            if cid == DEAD:
                return DEAD
        return cid

    # -- plain-text runs (see masks.py) ---------------------------------------------------------------

    def row(self, q: int) -> list[int]:
        """State `q`'s transitions as a list (a single-token walk reads it byte by byte)."""
        hit = self._rows.get(q)
        if hit is None:
            if len(self._rows) >= MAX_CACHED_STATES:
                self._rows.clear()
            hit = self._rows[q] = self.automaton.trans[q].tolist()
        return hit

    def plain_next(self, q: int) -> int:
        """Where every plain character leads from `q`: a state, NONUNIFORM, or ALL_DEAD."""
        hit = self._plain_next.get(q)
        if hit is None:
            hit = self._plain_next[q] = _uniform_char_step(self.automaton.trans, self.fork_states, q)
        return hit

    def multibyte_next(self, q: int) -> int:
        """Where every plain character of two or more bytes leads from `q` (as `plain_next`)."""
        hit = self._multibyte_next.get(q)
        if hit is None:
            hit = _uniform_char_step(self.automaton.trans, self.fork_states, q, multibyte=True)
            self._multibyte_next[q] = hit
        return hit

    def plain_run(self, q: int) -> tuple[int, str]:
        """(n, rest): plain tokens of 1..n characters are allowed from `q` without walking them;
        longer plain tokens die ("dead") or need the byte walk ("walk"). Cached per state."""
        hit = self._plain_run.get(q)
        if hit is not None:
            return hit
        limit = len(self.info.plain_bounds) - 2
        chain, seen, rest = [q], {q: 0}, "dead"
        while len(chain) <= limit:
            nxt = self.plain_next(chain[-1])
            if nxt == ALL_DEAD:
                break
            if nxt == NONUNIFORM:
                rest = "walk"
                break
            if nxt in seen or self.fork_states[nxt]:
                # A cycle keeps every longer token alive; a fork state (a call or return) ends the
                # shortcut there: tokens ending on it are fine, longer ones take the byte walk.
                if nxt in seen:
                    chain = chain + [nxt] * (limit + 1 - len(chain))
                    break
                chain.append(nxt)
                rest = "walk"
                break
            seen[nxt] = len(chain)
            chain.append(nxt)
        result = (min(len(chain) - 1, limit), rest)
        self._plain_run[q] = result
        return result

    def run_lengths(self, states: np.ndarray) -> np.ndarray:
        """`plain_run(q)[0]` for an array of states (0 where the chain shortcut does not apply)."""
        if self._runs_started is False:
            with self._lock:
                # Most states lead different ASCII characters to different places (inside names,
                # numbers, keywords) or read no plain character at all (between JSON values): no
                # chain, decided for every state at once on first use (0.05 ms for a median grammar's
                # 700 states, 3 ms for 17k), so walks meet unknown states rarely.
                trans = self.automaton.trans
                lo, hi = self._plain_ascii_steps()
                self._runs[(lo != hi) | ((hi < 0) & (trans[:, 0xC2:0xF5] < 0).all(axis=1))] = 0
                self._runs_started = True
        runs = self._runs[states]
        unknown = runs < 0
        if unknown.any():
            for q in np.unique(states[unknown]).tolist():
                self._runs[q] = self.plain_run(q)[0]
            runs = self._runs[states]
        return runs

    def _plain_ascii_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """The least and greatest state each state's plain ASCII characters lead to (-1: none).
        Contiguous columns with the quote's and backslash's replaced by a neighbour's: a gather of
        the 93 columns costs 4x as much."""
        if self._ascii_steps is None:
            sub = self.automaton.trans[:, 0x20:0x80].copy()
            sub[:, [0x22 - 0x20, 0x5C - 0x20]] = sub[:, [0x21 - 0x20, 0x5B - 0x20]]
            self._ascii_steps = sub.min(axis=1), sub.max(axis=1)
        return self._ascii_steps

    def plain_loops(self, states: np.ndarray) -> np.ndarray:
        """For each state: does every plain character lead it back to itself (and it is no fork)?"""
        if self._plain_loop is None:
            with self._lock:
                lo, hi = self._plain_ascii_steps()
                maybe = (lo == hi) & (lo == np.arange(self.num_states)) & ~self.fork_states
                self._plain_loop = np.where(maybe, -1, 0).astype(np.int8)  # -1: not decided yet
        v = self._plain_loop[states]
        unknown = v < 0
        if unknown.any():
            for q in np.unique(states[unknown]).tolist():
                self._plain_loop[q] = self.plain_next(q) == q
            v = self._plain_loop[states]
        return v == 1

    def looping_tokens(self, q: int) -> np.ndarray | None:
        """Packed token mask: the tokens whose bytes after the first all loop on `q` (so a token whose
        first character leads to `q` reads the rest there and ends in `q`), where `q` loops on at
        least LOOP_BLOCK_MIN ASCII characters; else None. A character of two or more bytes counts as
        looping where each plain one leads back to `q`, for tokens of plain text. Cached per state."""
        hit = self._looping.get(q, False)
        if hit is not False:
            return hit
        loops = self.automaton.trans[q] == q
        out = None
        if loops[:0x80].sum() >= LOOP_BLOCK_MIN:
            table = self.info.later_bytes
            leave = np.bitwise_or.reduce(table[np.nonzero(~loops[:0x80])[0]], axis=0)
            leave |= table[257] if self.multibyte_next(q) == q else table[256]
            out = ~leave
        with self._lock:
            if len(self._looping) >= MAX_CACHED_STATES:
                del self._looping[next(iter(self._looping))]
            self._looping[q] = out
        return out

    # -- derived per configuration ------------------------------------------------------------------

    def mask(self, cid: int) -> np.ndarray:
        """Allowed tokens as an int32 bitmask row (bit i of word i // 32 is token i); EOS where it may end."""
        m = self._masks.get(cid)
        if m is None:
            with self._lock:
                m = np.zeros(self.info.words, dtype="<i4")
                allowed = None  # tokens found by walking through this configuration's own frames
                for stack in self._configs[cid][0]:
                    st = self.state_tokens(stack[-1])
                    if st.depth + max(len(stack) - 2, 0) < MAX_STACK_DEPTH:
                        m |= st.allowed
                        if len(stack) > 1 and len(st.below_ids):
                            allowed = allowed if allowed is not None else np.zeros(self.info.words * 32, bool)
                            continue_below(self, stack[:-1], st.below_ids, st.below_offsets, allowed)
                    else:  # so deep that the nesting limit may cut a token short: walk it whole
                        allowed = allowed if allowed is not None else np.zeros(self.info.words * 32, bool)
                        stack_walk(self, stack, allowed)
                if allowed is not None:
                    m |= np.packbits(allowed, bitorder="little").view("<i4")
                if self._configs[cid][1]:
                    bits = m.view(np.uint32)
                    for e in self.info.eos_ids:
                        bits[e >> 5] |= np.uint32(1 << (e & 31))
                m.flags.writeable = False
                if len(self._masks) >= MAX_CACHED_MASKS:  # bounded memory: drop the oldest mask
                    del self._masks[next(iter(self._masks))]
                self._masks[cid] = m
        return m

    def state_tokens(self, q: int) -> StateTokens:
        """The tokens state `q` allows whatever lies below it, and those that return below (masks.py)."""
        st = self._state_tokens.get(q)
        if st is None:
            with self._lock:
                key = self._leaf_key(q)
                st = self.info.leaf_walks.get(key) if key is not None else None
                if st is None:
                    st = top_state_tokens(self, q)
                    if key is not None:
                        self.info.leaf_walks.put(key, st)
                if len(self._state_tokens) >= MAX_CACHED_STATES:
                    del self._state_tokens[next(iter(self._state_tokens))]
                self._state_tokens[q] = st
        return st

    def _leaf_key(self, q: int):
        """(expression, its DFA size, state within it) for a state of a rule that calls no other: the walk
        from it is the same in every grammar with that rule, so the tokenizer keeps it (a format, a
        pattern or a string type met again in another schema costs nothing)."""
        a = self.automaton
        if a.leaf_exprs is None:
            return None
        r = bisect.bisect_right(a.starts, q) - 1
        expr = a.leaf_exprs[r]
        size = (a.starts[r + 1] if r + 1 < len(a.starts) else len(a.accept)) - a.starts[r]
        return None if expr is None else (expr, size, q - a.starts[r])

    def allowed_bytes(self, cid: int) -> np.ndarray:
        tops = [s[-1] for s in self._configs[cid][0]]
        if not tops:
            return np.zeros(0, dtype=np.int64)
        return np.nonzero((self.automaton.trans[tops] >= 0).any(axis=0))[0]

    def forced_bytes(self, cid: int) -> bytes:
        """The text every continuation from `cid` starts with (empty where the grammar may end here)."""
        hit = self._forced.get(cid)
        if hit is not None:
            return hit
        out, cur = bytearray(), cid
        while len(out) < MAX_FORCED_BYTES and not self.can_end(cur):
            nxt = self.allowed_bytes(cur)
            if len(nxt) != 1:
                break
            out.append(int(nxt[0]))
            cur = self.step(cur, int(nxt[0]))
        self._forced[cid] = bytes(out)
        return self._forced[cid]

    def cache_info(self) -> dict[str, int]:
        return {"configs": len(self._configs), "masks": len(self._masks), "steps": len(self._steps),
                "states": len(self._state_tokens)}


def _plain_char_automaton() -> np.ndarray:
    """Dense DFA of one plain character (UTF-8, none of PLAIN_EXCLUDED): row 0 starts, -2 = done."""
    from agentkv.grammar.dfa import utf8_sequences
    from agentkv.grammar.expr import complement
    from agentkv.grammar.vocab import PLAIN_EXCLUDED

    rows = [np.full(256, -1, dtype=np.int64)]
    index: dict[tuple, int] = {(): 0}
    for lo, hi in complement(PLAIN_EXCLUDED):
        for seq in utf8_sequences(lo, hi):
            for k, (blo, bhi) in enumerate(seq):
                key = tuple(seq[:k])
                if k == len(seq) - 1:
                    rows[index[key]][blo:bhi + 1] = -2
                else:
                    nxt_key = tuple(seq[:k + 1])
                    if nxt_key not in index:
                        index[nxt_key] = len(rows)
                        rows.append(np.full(256, -1, dtype=np.int64))
                    rows[index[key]][blo:bhi + 1] = index[nxt_key]
    return np.stack(rows)


_PLAIN = _PLAIN_MULTIBYTE = None


def _uniform_char_step(trans: np.ndarray, fork: np.ndarray, q: int, multibyte: bool = False) -> int:
    """Simulate the one-character automaton from `q`: the single state all plain characters reach
    (`multibyte`: all plain characters of two or more bytes)."""
    global _PLAIN, _PLAIN_MULTIBYTE
    if multibyte:
        if (trans[q, 0xC2:0xF5] < 0).all():
            return ALL_DEAD
    else:
        ascii_next = trans[q, ASCII_PLAIN]
        if ascii_next.min() != ascii_next.max():  # e.g. a state inside a property name: decided at once
            return NONUNIFORM
        if ascii_next[0] < 0:  # no one-byte character: uniform only if no longer one starts either
            return ALL_DEAD if (trans[q, 0xC2:0xF5] < 0).all() else NONUNIFORM
    if _PLAIN is None:
        _PLAIN = _plain_char_automaton()
        _PLAIN_MULTIBYTE = _PLAIN.copy()
        _PLAIN_MULTIBYTE[0, :0x80] = -1  # row 0 is only the start: no one-byte character
    automaton = _PLAIN_MULTIBYTE if multibyte else _PLAIN
    # Breadth first, a byte of the character per level (four at most): pairs (DFA state, row of the
    # character automaton), all of a level at once.
    targets: set[int] = set()
    states, rows = np.array([q]), np.array([0])
    while len(states):
        a, t = automaton[rows], trans[states]
        done = a == -2
        targets.update(t[done].tolist())  # -1 among them: some character dies on its last byte
        mid = (a != -1) & ~done
        t_mid, a_mid = t[mid], a[mid]
        if (t_mid < 0).any():
            targets.add(-1)
        if len(targets) > 2:
            return NONUNIFORM
        ok = t_mid >= 0
        pairs = np.unique(t_mid[ok].astype(np.int64) * len(automaton) + a_mid[ok])
        states, rows = pairs // len(automaton), pairs % len(automaton)
        if fork[states].any():
            return NONUNIFORM  # a call or return inside a character: leave it to the byte walk
    if targets == {-1}:
        return ALL_DEAD
    if len(targets) == 1:
        return targets.pop()
    return NONUNIFORM
