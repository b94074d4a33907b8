"""Who holds which KV slot: the scheduler's bookkeeping of memory, apart from its choices.

A running request holds a row of the slot table (ReqToTokenPool): its cached prefix, shared with the
radix tree, whose last node it keeps locked, then the slots of the tokens it computed itself. When a
prefill ends its computed tokens go into the tree (`cache_prefix`), so requests that arrive later share
them; when it finishes or is retracted all of it goes to the tree, or back to the pool without one
(`release`). Slots of tokens a pass computed and the request does not keep (a rejected draft, a draft
past the request's end) go back to the pool at once (`give_back`). With a disk tier (engine/disk/), KV
leaving the pool is written there, and a prefix it holds is read back into new slots and the tree
before the request is matched (`restore`).
"""

from __future__ import annotations

import torch

from agentkv.engine.disk import DiskTier
from agentkv.engine.inflight import InFlight
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.null_cache import PrefixCache
from agentkv.engine.outputs import CacheMiss
from agentkv.engine.request import Request

MISS_TOKENS = 16  # of what the cache held and what the prompt has, where they part


class KVOwner:
    def __init__(self, pool: KVPool, req_pool: ReqToTokenPool, tree: PrefixCache, flight: InFlight,
                 tier: DiskTier | None = None):
        self.pool, self.req_pool, self.tree, self.flight, self.tier = pool, req_pool, tree, flight, tier
        if tier is not None:
            tree.spill = self._spill

    def _spill(self, node, whole: bool) -> None:
        tokens, slots = self.tree.path(node)
        self.tier.spill(tokens, 0 if whole else len(tokens) - len(node.key), lambda a, b: self.pool.gather(slots[a:b]),
                        self.tree.namespace(node))

    def write_through(self, node) -> None:
        """A cached prefix used again (a request admitted on it): its blocks not on disk yet are written
        there, the pool keeping them (HiCache's write_through_selective: a prefix used twice is worth
        keeping), so that a process killed without a flush loses little."""
        if self.tier is not None and node is not None and node is not self.tree.root and node.key:
            self._spill(node, True)

    def save(self, deadline: float) -> int:
        """Write every prefix the tree holds to the disk tier, the pool keeping it: the most recently used
        leaf's whole path first, until `deadline` (a process about to end: Engine.close). Returns how
        many paths were written (or were on disk already)."""
        if self.tier is None:
            return 0
        leaves = sorted((n for n in self.tree.nodes() if not n.children), key=lambda n: n.last_access, reverse=True)
        saved = 0
        for leaf in leaves:
            if not self.tier.wait_room(deadline):
                break
            self._spill(leaf, True)
            saved += 1
        return saved

    def warm(self, prefixes: list[list[int]], room: int, prefetched: dict | None = None) -> int:
        """Read `prefixes` (whole token sequences the tier holds, hottest first) back into the pool and the
        tree, into at most `room` free slots (nothing is evicted for them); how many tokens."""
        if self.tier is None:
            return 0
        warmed = 0
        for ids in prefixes:
            cached = self.tree.cached_length(ids)
            space = min(room - warmed, self.pool.num_free)
            if cached >= len(ids) or space <= 0:
                continue
            prefix_slots, node = self.tree.match_prefix(ids[:cached], touch=False)
            kv = self.tier.take(ids, cached, len(ids), space, prefetched)
            if kv is None:
                continue
            n = kv.shape[0]
            slots = self.pool.alloc(n)
            self.pool.scatter(slots, kv)
            existing = self.tree.insert(ids[: cached + n], torch.cat([prefix_slots, slots]))
            self.pool.free(slots[: existing - cached])
            warmed += n
        self.tier.restored_tokens += warmed
        return warmed

    def prefetch(self, r: Request) -> None:
        """Start reading what the disk tier holds past r's cached prefix while r waits."""
        if self.tier is not None:
            limit, ns = self.matchable_len(r), r.cache_ns
            r.disk_prefetch = self.tier.prefetch(r.all_ids, self.tree.cached_length(r.all_ids, limit, ns), limit, ns)

    def restore(self, r: Request) -> int:
        """Read the disk tier's continuation of r's cached prefix into new slots and the tree (where the
        pool has room for it); how many tokens."""
        if self.tier is None:
            return 0
        limit, ids, prefetched, r.disk_prefetch = self.matchable_len(r), r.all_ids, r.disk_prefetch, None
        ns = r.cache_ns
        cached = self.tree.cached_length(ids, limit, ns)
        if cached >= limit:
            return 0
        prefix_slots, node = self.tree.match_prefix(ids[:cached], touch=False, ns=ns)
        self.tree.lock(node)  # its own prefix must not be evicted to make room for the rest
        try:
            kv = self.tier.take(ids, cached, limit, self.pool.num_free + self.tree.evictable_size, prefetched, ns)
            if kv is None:
                return 0
            n = kv.shape[0]
            slots = self.alloc(n)
            self.pool.scatter(slots, kv)
            existing = self.tree.insert(ids[: cached + n], torch.cat([prefix_slots, slots]), ns)
            self.pool.free(slots[: existing - cached])  # (none: the prefix is locked and nothing else inserts)
        finally:
            self.tree.unlock(node)
        self.tier.restored_tokens += n
        return n

    @staticmethod
    def matchable_len(r: Request) -> int:
        """How many tokens of `r` a cached prefix may cover: all but the last, whose logits give the
        next token (a scoring request computes the logits of every token before the scored ones)."""
        return r.seq_len - 1 if r.score_from is None else min(r.seq_len - 1, r.score_from - 1)

    def match(self, r: Request, touch: bool = True):
        """The slots of r's longest cached prefix and the tree node where it ends (None: nothing cached)."""
        return self.tree.match_prefix(r.all_ids[: self.matchable_len(r)], touch, r.cache_ns)

    def miss(self, r: Request, cached: int) -> CacheMiss | None:
        """Where r's prompt parts from a longer path the cache holds (None: it matched all it could,
        or the cache holds nothing past its cached part)."""
        if cached >= min(self.matchable_len(r), len(r.prompt_ids)):
            return None
        held = self.tree.continuation(r.all_ids[:cached], MISS_TOKENS, r.cache_ns)
        return CacheMiss(cached, held, list(r.all_ids[cached : cached + MISS_TOKENS])) if held else None

    def start(self, r: Request, prefix_slots: torch.Tensor, node) -> None:
        """Give admitted r a row that starts with its cached prefix (`node`: locked by the caller)."""
        r.row = self.req_pool.alloc()
        assert r.row is not None
        r.last_node = node
        r.prefix_len = r.kv_len = len(prefix_slots)
        self.req_pool.write(r.row, 0, prefix_slots)

    def place(self, r: Request, n: int) -> torch.Tensor:
        """Slots for r's next n tokens, written into its row."""
        slots = self.alloc(n)
        self.req_pool.write(r.row, r.computed, slots)
        return slots

    def alloc(self, n: int) -> torch.Tensor:
        slots = self.pool.alloc(n)
        if slots is None:
            self.tree.evict(n - self.pool.num_free)
            slots = self.pool.alloc(n)
        assert slots is not None, "admission let in more than memory holds"
        return slots

    def give_back(self, r: Request, start: int, end: int) -> None:
        """The slots of positions [start, end) of r's row go back to the pool."""
        self.pool.free(self.req_pool.host[r.row, start:end].clone())

    def cache_prefix(self, r: Request) -> None:
        """Insert r's computed tokens into the tree and switch r onto the tree's slots (a cache that
        keeps nothing leaves r on its own)."""
        if not self.tree.keeps_kv:
            return
        ids, ns = r.all_ids[: r.kv_len], r.cache_ns
        kv = self.req_pool.host[r.row, : r.kv_len].clone()
        existing = self.tree.insert(ids, kv, ns)
        self.pool.free(kv[r.prefix_len : existing])  # ours duplicated what another request inserted meanwhile
        slots, node = self.tree.match_prefix(ids, ns=ns)
        self.req_pool.write(r.row, 0, slots)
        self.tree.lock(node)
        self.tree.unlock(r.last_node)
        r.last_node, r.prefix_len = node, r.kv_len

    def release(self, r: Request) -> None:
        """Give r's KV to the tree (or the pool) and free its row; r keeps its tokens."""
        if r.row is None:
            return
        table = self.req_pool.host[r.row]
        start, pending = self.flight.pending_slots(r)  # slots of passes not processed (in flight, or failed)
        self.pool.free(table[start : start + pending].clone())
        kv = table[: r.kv_len].clone()
        if self.tree.keeps_kv:
            existing = self.tree.insert(r.all_ids[: r.kv_len], kv, r.cache_ns)
            self.pool.free(kv[r.prefix_len : existing])
            self.tree.unlock(r.last_node)
        else:
            self.pool.free(kv)
        if not self.flight.hold_row(r.row):
            self.req_pool.free(r.row)
        r.row, r.last_node, r.kv_len, r.prefix_len = None, None, 0, 0
