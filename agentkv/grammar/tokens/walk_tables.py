"""A grammar's automaton as the token walk reads it (tokens/walk.py, csrc/token_walk.c): flat call
tables, fork and tail flags, each state's reach in plain text and the bytes that loop on it
(tokens/state_tables.py); on the native path, the grammar's C mask cache too (csrc/mask_cache.c),
freed with these tables.
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cached_property

import numpy as np

from agentkv.grammar import native
from agentkv.grammar.tokens.state_tables import state_tables
from agentkv.grammar.tokens.walk import walk_failed, walk_python

MAX_WALK_BYTES = 64 << 20  # per grammar: the native walks kept (~3,400 at a 151k vocabulary)
MAX_SHARED_WALK_BYTES = 64 << 20  # per state pool: the walks its grammars share (csrc/mask_cache.c's Store)


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
            self.text_reach, self.class_bytes, self.class_reach, self.class_wide = state_tables(self.trans, self.cap)
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
