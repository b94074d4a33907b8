"""Radix cache: unit cases and a hypothesis state machine checking every invariant after each step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentkv.engine.radix_cache import RadixCache
from agentkv.errors import CacheError, PinBudgetError

NUM_SLOTS = 200


class Slots:
    """A fake KV allocator that tracks ownership, so leaks and double frees show."""

    def __init__(self, n: int):
        self.free_set = set(range(1, n))

    def alloc(self, n: int) -> torch.Tensor:
        picked = sorted(self.free_set)[:n]
        assert len(picked) == n
        self.free_set -= set(picked)
        return torch.tensor(picked, dtype=torch.int64)

    def free(self, t: torch.Tensor) -> None:
        vals = set(t.tolist())
        assert not (vals & self.free_set), "slot freed twice"
        self.free_set |= vals


def insert(cache: RadixCache, slots: Slots, tokens: list[int]) -> torch.Tensor:
    kv = slots.alloc(len(tokens))
    n = cache.insert(tokens, kv)
    slots.free(kv[:n])  # the tree already had these
    return kv


def test_match_split_and_reuse():
    slots = Slots(NUM_SLOTS)
    cache = RadixCache(slots.free, pin_budget=50)
    kv = insert(cache, slots, [1, 2, 3, 4, 5])
    got, node = cache.match_prefix([1, 2, 3, 9])
    assert got.tolist() == kv[:3].tolist()
    assert node.key == [1, 2, 3]  # split at the partial match
    assert sorted(len(n.key) for n in cache.nodes()) == [2, 3]
    more = slots.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], more) == 5
    slots.free(more[:5])
    assert cache.match_prefix([1, 2, 3, 4, 5, 6])[0].tolist() == kv.tolist() + [int(more[5])]
    assert cache.total_size == 6 == cache.evictable_size


def test_lock_protects_ancestors_and_lru_order():
    slots = Slots(NUM_SLOTS)
    cache = RadixCache(slots.free, pin_budget=50)
    insert(cache, slots, [1, 2, 3])
    insert(cache, slots, [1, 2, 4, 4])
    insert(cache, slots, [7, 7])
    _, node = cache.match_prefix([1, 2, 4, 4])
    cache.lock(node)
    assert cache.protected_size == 4  # [1,2] and [4,4]
    assert cache.evictable_size == 3
    cache.match_prefix([7, 7])  # touch: [1,2,3]'s leaf [3] is now least recently used
    assert cache.evict(1) == 1
    assert cache.match_prefix([1, 2, 3])[0].numel() == 2
    assert cache.match_prefix([7, 7])[0].numel() == 2
    assert cache.evict(100) == 2  # only [7,7] is left to evict; the locked path stays
    assert cache.match_prefix([1, 2, 4, 4])[0].numel() == 4
    cache.unlock(node)
    assert cache.evict(100) == 4 and cache.total_size == 0


def test_a_hit_refreshes_lru_order():
    """A prefix served from the cache is recent again: inserted first but hit last, it outlives one
    inserted after it (eviction order would otherwise be insertion order)."""
    slots = Slots(NUM_SLOTS)
    cache = RadixCache(slots.free, pin_budget=50, evict_granule=1)
    insert(cache, slots, [1, 1, 1])
    insert(cache, slots, [2, 2, 2])
    insert(cache, slots, [3, 3, 3, 3])
    assert cache.match_prefix([1, 1, 1, 9])[0].numel() == 3  # a hit on the oldest
    assert cache.evict(3) == 3
    assert cache.match_prefix([2, 2, 2])[0].numel() == 0  # the least recently used went first
    assert cache.match_prefix([1, 1, 1])[0].numel() == 3 and cache.match_prefix([3, 3, 3, 3])[0].numel() == 4
    # [1, 1, 1] was hit before [3, 3, 3, 3] just now: it goes next
    assert cache.evict(3) == 3 and cache.match_prefix([3, 3, 3, 3])[0].numel() == 4
    assert cache.match_prefix([1, 1, 1])[0].numel() == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=300), st.lists(st.integers(0, 2), max_size=300), st.booleans())
def test_common_len_is_the_shared_prefix(a, b, shared):
    from agentkv.engine.radix_cache import _common_len

    if shared:  # long shared prefixes, parting anywhere
        b = a[: len(b)] + b[len(a):] if len(b) > 3 else a + b
    naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert _common_len(a, b) == naive == _common_len(tuple(a), b)


def tree_of(sequences: list[list[int]]) -> RadixCache:
    """A tree that inserted `sequences` in order."""
    slots = Slots(NUM_SLOTS)
    cache = RadixCache(slots.free, pin_budget=50)
    for tokens in sequences:
        insert(cache, slots, tokens)
    return cache


def state(node) -> tuple:
    """Everything a read-only lookup must leave as it was: keys, LRU times, the shape."""
    return (tuple(node.key), node.last_access, sorted((k, state(c)) for k, c in node.children.items()))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=8), min_size=1, max_size=6),
       st.lists(st.integers(1, 3), max_size=10), st.integers(0, 10))
def test_cached_length_measures_without_changing_anything(cached, query, limit):
    """cached_length is the length match_prefix finds, and leaves the tree as it was: no split, no
    LRU use (what a waiting request's ordering may do every step)."""
    cache = tree_of(cached)
    before = state(cache.root)
    n = cache.cached_length(query, limit)
    assert state(cache.root) == before
    assert n == cache.match_prefix(query[:limit], touch=False)[0].numel()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=10), min_size=1, max_size=6),
       st.lists(st.integers(1, 3), max_size=8), st.integers(0, 6))
def test_continuation_is_the_latest_path_beyond_the_tokens(written, query, k):
    """continuation against the sequences inserted: nothing unless all of `query` is cached; else up to
    k tokens that some inserted sequence has after `query`, starting with what the latest one that
    goes on past `query` has there; and the tree is left as it was (no split, no LRU use)."""
    cache = tree_of(written)
    before = state(cache.root)
    got = cache.continuation(query, k)
    assert state(cache.root) == before
    longer = [w for w in written if len(w) > len(query) and w[: len(query)] == query]
    if not longer or k == 0:
        assert got == []
        return
    assert any(w[: len(query) + len(got)] == query + got for w in longer)
    latest = longer[-1][len(query) : len(query) + k]
    assert got[: len(latest)] == latest
    assert len(got) == min(k, max(len(w) - len(query) for w in longer if w[: len(query) + len(got)] == query + got))


def test_pin_budget_and_unpin():
    slots = Slots(NUM_SLOTS)
    cache = RadixCache(slots.free, pin_budget=6)
    insert(cache, slots, [1, 2, 3, 4])
    insert(cache, slots, [1, 2, 9, 9, 9])
    h = cache.pin([1, 2, 3, 4])
    assert cache.pinned_size == 4 and cache.evictable_size == 3
    with pytest.raises(PinBudgetError, match="budget of 6"):
        cache.pin([1, 2, 9, 9, 9])  # needs 3 more: 7 > 6
    with pytest.raises(CacheError, match="prefill them"):
        cache.pin([5, 5])
    assert cache.evict(100) == 3
    assert cache.match_prefix([1, 2, 3, 4])[0].numel() == 4  # pinned: survives eviction
    # a pin is not part of the key: the pinned prefix matches and extends like any other
    assert len(insert(cache, slots, [1, 2, 3, 4, 5])) == 5
    assert cache.match_prefix([1, 2, 3, 4, 5])[1].pin_ref == 0 and cache.pinned_size == 4
    cache.unpin(h)
    with pytest.raises(CacheError, match="not active"):
        cache.unpin(h)
    assert cache.pinned_size == 0 and cache.evict(100) == 5


def test_eviction_cuts_the_last_leaf_to_its_tail():
    slots = Slots(NUM_SLOTS)
    cache = RadixCache(slots.free, pin_budget=50, evict_granule=1)
    system = list(range(10, 30))  # a long shared prefix, then two conversations
    insert(cache, slots, system + [1, 1, 1])
    insert(cache, slots, system + [2, 2, 2])
    cache.match_prefix(system + [2, 2, 2])  # the [1,1,1] conversation is least recently used
    assert cache.evict(2) == 2  # only the tail: [1] stays cached
    assert cache.match_prefix(system + [1, 1, 1])[0].numel() == 21
    assert cache.evict(5) == 5  # [1] and [2,2,2] (now older), then one token of the prompt's end
    assert cache.match_prefix(system)[0].numel() == 19 and cache.total_size == 19
    cache.evict_granule = 8  # a cut gives up at least this many tokens
    assert cache.evict(1) == 8 and cache.match_prefix(system)[0].numel() == 11


class CacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.slots = Slots(NUM_SLOTS)
        self.cache = RadixCache(self.slots.free, pin_budget=12, evict_granule=3)
        self.locks: list[tuple[tuple[int, ...], object]] = []
        self.pins: list[tuple[tuple[int, ...], object]] = []

    seqs = st.lists(st.integers(0, 2), min_size=1, max_size=8)

    @rule(tokens=seqs)
    def insert(self, tokens):
        if len(self.slots.free_set) < len(tokens):
            return
        before = self._mapping()
        kv = insert(self.cache, self.slots, tokens)
        after = self._mapping()
        for k in range(1, len(tokens) + 1):
            prefix = tuple(tokens[:k])
            # cached positions keep their slot; new ones take the inserted slot
            assert after[prefix] == before.get(prefix, int(kv[k - 1]))

    @rule(tokens=seqs)
    def match(self, tokens):
        mapping = self._mapping()
        got, node = self.cache.match_prefix(tokens)
        expected = []
        for k in range(1, len(tokens) + 1):
            if tuple(tokens[:k]) not in mapping:
                break
            expected.append(mapping[tuple(tokens[:k])])
        assert got.tolist() == expected
        assert self._path(node) == tuple(tokens[: len(expected)])

    @rule(tokens=seqs)
    def lock(self, tokens):
        got, node = self.cache.match_prefix(tokens)
        if got.numel():
            self.cache.lock(node)
            self.locks.append((self._path(node), node))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        _, node = self.locks.pop(i % len(self.locks))
        self.cache.unlock(node)

    @rule(tokens=seqs)
    def pin(self, tokens):
        got, node = self.cache.match_prefix(tokens)
        prefix = tuple(tokens[: got.numel()])
        if not prefix:
            return
        pinned = self._pinned_prefixes()
        extra = sum(1 for k in range(1, len(prefix) + 1) if prefix[:k] not in pinned)
        if len(pinned) + extra > self.cache.pin_budget:
            with pytest.raises(PinBudgetError):
                self.cache.pin(list(prefix))
        else:
            self.pins.append((prefix, self.cache.pin(list(prefix))))

    @precondition(lambda self: self.pins)
    @rule(i=st.integers(0, 100))
    def unpin(self, i):
        _, handle = self.pins.pop(i % len(self.pins))
        self.cache.unpin(handle)

    @rule(n=st.integers(0, 20))
    def evict(self, n):
        protected = {p for p in self._mapping() if self._is_protected(p)}
        evictable_before = self.cache.evictable_size
        before = self._mapping()
        freed = self.cache.evict(n)
        assert min(n, evictable_before) <= freed <= min(evictable_before, n + self.cache.evict_granule - 1 if n else 0)
        after = self._mapping()
        assert protected <= set(after)  # nothing locked or pinned was evicted
        assert len(before) - len(after) == freed and all(after[p] == before[p] for p in after)  # (same slots)

    # ---- reference views ---------------------------------------------------------------------

    def _path(self, node) -> tuple[int, ...]:
        out = []
        while node is not self.cache.root:
            out[:0] = node.key
            node = node.parent
        return tuple(out)

    def _mapping(self) -> dict[tuple[int, ...], int]:
        out = {}
        for node in self.cache.nodes():
            path = self._path(node)
            start = len(path) - len(node.key)
            for j, slot in enumerate(node.value.tolist()):
                out[path[: start + j + 1]] = slot
        return out

    def _pinned_prefixes(self) -> set[tuple[int, ...]]:
        return {p[:k] for p, _ in self.pins for k in range(1, len(p) + 1)}

    def _is_protected(self, prefix) -> bool:
        return any(p[: len(prefix)] == prefix for p, _ in self.locks + self.pins)

    @invariant()
    def accounting_is_exact(self):
        nodes = self.cache.nodes()
        total = sum(len(n.key) for n in nodes)
        assert self.cache.total_size == total
        assert self.cache.evictable_size == sum(len(n.key) for n in nodes if not n.protected)
        assert self.cache.protected_size == sum(len(n.key) for n in nodes if n.protected)
        assert self.cache.pinned_size == sum(len(n.key) for n in nodes if n.pin_ref > 0)
        assert self.cache.pinned_size == len(self._pinned_prefixes()) <= self.cache.pin_budget

    @invariant()
    def refs_match_reference(self):
        for n in self.cache.nodes():
            path = self._path(n)
            assert n.lock_ref == sum(1 for p, _ in self.locks if p[: len(path)] == path and len(p) >= len(path))
            assert n.pin_ref == sum(1 for p, _ in self.pins if p[: len(path)] == path and len(p) >= len(path))
            assert n.key and n.parent.children[n.key[0]] is n and len(n.key) == len(n.value)

    @invariant()
    def evictable_leaves_are_kept_exactly(self):
        assert self.cache._evictable == {n for n in self.cache.nodes() if not n.children and not n.protected}

    @invariant()
    def no_slot_lost_or_shared(self):
        in_tree = [s for n in self.cache.nodes() for s in n.value.tolist()]
        assert len(in_tree) == len(set(in_tree))
        assert set(in_tree).isdisjoint(self.slots.free_set)
        assert len(in_tree) + len(self.slots.free_set) == NUM_SLOTS - 1


CacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRadixCacheStateMachine = CacheMachine.TestCase
