"""Plain-text runs: where a grammar state's plain characters lead, for the token walk's shortcuts.

A JSON string body reads most characters as they are ("plain": not a quote, a backslash or a control
character). Per state, lazily: the single state every plain character leads to (`plain_next`, for
characters of two or more bytes `multibyte_next`), the chain of such states and how many characters
it takes (`plain_run`), how many plain characters surely end alive from it, every number where each
leads back to it (`plain_reach`, vectorized), whether plain text of any length lives from it
(`plain_closed`), the tokens whose later bytes all loop on it (`looping_tokens`), and those that
can leave such a loop alive (`leaving_tokens`).
walk_starts.py and masks.py read these to take plain tokens as blocks instead of walking them byte
by byte; the character simulations behind them are char_steps.py. CompiledGrammar inherits them;
it provides `automaton`, `info`, `fork_states` and `_lock`.
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.char_steps import (
    ALL_DEAD,
    LOOPS,
    NONUNIFORM,
    UNKNOWN,
    char_steps,
    plain_closure,
    uniform_char_step,
)
from agentkv.grammar.token_groups import later_chars_leaving

MAX_CACHED_STATES = 4096    # per grammar: top-state token sets (compiled.py), and each per-state table here
MAX_STATES_AT_BUILD = 1024  # a grammar with more states whose ASCII characters all live decides them lazily
LOOP_BLOCK_MIN = 32         # loops on fewer ASCII characters: the byte walk is cheaper than the block


class PlainRuns:
    def _init_plain_runs(self) -> None:
        self._plain_next: dict[int, int] = {}
        self._rows: dict[int, list[int]] = {}
        self._multibyte_next: dict[int, int] = {}
        self._plain_run: dict[int, tuple[int, str]] = {}
        self._looping: dict[int, np.ndarray | None] = {}
        self._closed: dict[int, np.ndarray | None] = {}
        self._leaving: dict[int, np.ndarray | None] = {}
        self._class_chains: dict[int, tuple | None] = {}
        # Lead bytes' transitions (0xC2-0xF4) -> a state with that row whose `multibyte_next` is known:
        # where characters of two or more bytes lead depends on that row alone, so a state beside a
        # string's character chain (after an escape) takes its answer from a chain state's.
        self._lead_rows: dict[bytes, int] = {}
        # Decided for every state at once when the grammar is built (0.1 ms for a median grammar's
        # 700 states, 3 ms for 17k), so that no walk pays for them: the least and greatest state
        # each state's plain ASCII characters lead to (-1: none). Contiguous columns, the quote's
        # and backslash's replaced by a neighbour's (a gather of the 93 columns costs 4x as much).
        trans = self.automaton.trans
        sub = trans[:, 0x20:0x80].copy()
        sub[:, [0x22 - 0x20, 0x5C - 0x20]] = sub[:, [0x21 - 0x20, 0x5B - 0x20]]
        self._ascii_lo, self._ascii_hi = lo, hi = sub.min(axis=1), sub.max(axis=1)
        self._ascii_steps = sub  # where each state's plain ASCII characters lead (plain_closed)
        # Where the live ones all lead to one state (a character class: class_chains.py looks there only).
        self._ascii_one_way = (hi >= 0) & (np.where(sub >= 0, sub, hi[:, None]).min(axis=1) == hi)
        # Those leading only to the least and greatest of them (a name trie's state: the next letter, or
        # the free part): plain_closure reads the two without the row.
        self._ascii_two_ways = ((sub == lo[:, None]) | (sub == hi[:, None])).all(axis=1)
        # `plain_reach` (-1: not decided yet). Most states lead different ASCII characters to different
        # places (inside names, numbers, keywords) or read no plain character at all (between JSON
        # values): no chain, 0. A state may lead every plain character back to itself (a string body)
        # where its ASCII characters do and it does not call or return; its longer characters decide.
        no_chain = (lo != hi) | ((hi < 0) & (trans[:, 0xC2:0xF5] < 0).all(axis=1))
        self._may_loop = (lo == hi) & (lo == np.arange(len(lo))) & ~self.fork_states
        self._reach = np.where(self._may_loop | ~no_chain, -1, 0).astype(np.int32)
        # Where the characters of two or more bytes lead, for the states whose ASCII characters all
        # live (string bodies, names, classes: those the walk asks about), all at once: one state at
        # a time took 50-100 us each inside the walks (a maxLength string's chain: one per state).
        asked = np.nonzero(lo >= 0)[0]
        if len(asked) <= MAX_STATES_AT_BUILD:  # (more: decided a character chain at a time, plain_run)
            self._decide_char_steps(asked)

    def _decide_char_steps(self, states: np.ndarray) -> None:
        """`plain_next` and `multibyte_next` of `states` (whose ASCII characters all live), at once."""
        lo, hi = self._ascii_lo[states], self._ascii_hi[states]
        trans = self.automaton.trans
        steps = char_steps(trans, self.fork_states, states, lo == hi)
        for q, nxt, multi, lead in zip(states.tolist(), *steps, trans[states, 0xC2:0xF5]):
            if nxt != UNKNOWN:
                self._plain_next[q] = nxt
            self._multibyte_next[q] = multi
            self._lead_rows.setdefault(lead.tobytes(), q)

    def _decide_along(self, q: int, most: int, through_decided: bool = False) -> None:
        """`plain_next` of up to `most` states along the chain the ASCII characters lead from `q`,
        decided at once (one state's character simulation costs ~100 us alone, ~30 in a batch). It
        stops at the first state decided already, or with `through_decided` goes on past them (a whole
        maxLength string ahead, for shifts.py)."""
        along, s, decided = {}, q, self._plain_next
        while len(along) < most and s not in along and (through_decided or s not in decided) \
                and self._ascii_lo[s] == self._ascii_hi[s] >= 0:
            along[s] = None
            s = int(self._ascii_lo[s])
        undecided = [s for s in along if s not in decided]
        if len(undecided) > 1:
            self._decide_char_steps(np.array(undecided, dtype=np.int64))

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
            lo = int(self._ascii_lo[q])
            if lo != self._ascii_hi[q]:  # (ASCII characters going different ways: a name's trie, a number)
                hit = NONUNIFORM
            elif lo >= 0:  # all ASCII ones lead to `lo`: uniform where the longer ones do too
                hit = lo if self.multibyte_next(q) == lo else NONUNIFORM
            else:
                hit = uniform_char_step(self.automaton.trans, self.fork_states, q)
            self._plain_next[q] = hit
        return hit

    def multibyte_next(self, q: int) -> int:
        """Where every plain character of two or more bytes leads from `q` (as `plain_next`)."""
        hit = self._multibyte_next.get(q)
        if hit is None:
            lead = self.automaton.trans[q, 0xC2:0xF5].tobytes()
            twin = self._lead_rows.get(lead)
            if twin is not None:  # (a state with the same lead bytes' transitions: the same answer)
                hit = self._multibyte_next[twin]
            else:
                hit = uniform_char_step(self.automaton.trans, self.fork_states, q, multibyte=True)
                self._lead_rows[lead] = q
            self._multibyte_next[q] = hit
        return hit

    def plain_run(self, q: int) -> tuple[int, str]:
        """(n, rest): plain tokens of 1..n characters are allowed from `q` without walking them;
        longer plain tokens die ("dead") or need the byte walk ("walk"). Cached per state."""
        hit = self._plain_run.get(q)
        if hit is not None:
            return hit
        limit = len(self.info.plain_bounds) - 2
        self._decide_along(q, 2 * limit + 1)  # (a maxLength string's chain: a simulation each otherwise)
        chain, seen, rest = [q], {q: 0}, "dead"
        while len(chain) <= 2 * limit:  # past `limit`, for the states along the chain
            nxt = self.plain_next(chain[-1])
            if nxt == ALL_DEAD:
                break
            if nxt == NONUNIFORM:
                rest = "walk"
                break
            if nxt in seen or self.fork_states[nxt]:
                # A cycle keeps every longer token alive; a fork state (a call or return) ends the
                # shortcut there: tokens ending on it are fine, longer ones take the byte walk.
                if nxt in seen:  # every state of the chain keeps every token alive
                    for s in chain:
                        self._plain_run[s] = (limit, rest)
                    return self._plain_run[q]
                chain.append(nxt)
                rest = "walk"
                break
            known = self._plain_run.get(nxt)
            if known is not None:  # the chain joins one followed before (from a state further along)
                n, after = known
                for i, s in enumerate(chain):
                    ahead = len(chain) - i + n
                    self._plain_run[s] = (ahead, after) if ahead < limit else (limit, "dead")
                return self._plain_run[q]
            seen[nxt] = len(chain)
            chain.append(nxt)
        else:  # cut: the states with `limit` characters of chain ahead take every plain token there
            for s in chain[:len(chain) - limit]:
                self._plain_run[s] = (limit, "dead")
            return self._plain_run[q]
        # The states along the chain have its tail as theirs (a fork state at its end has its own).
        ends_on_fork = rest == "walk" and len(chain) > 1 and self.fork_states[chain[-1]]
        for i, s in enumerate(chain[:-1] if ends_on_fork else chain):
            ahead = len(chain) - 1 - i  # (a chain of `limit` ends the walk from there before its end is seen)
            self._plain_run[s] = (min(ahead, limit), rest if ahead < limit + ends_on_fork else "dead")
        return self._plain_run[q]

    def plain_chain(self, q: int, n: int) -> np.ndarray:
        """The states `q` and the first `n` of its character chain (n <= `plain_run(q)[0]`): where k
        plain characters lead from `q`."""
        chain = [q]
        for _ in range(n):
            chain.append(self.plain_next(chain[-1]))
        return np.array(chain, dtype=np.int64)

    def plain_reach(self, states: np.ndarray, rests: np.ndarray | None = None) -> np.ndarray:
        """For each state, how many plain characters from it surely end alive on its chain: LOOPS where
        every plain character leads back to it and it is no fork (a walk then moves past a run of
        plain text at once), else `plain_run`'s length (the token walk's test of whether a token's
        plain rest is done, one lookup a step). Where the tokens' plain `rests` (characters) are
        given, only the entries with some rest left are decided, the others are 0 where not known yet
        (a token that has read all its bytes needs no reach; deciding one costs ~150 us in a large
        grammar, whose character steps are decided a state at a time)."""
        reach = self._reach[states]
        unknown = reach < 0
        if unknown.any():
            ask = unknown if rests is None else unknown & (rests > 0)
            for q in np.unique(states[ask]).tolist():
                loops = self._may_loop[q] and self.plain_next(q) == q
                self._reach[q] = LOOPS if loops else self.plain_run(q)[0]
            reach = self._reach[states]
            if rests is not None:
                reach = np.maximum(reach, 0)
        return reach

    def plain_closed(self, q: int) -> np.ndarray | None:
        """Where plain text of any length stays alive from `q` without a call or return (the names of
        an object that allows other names: the declared names' trie beside the free part), every plain
        token is allowed from `q` whichever states it passes: then the bytes [256] that some state
        plain text reaches from `q` can read, else None. Cached per state (a state of the closure has
        a closure inside it: it takes the same bytes, a superset, which only walks more tokens)."""
        hit = self._closed.get(q, False)
        if hit is not False:
            return hit
        trans = self.automaton.trans
        closure, failed = None, [q]
        if self._ascii_lo[q] >= 0:  # every ASCII character lives: most states fail here (numbers, keywords)
            closure, failed = plain_closure(trans, self._ascii_steps, self._ascii_lo, self.fork_states, q,
                                            self._ascii_hi, self._ascii_two_ways, self._multibyte_next)
        reads = None if closure is None else (trans[closure] >= 0).any(axis=0)
        with self._lock:
            if len(self._closed) + (len(failed) if closure is None else len(closure)) > MAX_CACHED_STATES:
                self._closed.clear()
            for s in failed if closure is None else closure.tolist():
                self._closed[s] = reads
        return reads

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
            leave = self.info.later_any(tuple(np.flatnonzero(~loops[:0x80]).tolist()))
            multibyte = self.multibyte_next(q)
            if multibyte == q:
                leave = leave | table[257]  # a character cut short
            elif multibyte == NONUNIFORM:  # some longer characters loop, some not: the tokens with one
                leave = leave | table[257] | later_chars_leaving(self, q)
            else:  # none loops
                leave = leave | table[256]
            out = ~leave
        with self._lock:
            if len(self._looping) >= MAX_CACHED_STATES:
                del self._looping[next(iter(self._looping))]
            self._looping[q] = out
        return out

    def loop_past_class(self, q: int) -> tuple[int, np.ndarray] | None:
        """(L, `looping_tokens(L)`) where every plain ASCII byte `q` reads leads to one state L other
        than `q` that loops on most bytes (a dot before a hostname's label: `\\.[a-z0-9-]+`): a token
        that starts here, reads its next byte from `q` into L and is in that mask ends in L. Else None."""
        if not self._ascii_one_way[q]:
            return None
        loop_state = int(self._ascii_hi[q])
        loop = self.looping_tokens(loop_state) if loop_state != q else None
        return None if loop is None else (loop_state, loop)

    def leaving_tokens(self, q: int) -> np.ndarray | None:
        """Packed token mask: the tokens holding, after their first byte, a byte that `q` reads into
        another state (any byte from 0x80 counts as one where some such byte does). A token that has
        read just its first byte, sits in `q` and does not end there looping (`looping_tokens`) dies
        unless it is one of these: its first byte that does not loop kills it. None where that does
        not hold: `q` calls or returns, or a byte from 0x80 loops on it. Cached per state."""
        hit = self._leaving.get(q, False)
        if hit is False:
            row = self.automaton.trans[q]
            hit = None
            if not self.fork_states[q] and not (row[0x80:] == q).any():
                leaves = (row >= 0) & (row != q)
                rows = np.flatnonzero(leaves[:0x80]).tolist() + ([256] if leaves[0x80:].any() else [])
                hit = self.info.later_any(tuple(rows)).view("<i4")  # (none: all zero)
            with self._lock:
                if len(self._leaving) >= MAX_CACHED_STATES:
                    del self._leaving[next(iter(self._leaving))]
                self._leaving[q] = hit
        return hit
