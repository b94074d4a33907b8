"""The token walk: which tokens a parser stack can read next, walked over the tokenizer's byte trie.

The walk (csrc/token_walk.c has the full account; this module is its Python twin, used where the
native code is off or cannot be built) goes depth first through the trie (token_trie.py) with, at
each depth, the set of parser stacks the path so far can have left. A byte no stack reads skips the
node's subtree; a shared prefix is stepped once; a token ending at a node where some stack read its
last byte is allowed. Stacks are (top state, frame) pairs over interned frames; where a top can call
or return, the stack is expanded (once per walk). Two shortcuts: from a state where any plain text of
k characters survives (k unbounded for a text loop: a string body, an open object's names; the room
left on a string with a maximum length), a subtree whose tokens read plain text of at most k
characters from there on is allowed whole; so is a subtree whose every byte leads the state back to
itself (a loop over a class).

Most of a mask depends on the top state alone: the walk runs once per top state with the frames
below unknown (`top_state_tokens`, "relative"), which yields the tokens allowed whatever lies below
and the trie nodes where a return below the frame happens (with the bytes read there). A stack's
mask is those tokens plus the tokens below those nodes walked on from the real frames
(`continue_below`). Where the nesting limit could cut a token short, the whole real stack is walked
instead (`stack_walk`).
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from agentkv.grammar import native
from agentkv.grammar.token_trie import BOUNDARY, TEXT_PHASES

MAX_WALK_BYTES = 64 << 20  # per grammar: the native walks kept (~3,400 at a 151k vocabulary)
MAX_TEXT_PAIRS = 4096  # a text loop check that visits more (state, phase) pairs than this says no
NO_BELOW = np.zeros((0, 2), dtype=np.int32)


@dataclass(frozen=True)
class StateTokens:
    """What a top state allows whatever lies below it (see the module docstring)."""

    allowed: np.ndarray  # packed bitmask words (int32, bit i of word i // 32 is token i)
    below: np.ndarray    # [k, 2] int32: (trie node, bytes read): the longer tokens under that node
                         # return below the frame there (node -1: every token, before its first byte)
    depth: int           # the longest relative stack the walk considered (for the depth limit)


def text_reach(automaton, cap: int) -> np.ndarray:
    """Per state, how many characters of any plain text (token_trie.TEXT_PHASES) surely survive from
    it, up to `cap` (a token's most): `cap` for a text loop (a string body, an open object's names),
    the room left on a string with a maximum length, 0 where some plain character dies at once or
    plain characters go different ways."""
    trans = automaton.trans
    n = len(trans)
    nxt = np.full(n, -1, dtype=np.int64)
    ta = trans[:, ord("a")]  # (a cheap first cut: a few plain bytes going one way)
    cands = np.flatnonzero((ta >= 0) & (ta == trans[:, ord(" ")]) & (ta == trans[:, ord("~")]) & (ta == trans[:, ord("0")]))
    nxt[cands] = _char_end(trans, cands, BOUNDARY)
    loops = nxt == np.arange(n)  # every plain character leads back: a loop (others searched state by state)
    loops[_text_loops(trans, np.flatnonzero((ta == np.arange(n)) & ~loops))] = True
    reach = np.where(loops, cap, 0).astype(np.int64)
    chained = np.flatnonzero((nxt >= 0) & ~loops)
    for _ in range(cap):  # a chain of k states before a loop or a dead end: k more characters
        grown = np.minimum(cap, 1 + reach[nxt[chained]])
        if (grown <= reach[chained]).all():
            break
        reach[chained] = np.maximum(reach[chained], grown)
    return reach.astype(np.int32)


def _char_end(trans, states: np.ndarray, phase: int) -> np.ndarray:
    """Per state, the one state every plain character begun in `phase` ends at (-1: they die or
    end at different states)."""
    out = None
    for lo, hi, after in TEXT_PHASES[phase]:
        block = trans[np.maximum(states, 0), lo:hi + 1]
        first = block[:, 0]
        to = np.where((states >= 0) & (block == first[:, None]).all(axis=1), first, -1)
        if after != BOUNDARY:
            to = _char_end(trans, to, after)
        out = to if out is None else np.where(out == to, out, -1)
    return out


def _text_loops(trans, candidates: np.ndarray) -> np.ndarray:
    """The candidates from which every plain text survives, where plain characters do not all lead
    one way (a product of the state with the UTF-8 phases, searched where the state keeps plain
    ASCII on itself)."""
    ascii_plain = [b for lo, hi, p in TEXT_PHASES[BOUNDARY] if p == BOUNDARY for b in range(lo, hi + 1)]
    candidates = candidates[(trans[candidates][:, ascii_plain] == candidates[:, None]).all(axis=1)]
    out = []
    for q in candidates.tolist():
        seen, todo, ok = {(q, BOUNDARY)}, [(q, BOUNDARY)], True
        while todo and ok:
            s, phase = todo.pop()
            for lo, hi, nxt in TEXT_PHASES[phase]:
                to = trans[s, lo:hi + 1]
                if (to < 0).any():
                    ok = False
                    break
                for t in np.unique(to).tolist():
                    if (t, nxt) not in seen:
                        seen.add((t, nxt))
                        todo.append((t, nxt))
            if len(seen) > MAX_TEXT_PAIRS:
                ok = False
        if ok:
            out.append(q)
    return np.array(out, dtype=np.int64)


class WalkTables:
    """One grammar's automaton as the walk reads it; on the native path, the C mask cache too
    (csrc/mask_cache.c: walks per top state under MAX_WALK_BYTES, freed with these tables)."""

    @property
    def text_loop(self) -> np.ndarray:
        """Per state, whether every plain text survives there (its reach is any token's)."""
        return self.text_reach >= self.cap

    @cached_property
    def loop_sets(self) -> list[int]:
        """loop_bytes as Python ints (256-bit sets; the Python walk's)."""
        return [int.from_bytes(r.tobytes(), "little") for r in self.loop_bytes]

    @cached_property
    def rows(self) -> list[list[int]]:
        """The transition table as lists (the Python walk indexes it one entry at a time)."""
        return self.trans.tolist()

    def __init__(self, grammar):
        a = grammar.automaton
        n = len(a.accept)
        self.trans = np.ascontiguousarray(a.trans, dtype=np.int32)
        self.accept = a.accept.astype(np.uint8)
        self.fork = np.asarray(grammar.fork_states, dtype=np.uint8)
        self.has_bytes = a.has_bytes.astype(np.uint8)
        self.tail = np.asarray(grammar.tail_states, dtype=np.uint8)
        self.cap = grammar.info.trie.max_len
        self.text_reach = text_reach(a, self.cap)
        loops = self.trans == np.arange(n, dtype=np.int32)[:, None]  # the bytes leading a state back to itself
        self.loop_bytes = np.packbits(loops, axis=1, bitorder="little").view("<u8").copy()
        self.has_loop = loops.any(axis=1).astype(np.uint8)
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
                                      self.loop_bytes, self.has_loop, self.call_off, self.call_rule, self.call_ret,
                                      self.starts)),
            n, self.max_depth)
        self.info = grammar.info
        self.lib = native.load()
        self.cache = None
        if self.lib is not None:
            self.cache = self.lib.agentkv_walks_new(ctypes.byref(self.struct), ctypes.byref(grammar.info.trie_struct),
                                                    grammar.info.words, MAX_WALK_BYTES)
            if not self.cache:
                raise MemoryError("no memory for the grammar's mask cache")
            weakref.finalize(self, self.lib.agentkv_walks_free, self.cache)

    def mask_into(self, stacks, words: np.ndarray) -> None:
        """OR into `words` the tokens each of `stacks` (tuples of states, bottom first) can read in
        full, in one native call (self.cache must be there)."""
        flat, offsets = _flatten(stacks)
        if self.lib.agentkv_walks_mask(self.cache, flat.ctypes.data, offsets.ctypes.data, len(stacks),
                                       words.ctypes.data) != 0:
            raise MemoryError("the native token walk ran out of memory")

    def past_into(self, stacks, node: int, base: int, words: np.ndarray) -> None:
        """OR into `words` the tokens under trie `node`, longer than its `base` bytes (which `stacks`
        have read), that the stacks can read on."""
        if self.cache is None:
            for stack in stacks:
                _walk_python(self, stack, False, [(node, base)], words)
            return
        flat, offsets = _flatten(stacks)
        if self.lib.agentkv_walks_past(self.cache, flat.ctypes.data, offsets.ctypes.data, len(stacks), node, base,
                                       words.ctypes.data) != 0:
            raise MemoryError("the native token walk ran out of memory")

    def clear(self) -> None:
        """Forget the walks kept (benchmarks time first computations this way)."""
        if self.cache is not None:
            self.lib.agentkv_walks_clear(self.cache)

    def cache_stats(self) -> dict[str, int]:
        """The native walks kept, their bytes, those computed and those evicted (empty in Python)."""
        if self.cache is None:
            return {}
        out = np.zeros(4, dtype=np.int64)
        self.lib.agentkv_walks_stats(self.cache, out.ctypes.data)
        return dict(zip(("walks", "walk_bytes", "walks_computed", "walk_evictions"), out.tolist()))


def _flatten(stacks) -> tuple[np.ndarray, np.ndarray]:
    """Stacks as one int32 run and their offsets in it (the native calls' form)."""
    flat = np.fromiter((q for s in stacks for q in s), dtype=np.int32)
    offsets = np.zeros(len(stacks) + 1, dtype=np.int32)
    np.cumsum([len(s) for s in stacks], out=offsets[1:])
    return flat, offsets


def _walk_python(tables: WalkTables, stack: tuple, relative: bool, starts: list, words: np.ndarray):
    return _PyWalk(tables, tables.info.trie, relative, words).run(stack, starts)


def trie_struct(trie) -> native.TrieStruct:
    return native.TrieStruct(*(x.ctypes.data for x in (trie.byte, trie.next, trie.depth, trie.tok, trie.n_end,
                                                       trie.text_chars, trie.root_chars, trie.plain_masks,
                                                       trie.below_bytes, trie.sorted_ids)),
                             trie.n_nodes, trie.max_len, trie.plain_masks.shape[1])


def top_state_tokens(grammar, q: int) -> StateTokens:
    """Walk every token from state `q` with the frames below it unknown."""
    words = np.zeros(grammar.info.words, dtype="<i4")
    below, depth = _walk(grammar, (q,), True, np.array([[-1, 0]], dtype=np.int32), words)
    return StateTokens(words, below, depth)


def stack_walk(grammar, stack: tuple, words: np.ndarray) -> None:
    """Set the bits in `words` of every token the real `stack` (bottom first) can read in full."""
    _walk(grammar, stack, False, np.array([[-1, 0]], dtype=np.int32), words)


def continue_below(grammar, lower: tuple, below: np.ndarray, words: np.ndarray) -> None:
    """The tokens under `below`'s nodes, walked on from the real stack `lower` (its top the return
    state), into `words`."""
    if not lower or not len(below):
        return  # returned from the bottom frame: the grammar ended, so longer tokens die
    _walk(grammar, lower, False, below, words)


def _walk(grammar, stack: tuple, relative: bool, starts: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, int]:
    info = grammar.info
    lib = native.load()
    if lib is None:
        return _walk_python(grammar.walk_tables, stack, relative, starts.tolist(), words)
    trie = info.trie
    stack_arr = np.array(stack, dtype=np.int32)
    starts = np.ascontiguousarray(starts, dtype=np.int32)
    below = np.empty((trie.n_nodes + 1, 2) if relative else (0, 2), dtype=np.int32)
    n_below, depth = ctypes.c_int64(0), ctypes.c_int32(0)
    rc = lib.agentkv_token_walk(ctypes.byref(grammar.walk_tables.struct), ctypes.byref(info.trie_struct),
                                stack_arr.ctypes.data, len(stack), int(relative), starts.ctypes.data, len(starts),
                                words.ctypes.data, below.ctypes.data, ctypes.byref(n_below), ctypes.byref(depth))
    if rc != 0:
        raise MemoryError("the native token walk ran out of memory")
    return below[:n_below.value].copy(), depth.value


class _PyWalk:
    """The walk in Python (csrc/token_walk.c's twin, step for step)."""

    def __init__(self, tables: WalkTables, trie, relative: bool, words: np.ndarray):
        self.tb, self.rel = tables, int(relative)
        self.trie = trie
        self.bits = words.view(np.uint32)
        self.frames: dict[tuple[int, int], int] = {}
        self.frame_state: list[int] = []
        self.frame_parent: list[int] = []
        self.frame_len: list[int] = []
        self.memo: dict[tuple[int, int], tuple[list, bool]] = {}
        self.below: list[tuple[int, int]] = []
        self.depth = 0

    def frame(self, state: int, parent: int) -> int:
        f = self.frames.get((state, parent))
        if f is None:
            f = self.frames[(state, parent)] = len(self.frame_state)
            self.frame_state.append(state)
            self.frame_parent.append(parent)
            self.frame_len.append(1 + (self.frame_len[parent] if parent >= 0 else 0))
        return f

    def length(self, pair: tuple[int, int]) -> int:
        return 1 + (self.frame_len[pair[1]] if pair[1] >= 0 else 0) + self.rel

    def expansion(self, pair: tuple[int, int]) -> tuple[list, bool]:
        """The stacks `pair` leads to by calls and returns alone whose tops read bytes; can it end?"""
        hit = self.memo.get(pair)
        if hit is not None:
            return hit
        tb = self.tb
        out, can_end, seen, work = [], False, set(), [pair]
        while work:
            s = work.pop()
            if s in seen:
                continue
            seen.add(s)
            top, parent = s
            n = self.length(s)
            self.depth = max(self.depth, n)
            if tb.has_bytes[top]:
                out.append(s)
            if n < tb.max_depth:
                for rule, ret in tb.calls.get(top, ()):
                    work.append((tb.starts_list[rule], parent if tb.tail[ret] else self.frame(ret, parent)))
            if tb.accept[top]:
                if parent < 0:
                    can_end = True
                else:
                    work.append((self.frame_state[parent], self.frame_parent[parent]))
        hit = self.memo[pair] = (out, can_end)
        return hit

    def allow(self, lo: int, hi: int) -> None:
        ids = self.trie.sorted_ids[lo:hi]
        np.bitwise_or.at(self.bits, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))

    def run(self, stack: tuple, starts: list) -> tuple[np.ndarray, int]:
        parent = -1
        for s in stack[:-1]:
            parent = self.frame(s, parent)
        top = (stack[-1], parent)
        self.depth = self.length(top)
        self.reach0 = -1
        reach = int(self.tb.text_reach[top[0]])
        if self.rel and len(stack) == 1 and reach > 0:  # (plain text within reach: at once, as in C)
            self.reach0 = min(reach, self.trie.max_len)
            self.bits |= self.trie.plain_masks[self.reach0]
        for node, base in starts:
            level, can_end = self.expansion(top)
            if can_end and self.rel and node < 0:
                self.below.append((-1, 0))
            if level:
                t = self.trie
                lo, hi = (0, t.n_nodes) if node < 0 else (node + 1, int(t.next[node]))
                self.walk_range(lo, hi, base, list(level))
        below = np.array(self.below, dtype=np.int32).reshape(-1, 2)
        return below, self.depth

    def walk_range(self, lo: int, hi: int, base: int, level0: list) -> None:
        t, tb = self.trie, self.tb
        byte, nxt, depth, tok, n_end, text_chars, root_chars = t.lists()
        rows, fork, reach, reach0 = tb.rows, tb.fork, tb.text_reach.tolist(), self.reach0
        loop_sets, below_sets = tb.loop_sets, t.below_sets()
        levels = [level0]  # levels[d]: the expanded stacks after `base + d` bytes of the current path
        i = lo
        while i < hi:
            if 0 <= root_chars[i] <= reach0:  # (taken whole with plain_masks)
                i = nxt[i]
                continue
            d = depth[i] - 1 - base
            b = byte[i]
            raw = []
            for top, parent in levels[d]:
                nt = rows[top][b]
                if nt >= 0 and (nt, parent) not in raw:
                    raw.append((nt, parent))
            if not raw:
                i = nxt[i]
                continue
            first = tok[i]
            self.allow(first, first + n_end[i])
            after = nxt[i]
            if after == i + 1:
                i = after
                continue
            if (text_chars[i] >= 0 and max(reach[s] for s, _ in raw) >= text_chars[i]) or any(
                    loop_sets[s] and not below_sets[i] & ~loop_sets[s] for s, _ in raw):
                self.allow(first + n_end[i], tok[after])
                i = after
                continue
            new, can_end = [], False
            for pair in raw:
                if fork[pair[0]]:
                    pairs, ends = self.expansion(pair)
                    can_end |= ends
                else:
                    pairs = (pair,)
                for p in pairs:
                    if p not in new:
                        new.append(p)
            del levels[d + 1:]
            levels.append(new)
            if can_end and self.rel:
                self.below.append((i, depth[i]))
            i = i + 1 if new else after
