"""A grammar's automaton as the token walk reads it (tokens/walk.py, csrc/token_walk.c): flat call
tables, fork and tail flags, each state's reach in plain text and the bytes that loop on it; on the
native path, the grammar's C mask cache too (csrc/mask_cache.c), freed with these tables.

A state's reach (`text_reach`) is how many characters of any plain text (token_trie.TEXT_PHASES)
surely survive from it: unbounded for a text loop (a string body, an open object's names), the room
left on a string with a maximum length, 0 elsewhere. Where every plain character leads one way it is
found for all states at once (`_char_end`, vectorized over the UTF-8 phases); a loop whose
characters go different ways is searched from each state that reads every plain ASCII byte
(`_text_loops`).
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cached_property

import numpy as np

from agentkv.grammar import native
from agentkv.grammar.tokens.trie import BOUNDARY, TEXT_PHASES, WIDE_PHASES
from agentkv.grammar.tokens.walk import walk_failed, walk_python

MAX_WALK_BYTES = 64 << 20  # per grammar: the native walks kept (~3,400 at a 151k vocabulary)
MAX_SHARED_WALK_BYTES = 64 << 20  # per state pool: the walks its grammars share (csrc/mask_cache.c's Store)
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


def text_reach(automaton, cap: int) -> np.ndarray:
    """Per state, how many characters of any plain text (token_trie.TEXT_PHASES) surely survive from
    it, up to `cap` (a token's most): `cap` for a text loop (a string body, an open object's names),
    the room left on a string with a maximum length, 0 where some plain character dies at once or
    plain characters go different ways."""
    trans = automaton.trans
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


class WalkStore:
    """A state pool's walks that hold in each of its grammars (those that never expanded a call of
    the composed rule): csrc/mask_cache.c's Store, freed with the last grammar or pool using it.
    `None`-like where the native walk is off (`ptr` None)."""

    def __init__(self, n_states: int, words: int, budget: int = MAX_SHARED_WALK_BYTES):
        self.lib = native.load()
        self.ptr = None
        if self.lib is not None:
            self.ptr = self.lib.agentkv_store_new(n_states, words, budget)
            if not self.ptr:
                raise MemoryError("no memory for a state pool's shared walks")
            weakref.finalize(self, self.lib.agentkv_store_free, self.ptr)

    def stats(self) -> dict[str, int]:
        """Walks kept, their bytes, walks handed to grammars, walks evicted (empty in Python)."""
        if self.ptr is None:
            return {}
        out = np.zeros(4, dtype=np.int64)
        self.lib.agentkv_store_stats(self.ptr, out.ctypes.data)
        return dict(zip(("shared_walks", "shared_walk_bytes", "shared_walks_taken", "shared_walk_evictions"),
                        out.tolist()))


class WalkTables:
    """One grammar's automaton as the walk reads it; on the native path, the C mask cache too
    (csrc/mask_cache.c: walks per top state under MAX_WALK_BYTES, freed with these tables)."""

    @property
    def text_loop(self) -> np.ndarray:
        """Per state, whether every plain text survives there (its reach is any token's)."""
        return self.text_reach >= self.cap

    @cached_property
    def class_sets(self) -> list[int]:
        """class_bytes as Python ints (256-bit sets; the Python walk's)."""
        return [int.from_bytes(r.tobytes(), "little") for r in self.class_bytes]

    @cached_property
    def reach_lists(self) -> tuple[list[int], list[int]]:
        """text_reach, class_reach and class_wide as lists (the Python walk's)."""
        return self.text_reach.tolist(), self.class_reach.tolist(), self.class_wide.tolist()

    @cached_property
    def rows(self) -> list[list[int]]:
        """The transition table as lists (the Python walk indexes it one entry at a time); a
        composed grammar's are its pool's, made once for all its grammars."""
        return self.row_lists() if self.row_lists is not None else self.trans.tolist()

    def __init__(self, grammar):
        a = grammar.automaton
        n = len(a.accept)
        self.trans = np.ascontiguousarray(a.trans, dtype=np.int32)
        self.accept = a.accept.astype(np.uint8)
        self.fork = np.asarray(grammar.fork_states, dtype=np.uint8)
        self.has_bytes = a.has_bytes.astype(np.uint8)
        self.tail = np.asarray(grammar.tail_states, dtype=np.uint8)
        self.cap = grammar.info.trie.max_len
        self.row_lists = a.tables.get("rows")
        if a.tables:  # composed in a state pool: each part's tables were made with it (grammar/pool.py)
            for name in ("text_reach", "class_bytes", "class_reach", "class_wide", "call_off", "call_rule", "call_ret",
                         "starts"):
                setattr(self, name, a.tables[name])
        else:
            self.text_reach = text_reach(a, self.cap)
            self.class_bytes, self.class_reach, self.class_wide = byte_classes(self.trans, self.cap,
                                                                              self.text_reach >= self.cap)
            callers = sorted(a.calls)
            per = [len(a.calls[c]) for c in callers]
            self.call_off = np.zeros(n + 1, dtype=np.int32)
            np.add.at(self.call_off, np.array(callers, dtype=np.int64) + 1, per)
            self.call_off = np.cumsum(self.call_off, dtype=np.int32)  # a state's calls: [off[s], off[s + 1])
            pairs = [rt for c in callers for rt in a.calls[c]] or [(0, 0)]
            self.call_rule = np.array([r for r, _ in pairs], dtype=np.int32)
            self.call_ret = np.array([t for _, t in pairs], dtype=np.int32)
            self.starts = np.array(a.starts, dtype=np.int32)
        self.max_depth = grammar.max_depth
        self.calls = a.calls  # (the Python walk's)
        self.starts_list = list(a.starts)
        self.struct = native.GrammarStruct(
            *(x.ctypes.data for x in (self.trans, self.fork, self.accept, self.has_bytes, self.tail, self.text_reach,
                                      self.class_bytes, self.class_reach, self.class_wide, self.call_off,
                                      self.call_rule, self.call_ret, self.starts)),
            n, self.max_depth, a.tables.get("variable_rule", -1))
        self.info = grammar.info
        self.lib = native.load()
        self.cache = None
        self.store = a.tables.get("walk_store")  # (kept alive as long as these tables use it)
        if self.lib is not None:
            self.cache = self.lib.agentkv_walks_new(ctypes.byref(self.struct), ctypes.byref(grammar.info.trie_struct),
                                                    grammar.info.words, MAX_WALK_BYTES,
                                                    self.store.ptr if self.store is not None else None)
            if not self.cache:
                raise MemoryError("no memory for the grammar's mask cache")
            weakref.finalize(self, self.lib.agentkv_walks_free, self.cache)

    def mask_into(self, stacks, words: np.ndarray) -> None:
        """OR into `words` the tokens each of `stacks` (tuples of states, bottom first) can read in
        full, in one native call (self.cache must be there)."""
        flat, offsets = _flatten(stacks)
        rc = self.lib.agentkv_walks_mask(self.cache, flat.ctypes.data, offsets.ctypes.data, len(stacks),
                                         words.ctypes.data)
        if rc != 0:
            raise walk_failed(rc)

    def past_into(self, stacks, node: int, base: int, words: np.ndarray) -> None:
        """OR into `words` the tokens under trie `node`, longer than its `base` bytes (which `stacks`
        have read), that the stacks can read on."""
        if self.cache is None:
            for stack in stacks:
                walk_python(self, stack, False, [(node, base)], words)
            return
        flat, offsets = _flatten(stacks)
        rc = self.lib.agentkv_walks_past(self.cache, flat.ctypes.data, offsets.ctypes.data, len(stacks), node, base,
                                         words.ctypes.data)
        if rc != 0:
            raise walk_failed(rc)

    def clear(self) -> None:
        """Forget the walks kept (benchmarks time first computations this way)."""
        if self.cache is not None:
            self.lib.agentkv_walks_clear(self.cache)

    def cache_stats(self) -> dict[str, int]:
        """The native walks kept, their bytes, those computed and those evicted (empty in Python)."""
        if self.cache is None:
            return {}
        out = np.zeros(5, dtype=np.int64)
        self.lib.agentkv_walks_stats(self.cache, out.ctypes.data)
        return dict(zip(("walks", "walk_bytes", "walks_computed", "walk_evictions", "walks_shared"), out.tolist()))


def _flatten(stacks) -> tuple[np.ndarray, np.ndarray]:
    """Stacks as one int32 run and their offsets in it (the native calls' form)."""
    flat = np.fromiter((q for s in stacks for q in s), dtype=np.int32)
    offsets = np.zeros(len(stacks) + 1, dtype=np.int32)
    np.cumsum([len(s) for s in stacks], out=offsets[1:])
    return flat, offsets


def trie_struct(trie) -> native.TrieStruct:
    return native.TrieStruct(*(x.ctypes.data for x in (trie.byte, trie.next, trie.depth, trie.tok, trie.n_end,
                                                       trie.text_chars, trie.root_chars, trie.plain_masks,
                                                       trie.below_bytes, trie.depth_below, trie.wide_below,
                                                       trie.sorted_ids, trie.root_child)),
                             trie.n_nodes, trie.max_len, trie.plain_masks.shape[1])
