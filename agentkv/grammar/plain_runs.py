"""Plain-text runs: where a grammar state's plain characters lead, for the token walk's shortcuts.

A JSON string body reads most characters as they are ("plain": not a quote, a backslash or a control
character). Per state, lazily: the single state every plain character leads to (`plain_next`, for
characters of two or more bytes `multibyte_next`), the chain of such states and how many characters
it takes (`plain_run`), how many plain characters surely end alive from it, every number where each
leads back to it (`plain_reach`, vectorized), whether plain text of any length lives from it
(`plain_closed`), and the tokens whose later bytes all loop on it (`looping_tokens`).
masks.py reads these to take plain tokens as blocks instead of walking them byte by byte.
CompiledGrammar inherits them; it provides `automaton`, `info`, `fork_states` and `_lock`.
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.masks import ALL_DEAD, LOOPS, NONUNIFORM
from agentkv.grammar.token_tables import ASCII_PLAIN

MAX_CACHED_STATES = 4096    # per grammar: top-state token sets (compiled.py), and each per-state table here
MAX_STATES_AT_BUILD = 1024  # a grammar with more states whose ASCII characters all live decides them lazily
MAX_CLOSED_STATES = 512     # a plain-text closure bigger than this is left to the walk (plain_closed)
LOOP_BLOCK_MIN = 32         # loops on fewer ASCII characters: the byte walk is cheaper than the block


class PlainRuns:
    def _init_plain_runs(self) -> None:
        self._plain_next: dict[int, int] = {}
        self._rows: dict[int, list[int]] = {}
        self._multibyte_next: dict[int, int] = {}
        self._plain_run: dict[int, tuple[int, str]] = {}
        self._looping: dict[int, np.ndarray | None] = {}
        self._closed: dict[int, np.ndarray | None] = {}
        # Decided for every state at once when the grammar is built (0.1 ms for a median grammar's
        # 700 states, 3 ms for 17k), so that no walk pays for them: the least and greatest state
        # each state's plain ASCII characters lead to (-1: none). Contiguous columns, the quote's
        # and backslash's replaced by a neighbour's (a gather of the 93 columns costs 4x as much).
        trans = self.automaton.trans
        sub = trans[:, 0x20:0x80].copy()
        sub[:, [0x22 - 0x20, 0x5C - 0x20]] = sub[:, [0x21 - 0x20, 0x5B - 0x20]]
        self._ascii_lo, self._ascii_hi = lo, hi = sub.min(axis=1), sub.max(axis=1)
        self._ascii_steps = sub  # where each state's plain ASCII characters lead (plain_closed)
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
        steps = _char_steps(self.automaton.trans, self.fork_states, states, lo == hi)
        for q, nxt, multi in zip(states.tolist(), *steps):
            if nxt != UNKNOWN:
                self._plain_next[q] = nxt
            self._multibyte_next[q] = multi

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
        # The chain the ASCII characters lead along, decided at once (a maxLength string's 2 x limit
        # states otherwise cost a character simulation each).
        along, s = {}, q
        while len(along) <= 2 * limit and s not in along and s not in self._plain_next \
                and self._ascii_lo[s] == self._ascii_hi[s] >= 0:
            along[s] = None
            s = int(self._ascii_lo[s])
        if len(along) > 1:
            self._decide_char_steps(np.array(list(along), dtype=np.int64))
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

    def plain_reach(self, states: np.ndarray) -> np.ndarray:
        """For each state, how many plain characters from it surely end alive on its chain: LOOPS where
        every plain character leads back to it and it is no fork (a walk then moves past a run of
        plain text at once), else `plain_run`'s length (the token walk's test of whether a token's
        plain rest is done, one lookup a step)."""
        reach = self._reach[states]
        unknown = reach < 0
        if unknown.any():
            for q in np.unique(states[unknown]).tolist():
                loops = self._may_loop[q] and self.plain_next(q) == q
                self._reach[q] = LOOPS if loops else self.plain_run(q)[0]
            reach = self._reach[states]
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
            closure, failed = _plain_closure(trans, self._ascii_steps, self._ascii_lo, self.fork_states, q)
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
            leave = np.bitwise_or.reduce(table[np.nonzero(~loops[:0x80])[0]], axis=0)
            leave |= table[257] if self.multibyte_next(q) == q else table[256]
            out = ~leave
        with self._lock:
            if len(self._looping) >= MAX_CACHED_STATES:
                del self._looping[next(iter(self._looping))]
            self._looping[q] = out
        return out


def _plain_char_automaton() -> np.ndarray:
    """Dense DFA of one plain character (UTF-8, none of PLAIN_EXCLUDED): row 0 starts, -2 = done."""
    from agentkv.grammar.dfa import utf8_sequences
    from agentkv.grammar.expr import complement
    from agentkv.grammar.token_tables import PLAIN_EXCLUDED

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


def _plain_automata() -> tuple[np.ndarray, np.ndarray]:
    global _PLAIN, _PLAIN_MULTIBYTE
    if _PLAIN is None:
        _PLAIN = _plain_char_automaton()
        _PLAIN_MULTIBYTE = _PLAIN.copy()
        _PLAIN_MULTIBYTE[0, :0x80] = -1  # row 0 is only the start: no one-byte character
    return _PLAIN, _PLAIN_MULTIBYTE


def _plain_closure(trans: np.ndarray, ascii_steps: np.ndarray, ascii_lo: np.ndarray, fork: np.ndarray,
                   q: int) -> tuple[np.ndarray | None, list[int]]:
    """(closure, failed): the states plain characters reach from `q`, where each reads every plain
    character (of any length) into another of them and none is a fork state; else None, with states
    known to fail too (`q` and, where an ASCII step found the failing state, the states on the way
    there: they reach it as well, so a maxLength string's chain is followed once, not once per state).
    Depth first over the ASCII characters in plain Python (`ascii_steps` holds each state's plain
    ASCII steps, `ascii_lo` the least of them; a level of numpy per character of a long declared name
    cost more), then the characters of two or more bytes from all states found so far at once (rarely
    anywhere new)."""
    seen, todo, fresh = {q: -1}, [q], [q]  # seen: state -> the state an ASCII step first reached it from
    while todo:
        while todo:
            s = todo.pop()
            if fork[s] or ascii_lo[s] < 0:
                failed = [q]
                while s >= 0 and s != q:  # back to `q`, or to a state a longer character reached
                    failed.append(s)
                    s = seen[s]
                return None, failed
            for t in set(ascii_steps[s].tolist()):
                if t not in seen:
                    seen[t] = s
                    todo.append(t)
                    fresh.append(t)
            if len(seen) > MAX_CLOSED_STATES:
                return None, [q]
        # States with the same steps on the bytes of longer characters reach the same states by them:
        # one of each (the states of a name's trie all step like the free part).
        fresh = np.array(fresh, dtype=np.int64)
        fresh = fresh[list({row.tobytes(): i for i, row in enumerate(trans[fresh, 0x80:])}.values())]
        reached = _multibyte_targets(trans, fork, fresh)
        if reached is None:
            return None, [q]
        todo = [t for t in reached.tolist() if t not in seen]
        fresh = list(todo)
        seen.update(dict.fromkeys(todo, -1))  # (reached by a longer character: no ASCII path kept)
    return np.array(sorted(seen), dtype=np.int64), []


def _multibyte_targets(trans: np.ndarray, fork: np.ndarray, states: np.ndarray) -> np.ndarray | None:
    """Where the plain characters of two or more bytes lead from `states`, a byte per level (pairs of
    DFA state and character-automaton row); None if one dies or passes a fork state inside."""
    _, automaton = _plain_automata()
    rows = np.zeros(len(states), dtype=np.int64)
    reached = []
    while len(states):
        a, t = automaton[rows], trans[states]
        live = a != -1
        if (t[live] < 0).any() or fork[states].any():
            return None
        done = a == -2
        reached.append(t[done])
        mid = live & ~done
        pairs = np.unique(t[mid].astype(np.int64) * len(automaton) + a[mid])
        states, rows = pairs // len(automaton), pairs % len(automaton)
    return np.unique(np.concatenate(reached)).astype(np.int64)


UNKNOWN = -3  # (_char_steps: not decided there)


def _char_steps(trans: np.ndarray, fork: np.ndarray, states: np.ndarray, ascii_uniform: np.ndarray):
    """`plain_next` (where `ascii_uniform`, else UNKNOWN) and `multibyte_next` of many states at once:
    the one-character automaton stepped from all of them together, a byte per level, as triples
    (origin, DFA state, character-automaton row). The same answers as `_uniform_char_step` per state."""
    _, automaton = _plain_automata()
    n, lead = len(states), np.arange(0xC2, 0xF5)
    dies, forks = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    origin = np.repeat(np.arange(n), len(lead))
    at = trans[states, 0xC2:0xF5].reshape(-1).astype(np.int64)
    rows = np.tile(automaton[0, lead], n)
    least, most = np.full(n, len(trans), dtype=np.int64), np.full(n, -1, dtype=np.int64)  # targets reached
    while len(origin):  # (origins stay in order: each level's triples are sorted by them)
        dead = at < 0
        dies[origin[dead]] = True
        finished = (rows == -2) & ~dead
        if finished.any():
            o, t = origin[finished], at[finished]
            starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
            least[o[starts]] = np.minimum(least[o[starts]], np.minimum.reduceat(t, starts))
            most[o[starts]] = np.maximum(most[o[starts]], np.maximum.reduceat(t, starts))
        mid = ~dead & ~finished
        origin, at, rows = origin[mid], at[mid], rows[mid]
        forks[origin[fork[at]]] = True  # a call or return inside a character
        key = np.unique((origin * len(trans) + at) * len(automaton) + rows)
        cells = len(trans) * len(automaton)
        origin, at, rows = key // cells, key // len(automaton) % len(trans), key % len(automaton)
        nxt_rows = automaton[rows, 0x80:0xC0]
        live = nxt_rows != -1
        origin = np.repeat(origin, live.sum(axis=1))
        at, rows = trans[at, 0x80:0xC0][live].astype(np.int64), nxt_rows[live]
    count = np.where(most < 0, 0, np.where(least == most, 1, 2))  # distinct targets, 2 for two or more
    first = least
    none_read = (trans[states, 0xC2:0xF5] < 0).all(axis=1)
    single = (count == 1) & ~dies & ~forks
    multi = np.where(none_read, ALL_DEAD, np.where(single, first, np.where((count == 0) & dies & ~forks, ALL_DEAD,
                                                                                 NONUNIFORM)))
    ascii_next = trans[states, 0x41]  # any plain ASCII character: where `ascii_uniform`, they all lead there
    plain = np.where(~ascii_uniform, UNKNOWN,
                     np.where(forks | dies | (count > 1) | ((count == 1) & (first != ascii_next)),
                              NONUNIFORM, ascii_next))
    return plain.tolist(), multi.tolist()


def _uniform_char_step(trans: np.ndarray, fork: np.ndarray, q: int, multibyte: bool = False) -> int:
    """Simulate the one-character automaton from `q`: the single state all plain characters reach
    (`multibyte`: all plain characters of two or more bytes)."""
    if multibyte:
        if (trans[q, 0xC2:0xF5] < 0).all():
            return ALL_DEAD
    else:
        ascii_next = trans[q, ASCII_PLAIN]
        if ascii_next.min() != ascii_next.max():  # e.g. a state inside a property name: decided at once
            return NONUNIFORM
        if ascii_next[0] < 0:  # no one-byte character: uniform only if no longer one starts either
            return ALL_DEAD if (trans[q, 0xC2:0xF5] < 0).all() else NONUNIFORM
    plain, plain_multibyte = _plain_automata()
    automaton = plain_multibyte if multibyte else plain
    # Breadth first, a byte of the character per level (four at most): pairs (DFA state, row of the
    # character automaton), all of a level at once.
    # (Written for few numpy calls a level: this runs once per state the walk meets, ~50 us.)
    targets: set[int] = set()
    states, rows, n_rows = np.array([q]), np.array([0]), len(automaton)
    while len(states):
        a, t = automaton[rows], trans[states]
        ends = t[a == -2]  # -1 among them: some character dies on its last byte
        if len(ends):
            lo, hi = int(ends.min()), int(ends.max())
            targets.update((lo,) if lo == hi else np.unique(ends).tolist())
        mid = a >= 0
        t_mid = t[mid]
        if len(t_mid) and t_mid.min() < 0:
            targets.add(-1)
            ok = t_mid >= 0
            t_mid, a_mid = t_mid[ok], a[mid][ok]
        else:
            a_mid = a[mid]
        if len(targets) > 2:
            return NONUNIFORM
        pairs = sorted(set((t_mid.astype(np.int64) * n_rows + a_mid).tolist()))
        states = np.array(pairs, dtype=np.int64) // n_rows
        rows = np.array(pairs, dtype=np.int64) % n_rows
        if fork[states].any():
            return NONUNIFORM  # a call or return inside a character: leave it to the byte walk
    if targets == {-1}:
        return ALL_DEAD
    if len(targets) == 1:
        return targets.pop()
    return NONUNIFORM
