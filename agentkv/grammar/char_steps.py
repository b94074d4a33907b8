"""The one-character automaton run against a grammar's DFA: where every plain character (see
token_tables.PLAIN_EXCLUDED), or every one of two or more bytes, leads from a state; for one state
(`uniform_char_step`, the reference), for many at once (`char_steps`), and the set of states plain
text reaches (`plain_closure`, `multibyte_targets`). plain_runs.py caches these per state.
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.token_tables import ASCII_PLAIN

NONUNIFORM, ALL_DEAD = -1, -2  # where plain characters lead from a state (CompiledGrammar.plain_next)
LOOPS = 1 << 20  # CompiledGrammar.plain_reach of a state every plain character leads back to

MAX_CLOSED_STATES = 512     # a plain-text closure bigger than this is left to the walk (plain_closed)


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


def plain_closure(trans: np.ndarray, ascii_steps: np.ndarray, ascii_lo: np.ndarray, fork: np.ndarray,
                  q: int, ascii_hi: np.ndarray, two_ways: np.ndarray,
                  multibyte: dict[int, int]) -> tuple[np.ndarray | None, list[int]]:
    """(closure, failed): the states plain characters reach from `q`, where each reads every plain
    character (of any length) into another of them and none is a fork state; else None, with states
    known to fail too (`q` and, where an ASCII step found the failing state, the states on the way
    there: they reach it as well, so a maxLength string's chain is followed once, not once per state).
    Depth first over the ASCII characters in plain Python (`ascii_steps` holds each state's plain
    ASCII steps, `ascii_lo` the least of them; a level of numpy per character of a long declared name
    cost more), then the characters of two or more bytes from all states found so far at once (rarely
    anywhere new). Where `two_ways[s]`, state s's ASCII steps are `ascii_lo[s]` and `ascii_hi[s]`
    alone (a name's trie: the next letter of a name, or the free part), read without its row. Where
    `multibyte` has a state's `multibyte_next` (decided when the grammar was built), its longer
    characters' target is read from there: only the states it has as NONUNIFORM are simulated."""
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
            steps = (int(ascii_lo[s]), int(ascii_hi[s])) if two_ways[s] else set(ascii_steps[s].tolist())
            for t in steps:
                if t not in seen:
                    seen[t] = s
                    todo.append(t)
                    fresh.append(t)
            if len(seen) > MAX_CLOSED_STATES:
                return None, [q]
        # States with the same steps on the bytes of longer characters reach the same states by them:
        # one of each (the states of a name's trie all step like the free part).
        known = [multibyte.get(s, NONUNIFORM) for s in fresh]
        if ALL_DEAD in known:  # (no character of two or more bytes lives there)
            return None, [q]
        reached = {t for t in known if t >= 0}
        fresh = np.array([s for s, t in zip(fresh, known) if t == NONUNIFORM], dtype=np.int64)
        if len(fresh):
            fresh = fresh[list({row.tobytes(): i for i, row in enumerate(trans[fresh, 0x80:])}.values())]
            more = multibyte_targets(trans, fork, fresh)
            if more is None:
                return None, [q]
            reached.update(more.tolist())
        todo = [t for t in sorted(reached) if t not in seen]
        fresh = list(todo)
        seen.update(dict.fromkeys(todo, -1))  # (reached by a longer character: no ASCII path kept)
    return np.array(sorted(seen), dtype=np.int64), []


def multibyte_targets(trans: np.ndarray, fork: np.ndarray, states: np.ndarray) -> np.ndarray | None:
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


UNKNOWN = -3  # (char_steps: not decided there)


def char_steps(trans: np.ndarray, fork: np.ndarray, states: np.ndarray, ascii_uniform: np.ndarray):
    """`plain_next` (where `ascii_uniform`, else UNKNOWN) and `multibyte_next` of many states at once:
    the one-character automaton stepped from all of them together, a byte per level, as triples
    (origin, DFA state, character-automaton row). The same answers as `uniform_char_step` per state."""
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


def uniform_char_step(trans: np.ndarray, fork: np.ndarray, q: int, multibyte: bool = False) -> int:
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
    # (Written for few numpy calls a level: it runs once per state a walk meets, 84 us against 103
    # for a numpy unique a level.)
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
