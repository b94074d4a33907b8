"""Each state's tables for the token walk (csrc/token_walk.c, tokens/walk.py), found once per grammar.

A state's reach (`text_reach`) is how many characters of any plain text (trie.TEXT_PHASES)
surely survive from it: unbounded for a text loop (a string body, an open object's names), the room
left on a string with a maximum length, 0 elsewhere. Where every plain character leads one way it is
found for all states at once (`_char_end`, vectorized over the UTF-8 phases); a loop whose
characters go different ways is searched from each state that reads every plain ASCII byte
(`_text_loops`). A state's byte class (`byte_classes`) is the bytes that all lead one way, with how
many of them it carries and whether it takes wide characters too.

`state_tables` computes them all in one pass of C (csrc/state_tables.c) where the library loads; the
numpy functions here are its twin, and the tests hold the two equal.
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar import native
from agentkv.grammar.tokens.trie import BOUNDARY, TEXT_PHASES, WIDE_PHASES

MAX_TEXT_ROUNDS = 64  # rounds of the text loop search before it gives up (none taken)


def _phase_order(table) -> tuple[int, ...]:
    """The phases of `table`, each after every phase that leads to it inside a character (Kahn's
    order; the edges back to BOUNDARY, a character's end, left out)."""
    into = [0] * len(table)
    for ranges in table:
        for _, _, after in ranges:
            if after != BOUNDARY:
                into[after] += 1
    order, ready = [], [BOUNDARY]
    while ready:
        p = ready.pop()
        order.append(p)
        for _, _, after in table[p]:
            if after != BOUNDARY:
                into[after] -= 1
                if not into[after]:
                    ready.append(after)
    return tuple(order)


_PHASE_ORDER = _phase_order(TEXT_PHASES)


def text_reach(trans: np.ndarray, cap: int) -> np.ndarray:
    """Per state, how many characters of any plain text (token_trie.TEXT_PHASES) surely survive from
    it, up to `cap` (a token's most): `cap` for a text loop (a string body, an open object's names),
    the room left on a string with a maximum length, 0 where some plain character dies at once or
    plain characters go different ways."""
    n = len(trans)
    nxt = np.full(n, -1, dtype=np.int64)
    ta = trans[:, ord("a")]  # (a cheap first cut: a few plain bytes going one way)
    cands = np.flatnonzero(
        (ta >= 0) & (ta == trans[:, ord(" ")]) & (ta == trans[:, ord("~")]) & (ta == trans[:, ord("0")]))
    nxt[cands] = _char_end(trans, cands, BOUNDARY)
    loops = nxt == np.arange(n)  # every plain character leads back: a loop (others searched state by state)
    ascii_plain = [b for lo, hi, p in TEXT_PHASES[BOUNDARY] if p == BOUNDARY for b in range(lo, hi + 1)]
    keeps = np.flatnonzero(~loops & (ta >= 0) & (trans[:, ord(" ")] >= 0) & (trans[:, ord("0")] >= 0))
    keeps = keeps[(trans[keeps][:, ascii_plain] >= 0).all(axis=1) & (trans[keeps, 0xC2:0xF5] >= 0).all(axis=1)]
    # Searched: the states whose plain characters go different ways, and those whose characters all
    # lead one way along a chain ending at one of them (a declared name's last letter, where any name
    # may go on). A chain ending at a loop is settled already (its reach, below).
    one_way = (nxt >= 0) & ~loops
    end = np.where(one_way, nxt, np.arange(n))
    for _ in range(10):  # (pointer doubling: chains of up to 1,024 states)
        end = end[end]
    multi = np.zeros(n, dtype=bool)
    multi[keeps[nxt[keeps] < 0]] = True
    keeps = keeps[multi[keeps] | multi[end[keeps]]]
    loops[_text_loops(trans, keeps, loops | (one_way & loops[end]))] = True
    reach = np.where(loops, cap, 0).astype(np.int64)
    chained = np.flatnonzero((nxt >= 0) & ~loops)
    for _ in range(cap):  # a chain of k states before a loop or a dead end: k more characters
        grown = np.minimum(cap, 1 + reach[nxt[chained]])
        if (grown <= reach[chained]).all():
            break
        reach[chained] = np.maximum(reach[chained], grown)
    return reach.astype(np.int32)


def byte_classes(trans: np.ndarray, cap: int, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per state, a class of bytes that all lead one way (those leading back to the state, where some
    do; else those going where "a" goes, else "0") as a 256-bit set, and how many characters of any
    text of that class surely survive from it, up to `cap`: `cap` for a loop, the room left on a
    counted repetition of the class (each step's class holding the one before), 0 where there is no
    class. Third, whether the class also takes every wide character past ASCII (token_trie's
    WIDE_PHASES: `[^./]`, `\\S` and `.` do), each leading where its bytes lead, as far as the reach
    says: the walk then allows a subtree of wide text whose ASCII bytes are in the class. Not asked
    of the `texts` states (text loops: their plain-text reach allows more)."""
    n = len(trans)
    own = np.arange(n, dtype=trans.dtype)
    loops = trans == own[:, None]
    to = np.where(loops.any(axis=1), own, np.where(trans[:, ord("a")] >= 0, trans[:, ord("a")], trans[:, ord("0")]))
    members = (trans == to[:, None]) & (to[:, None] >= 0)
    sets = np.packbits(members, axis=1, bitorder="little").view("<u8").copy()
    reach = np.where(to == own, cap, np.where(to >= 0, 1, 0)).astype(np.int64)
    step = np.flatnonzero((to >= 0) & (to != own))
    nxt = to[step]
    held = ~(sets[step] & ~sets[nxt]).any(axis=1)  # the next state's class holds this one's
    step, nxt = step[held], nxt[held]
    for _ in range(cap):
        grown = np.minimum(cap, 1 + reach[nxt])
        if (grown <= reach[step]).all():
            break
        reach[step] = np.maximum(reach[step], grown)
    wide = np.zeros(n, dtype=bool)
    cands = np.flatnonzero((to >= 0) & ~texts & (trans[:, 0xC2:0xF5] >= 0).all(axis=1))  # (every lead byte read)
    wide[cands] = _char_end(trans, cands, BOUNDARY, WIDE_PHASES, past_ascii=True) == to[cands]
    chain = step[reach[step] > 1]  # (a counted repetition: each later step must take them too)
    for _ in range(cap):
        kept = wide[chain] & wide[to[chain]]
        if (kept == wide[chain]).all():
            break
        wide[chain] = kept
    return sets, reach.astype(np.int32), wide.astype(np.uint8)


def _char_end(trans, states: np.ndarray, phase: int, table=TEXT_PHASES, past_ascii: bool = False) -> np.ndarray:
    """Per state, the one state every character of `table` begun in `phase` ends at (-1: they die
    or end at different states); `past_ascii`: only those past ASCII."""
    if not (states >= 0).any():
        return np.full(len(states), -1, dtype=np.int64)  # (nothing to follow: the ranges below need no look)
    out = None
    for lo, hi, after in table[phase]:
        if past_ascii and hi < 0x80:
            continue
        block = trans[np.maximum(states, 0), lo:hi + 1]
        first = block[:, 0]
        to = np.where((states >= 0) & (block == first[:, None]).all(axis=1), first, -1)
        if after != BOUNDARY:
            to = _char_end(trans, to, after, table)
        out = to if out is None else np.where(out == to, out, -1)
    return out


def _text_loops(trans, candidates: np.ndarray, loops: np.ndarray) -> np.ndarray:
    """The candidates (states that read every plain ASCII byte and lead byte: those whose characters
    go different ways, and those whose characters lead one way to one of them) from which no plain
    text dies: a union of a free string with a constrained one, say, whose states step through the
    constrained side while the free side keeps every text alive. The
    greatest fixpoint over (state, UTF-8 phase) pairs, all candidates at once: a pair stays while
    every character's bytes from it lead to pairs that stay (`loops`, the text loops found already,
    stay at a character's end; any other state there is out). Past MAX_TEXT_ROUNDS rounds without
    settling, no candidate is taken (a round leaves a superset: stopping early would overclaim)."""
    n, phases = len(trans), len(TEXT_PHASES)
    if not len(candidates):
        return candidates
    rows = [np.zeros(0, dtype=np.int64) for _ in range(phases)]
    rows[BOUNDARY] = candidates
    pending: dict[int, list] = {p: [] for p in range(phases)}
    for p in _PHASE_ORDER:  # (the states a character's later bytes are read in, each phase after those before it)
        if p != BOUNDARY:
            rows[p] = np.unique(np.concatenate(pending[p])) if pending[p] else rows[p]
        for lo, hi, after in TEXT_PHASES[p]:
            if after != BOUNDARY and len(rows[p]):
                to = trans[rows[p], lo:hi + 1]
                pending[after].append(to[to >= 0])
    # Pairs as ids (phase * n + state; the last id a pair that always stays, padding), each live row
    # with the ids its bytes lead to, gathered once: a round is then one gather.
    width = max(sum(hi - lo + 1 for lo, hi, _ in ranges) for ranges in TEXT_PHASES)
    always = phases * n
    alive = np.zeros(always + 1, dtype=bool)
    alive[always] = True
    alive[:n] = loops
    ids, succ = [], []
    for p in range(phases):
        if not len(rows[p]):
            continue
        cols = [b for lo, hi, _ in TEXT_PHASES[p] for b in range(lo, hi + 1)]
        after = np.array([a for lo, hi, a in TEXT_PHASES[p] for _ in range(lo, hi + 1)], dtype=np.int64)
        to = trans[rows[p]][:, cols].astype(np.int64)
        live = (to >= 0).all(axis=1)
        nxt = np.full((int(live.sum()), width), always, dtype=np.int64)
        nxt[:, :len(cols)] = after * n + to[live]
        ids.append(p * n + rows[p][live])
        succ.append(nxt)
        alive[p * n + rows[p][live]] = True
    ids, succ = np.concatenate(ids), np.concatenate(succ)
    for _ in range(MAX_TEXT_ROUNDS):
        was = alive[ids]
        now = was & alive[succ].all(axis=1)
        if (now == was).all():
            return candidates[alive[candidates]]
        alive[ids] = now
        if not alive[candidates].any():
            break
    return np.zeros(0, dtype=np.int64)


def state_tables(trans: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """text_reach, then byte_classes' three tables: in C (csrc/state_tables.c, one pass over the
    table) where the library loads, else with numpy (the twin the tests hold it to)."""
    lib = native.load()
    if lib is None:
        reach = text_reach(trans, cap)
        return (reach, *byte_classes(trans, cap, reach >= cap))
    n = len(trans)
    trans = np.ascontiguousarray(trans, dtype=np.int32)
    reach, class_reach = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)
    class_bytes, class_wide = np.empty((n, 4), dtype="<u8"), np.empty(n, dtype=np.uint8)
    if lib.agentkv_state_tables(n, trans.ctypes.data, cap, *_TEXT_C, *_WIDE_C, MAX_TEXT_ROUNDS,
                               *(x.ctypes.data for x in (reach, class_bytes, class_reach, class_wide))):
        raise MemoryError("no memory for the grammar's walk tables")
    return reach, class_bytes, class_reach, class_wide


_HELD: list[np.ndarray] = []  # the phase tables' arrays, alive as long as C may read them


def _phases_c(table) -> tuple[int, int, int]:
    """A phase table as csrc/state_tables.c's Phases reads it: (count, offsets' address, ranges'
    address)."""
    off = np.cumsum([0] + [len(ranges) for ranges in table], dtype=np.int32)
    flat = np.array([x for ranges in table for r in ranges for x in r], dtype=np.int32)
    _HELD.extend((off, flat))
    return len(table), off.ctypes.data, flat.ctypes.data


_TEXT_C, _WIDE_C = _phases_c(TEXT_PHASES), _phases_c(WIDE_PHASES)
