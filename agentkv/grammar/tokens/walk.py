"""The token walk: which tokens a parser stack can read next, walked over the tokenizer's byte trie.

The walk (csrc/token_walk.c has the full account; this module is its Python twin, used where the
native code is off or cannot be built) goes depth first through the trie (tokens/trie.py) with, at
each depth, the set of parser stacks the path so far can have left. A byte no stack reads skips the
node's subtree; a shared prefix is stepped once; a token ending at a node where some stack read its
last byte is allowed. Stacks are (top state, frame) pairs over interned frames; where a top can call
or return, the stack is expanded (once per walk). Two shortcuts: from a state where any plain text of
k characters survives (k unbounded for a text loop: a string body, an open object's names; the room
left on a string with a maximum length), a subtree whose tokens read plain text of at most k
characters from there on is allowed whole; so is a subtree whose bytes are all of a class the state
carries far enough (a loop over a class, a counted repetition with room).

Most of a mask depends on the top state alone: the walk runs once per top state with the frames
below unknown (`top_state_tokens`, "relative"), which yields the tokens allowed whatever lies below
and the trie nodes where a return below the frame happens (with the bytes read there). A stack's
mask is those tokens plus the tokens below those nodes walked on from the real frames
(`continue_below`). Where the nesting limit could cut a token short, the whole real stack is walked
instead (`stack_walk`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from agentkv.grammar import native

_ASCII = (1 << 128) - 1  # the ASCII half of a 256-bit byte set


class PendingRule(Exception):  # noqa: N818  (not an error: a signal its grammar answers)
    """A walk or an expansion reached a call of a rule not linked yet (a composed grammar's part,
    grammar/composer.py: its start is negative): the grammar links it and asks again."""

    def __init__(self, rule: int):
        super().__init__(rule)
        self.rule = rule


def walk_failed(rc: int) -> Exception:
    """The exception for a native walk's failure code (csrc/token_walk.c)."""
    return PendingRule(-2 - rc) if rc <= -2 else MemoryError("the native token walk ran out of memory")


@dataclass(frozen=True)
class StateTokens:
    """What a top state allows whatever lies below it (see the module docstring)."""

    allowed: np.ndarray  # packed bitmask words (int32, bit i of word i // 32 is token i)
    below: np.ndarray    # [k, 2] int32: (trie node, bytes read): the longer tokens under that node
                         # return below the frame there (node -1: every token, before its first byte)
    depth: int           # the longest relative stack the walk considered (for the depth limit)


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


def walk_python(tables, stack: tuple, relative: bool, starts: list, words: np.ndarray) -> tuple[np.ndarray, int]:
    """The walk in Python (the native one's twin): `tables` a grammar's WalkTables."""
    return _PyWalk(tables, tables.info.trie, relative, words).run(stack, starts)


def _walk(grammar, stack: tuple, relative: bool, starts: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, int]:
    info = grammar.info
    lib = native.load()
    if lib is None:
        return walk_python(grammar.walk_tables, stack, relative, starts.tolist(), words)
    trie = info.trie
    stack_arr = np.array(stack, dtype=np.int32)
    starts = np.ascontiguousarray(starts, dtype=np.int32)
    below = np.empty((trie.n_nodes + 1, 2) if relative else (0, 2), dtype=np.int32)
    n_below, depth = ctypes.c_int64(0), ctypes.c_int32(0)
    rc = lib.agentkv_token_walk(ctypes.byref(grammar.walk_tables.struct), ctypes.byref(info.trie_struct),
                                stack_arr.ctypes.data, len(stack), int(relative), starts.ctypes.data, len(starts),
                                words.ctypes.data, below.ctypes.data, ctypes.byref(n_below), ctypes.byref(depth),
                                None)
    if rc != 0:
        raise walk_failed(rc)
    return below[:n_below.value].copy(), depth.value


class _PyWalk:
    """The walk in Python (csrc/token_walk.c's twin, step for step)."""

    def __init__(self, tables, trie, relative: bool, words: np.ndarray):
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
                    if tb.starts_list[rule] < 0:
                        raise PendingRule(rule)
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
        byte, nxt, depth, tok, n_end, text_chars, root_chars, depth_below, wide_below = t.lists()
        rows, fork, reach0 = tb.rows, tb.fork, self.reach0
        (reach, class_reach, class_wide), class_sets, below_sets = tb.reach_lists, tb.class_sets, t.below_sets()
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
                    class_reach[s] >= depth_below[i] and not below_sets[i] & ~class_sets[s] & _ASCII
                    and (not below_sets[i] & ~class_sets[s] or class_wide[s] and wide_below[i]) for s, _ in raw):
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
