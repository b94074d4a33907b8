"""Token-granular radix tree over the KV pool: longest-prefix reuse, locks, pins and LRU eviction.

Each node holds a run of token ids (its key) and the KV slots of those tokens (its value). Three
reference counts decide what may be evicted:

- `lock_ref`: running requests using the node. Locking a node locks all its ancestors.
- `pin_ref`: pins (an agent's system prompt and tools). Like locks, they cover the ancestors; unlike
  locks they are bounded by a budget (a share of the pool), so pins can never starve the engine.
- a node with both counts at zero is evictable once it is a leaf; eviction frees leaves in LRU order,
  and of the last leaf it needs only the tail (see `evict`).

Accounting is exact at every step: `evictable_size + protected_size == total_size`, where protected
means locked or pinned; `pinned_size` counts pinned tokens (they are also protected). Pins and locks
are reference counts on nodes, never part of the key: a pinned prefix is matched like any other.

A namespace (`ns`: a LoRA adapter's content hash) is a subtree of its own under the root: a node with no
tokens, never evicted, whose paths no other namespace reaches. KV an adapter computed is found only by
requests of that adapter; the base model's (ns None) hangs from the root itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from agentkv.engine.pin_leases import PinLeases
from agentkv.errors import CacheError, PinBudgetError


class TreeNode:
    __slots__ = ("children", "id", "key", "last_access", "lock_ref", "ns", "parent", "pin_ref", "value")
    _ids = itertools.count()

    def __init__(self, key: list[int], value: torch.Tensor, parent: TreeNode | None):
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value  # [len(key)] int64 slots
        self.lock_ref = 0
        self.pin_ref = 0
        self.last_access = 0
        self.id = next(TreeNode._ids)
        self.ns: str | None = None  # set on a namespace's own node (see the module's doc)

    @property
    def protected(self) -> bool:
        return self.lock_ref > 0 or self.pin_ref > 0

    def __lt__(self, other: TreeNode) -> bool:  # heap order: least recently used first
        return (self.last_access, self.id) < (other.last_access, other.id)


@dataclass(frozen=True)
class PinHandle:
    """Returned by `pin`; pass it to `unpin`. `num_tokens` is the pinned prefix length."""

    id: int
    num_tokens: int


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items `a` and `b` share. Compared a block at a time as slices (at C speed:
    a node of an 8k-token prompt is matched on every insert and admission), then item by item in
    the block where they part."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + 256, n)
        if list(a[i:j]) != list(b[i:j]):
            break
        i = j
    while i < n and a[i] == b[i]:
        i += 1
    return i


EVICT_GRANULE = 64  # the least a cut leaf gives up: fewer cuts and evictions while memory stays short


class RadixCache:
    keeps_kv = True  # a finished request's KV is inserted here (null_cache.py: an engine without the cache)

    def __init__(self, free_slots: Callable[[torch.Tensor], None], pin_budget: int,
                 evict_granule: int = EVICT_GRANULE):
        self._free_slots = free_slots
        self.pin_budget = pin_budget
        self.evict_granule = evict_granule
        self._clock = itertools.count(1)
        self._pins: dict[int, TreeNode] = {}
        self._pin_ids = itertools.count(1)
        # called with a node whose KV is about to leave the pool (an evicted leaf: its own tokens) or is
        # pinned (the whole path), while its slots still hold it: the disk tier's write (kv_owner.py)
        self.spill: Callable[[TreeNode, bool], None] | None = None
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode([], torch.empty(0, dtype=torch.int64), None)
        self.root.lock_ref = 1  # the root is never evicted
        self.total_size = 0
        self.evictable_size = 0
        self.protected_size = 0
        self.pinned_size = 0
        self.num_evicted_tokens = 0
        self._pins.clear()
        self.leases = PinLeases()  # pins with a time to live (pin_leases.py)
        self._evictable: set[TreeNode] = set()  # the unprotected leaves, kept up to date (what evict takes from)
        self._spaces: dict[str, TreeNode] = {}  # namespace -> its node under the root

    def _start(self, ns: str | None, create: bool = True) -> TreeNode | None:
        """Where the paths of namespace `ns` begin (None where it holds nothing and not `create`)."""
        if ns is None:
            return self.root
        node = self._spaces.get(ns)
        if node is None and create:
            node = TreeNode([], torch.empty(0, dtype=torch.int64), self.root)
            node.ns, node.lock_ref = ns, 1  # never evicted, never a leaf to evict
            self.root.children[ns] = self._spaces[ns] = node
        return node

    def namespace(self, node: TreeNode) -> str | None:
        """The namespace `node` lies in."""
        while node.parent is not None and node.parent is not self.root:
            node = node.parent
        return node.ns

    # ---- lookup and insertion -------------------------------------------------------------

    def match_prefix(self, tokens: Sequence[int], touch: bool = True,
                     ns: str | None = None) -> tuple[torch.Tensor, TreeNode]:
        """Slots of the longest cached prefix of `tokens`, and the node where it ends.

        A match ending inside a node splits it, so the returned node covers the prefix exactly
        (and can be locked or pinned without covering more). `touch`: count it as a use (LRU); a
        request that only waits does not keep its prefix warm (`touch` it once admitted).
        """
        node, path, _ = self._walk(tokens, touch, ns)
        slots = torch.cat([n.value for n in path]) if path else torch.empty(0, dtype=torch.int64)
        return slots, node

    def cached_length(self, tokens: Sequence[int], limit: int | None = None, ns: str | None = None) -> int:
        """How many leading tokens of `tokens[:limit]` are cached, changing nothing (no split, no LRU
        use, no copy of `tokens`)."""
        node, i = self._start(ns, create=False), 0
        if node is None:
            return 0
        end = len(tokens) if limit is None else min(limit, len(tokens))
        while i < end and tokens[i] in node.children:
            child = node.children[tokens[i]]
            n = _common_len(child.key, tokens[i : min(i + len(child.key), end)])
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def continuation(self, tokens: Sequence[int], k: int, ns: str | None = None) -> list[int]:
        """Up to k tokens cached right after all of `tokens` (what an earlier request wrote after the
        same tokens; where the path branches, the most recently used branch), or [] where `tokens`
        are not all cached. Changes nothing."""
        node, i, end = self._start(ns, create=False), 0, len(tokens)
        if node is None:
            return []
        while i < end:
            child = node.children.get(tokens[i])
            if child is None:
                return []
            n = _common_len(child.key, tokens[i : i + len(child.key)])
            i += n
            if n < len(child.key):
                if i < end:
                    return []  # parted inside this node
                return child.key[n : n + k] + self._beyond(child, k - (len(child.key) - n))
            node = child
        return self._beyond(node, k)

    @staticmethod
    def _beyond(node: TreeNode, k: int) -> list[int]:
        """Up to k tokens down the most recently used children from `node`."""
        out: list[int] = []
        while len(out) < k:
            children = [c for c in node.children.values() if c.ns is None]  # (never into a namespace)
            if not children:
                break
            node = max(children, key=lambda c: c.last_access)
            out += node.key[: k - len(out)]
        return out

    def touch(self, node: TreeNode) -> None:
        """Count the path from the root to `node` as used now (LRU)."""
        now = next(self._clock)
        if self.leases:
            self.leases.renew(node)
        while node is not None:
            node.last_access = now
            node = node.parent

    def insert(self, tokens: Sequence[int], slots: torch.Tensor, ns: str | None = None) -> int:
        """Add `tokens` with their `slots`; returns how many leading tokens were already cached.

        The caller still owns slots[:returned] (duplicates of cached KV) and must free those it no
        longer uses; the rest now belong to the tree.
        """
        assert len(tokens) == len(slots)
        node, _, i = self._walk(tokens, ns=ns)
        if i < len(tokens):
            new = TreeNode(list(tokens[i:]), slots[i:].clone(), node)
            new.last_access = node.last_access
            node.children[new.key[0]] = new
            self.total_size += len(new.key)
            self.evictable_size += len(new.key)
            self._update_leaf(new)
            self._update_leaf(node)
        return i

    def _update_leaf(self, node: TreeNode) -> None:
        """Keep `_evictable` in step with `node` after its children or references changed (an
        eviction then reads the leaves directly, not by a scan of the whole tree)."""
        if node is not self.root and not node.children and not node.protected:
            self._evictable.add(node)
        else:
            self._evictable.discard(node)

    def _walk(self, tokens: Sequence[int], touch: bool = True,
              ns: str | None = None) -> tuple[TreeNode, list[TreeNode], int]:
        """Follow `tokens` down namespace `ns`, splitting where the match ends inside a node and touching
        every node passed (LRU) unless not `touch`. Returns the last node, the path below the
        namespace's start, and the matched length."""
        node, path, i = self._start(ns), [], 0
        now = next(self._clock) if touch else None
        if touch:
            node.last_access = now
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            n = _common_len(child.key, tokens[i : i + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            if touch:
                child.last_access = now
            path.append(child)
            node, i = child, i + n
        return node, path, i

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; returns the new upper node (same refs, so no accounting change)."""
        upper = TreeNode(child.key[:n], child.value[:n], child.parent)
        upper.lock_ref, upper.pin_ref, upper.last_access = child.lock_ref, child.pin_ref, child.last_access
        child.parent.children[upper.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper

    # ---- locks (running requests) ---------------------------------------------------------

    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if not node.protected:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "unlock without lock"
            node.lock_ref -= 1
            if not node.protected:
                self.protected_size -= len(node.key)
                self.evictable_size += len(node.key)
            self._update_leaf(node)
            node = node.parent

    # ---- pins (resident prefixes, bounded by a budget) ------------------------------------

    def pin(self, tokens: Sequence[int], ttl_s: float | None = None, left_s: float | None = None,
            ns: str | None = None) -> PinHandle:
        """Pin the cached prefix `tokens` of namespace `ns` (it must be fully cached) and its ancestors;
        with `ttl_s`, until that long passes without a request through it (`expire_pins`; the first
        time after `left_s`, where given: a pin brought back after a restart)."""
        slots, node = self.match_prefix(tokens, ns=ns)
        if len(slots) < len(tokens):
            raise CacheError(f"only {len(slots)} of {len(tokens)} tokens are cached; prefill them before pinning")
        new_tokens, n = 0, node
        while n is not self.root:
            if n.pin_ref == 0:
                new_tokens += len(n.key)
            n = n.parent
        if self.pinned_size + new_tokens > self.pin_budget:
            raise PinBudgetError(
                f"pinning {len(tokens)} tokens needs {new_tokens} more pinned tokens, but {self.pinned_size} of the "
                f"budget of {self.pin_budget} are pinned; unpin something or raise pin_budget_fraction"
            )
        n = node
        while n is not self.root:
            if not n.protected:
                self.evictable_size -= len(n.key)
                self.protected_size += len(n.key)
            if n.pin_ref == 0:
                self.pinned_size += len(n.key)
            n.pin_ref += 1
            self._update_leaf(n)
            n = n.parent
        handle = PinHandle(next(self._pin_ids), len(tokens))
        self._pins[handle.id] = node
        if self.spill is not None:
            self.spill(node, True)  # written through: a restart finds it on disk
        if ttl_s is not None:
            self.leases.add(handle.id, node, ttl_s, left_s)
        return handle

    def expire_pins(self) -> int:
        """Release the pins whose time to live ran out; how many."""
        due = self.leases.due()
        for pin_id in due:
            self._release(pin_id)
        return len(due)

    def unpin(self, handle: PinHandle) -> None:
        if handle.id in self.leases.gone:
            return  # its lease ran out: already released
        self.leases.drop(handle.id)
        self._release(handle.id)

    def _release(self, pin_id: int) -> None:
        node = self._pins.pop(pin_id, None)
        if node is None:
            raise CacheError(f"pin {pin_id} is not active (already unpinned, or from another engine)")
        while node is not self.root:
            node.pin_ref -= 1
            if node.pin_ref == 0:
                self.pinned_size -= len(node.key)
            if not node.protected:
                self.protected_size -= len(node.key)
                self.evictable_size += len(node.key)
            self._update_leaf(node)
            node = node.parent

    def pin_records(self) -> list[tuple[list[int], float | None, float | None, str | None]]:
        """Each pin as (its tokens, its time to live, the seconds left of it (None, None without one), its
        namespace): what the disk tier keeps so that a restart pins them again."""
        out = []
        for pin_id, node in self._pins.items():
            lease = self.leases.lease(pin_id)
            out.append((self.path(node)[0], *(lease if lease is not None else (None, None)), self.namespace(node)))
        return out

    @property
    def pins(self) -> list[PinHandle]:
        return [PinHandle(i, self._depth(n)) for i, n in self._pins.items()]

    def path(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        """The tokens from the root to the end of `node`, and their slots."""
        nodes = []
        while node is not self.root:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        tokens = [t for n in nodes for t in n.key]
        return tokens, (torch.cat([n.value for n in nodes]) if nodes else torch.empty(0, dtype=torch.int64))

    def _depth(self, node: TreeNode) -> int:
        d = 0
        while node is not self.root:
            d, node = d + len(node.key), node.parent
        return d

    # ---- eviction ---------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unprotected leaves, least recently used first.

        The last leaf taken gives up only its tail, `max(still needed, evict_granule)` tokens, and
        keeps its head cached: the head of a sequence is what later requests share (a system prompt
        of 1,600 tokens freed whole to make room for 50 was a 1,600-token recompute for the next
        request of that agent). Returns the number freed (less when not enough is evictable).
        """
        if num_tokens <= 0:
            return 0
        heap = list(self._evictable)
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            tail = max(num_tokens - freed, self.evict_granule)
            if len(leaf.key) > tail:
                self._split(leaf, len(leaf.key) - tail)  # `leaf` is now the tail, under its kept head
            if self.spill is not None:
                self.spill(leaf, False)
            self._free_slots(leaf.value)
            freed += len(leaf.key)
            self.total_size -= len(leaf.key)
            self.evictable_size -= len(leaf.key)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            self._evictable.discard(leaf)
            if parent is not self.root and not parent.children and not parent.protected:
                self._evictable.add(parent)
                heapq.heappush(heap, parent)
        self.num_evicted_tokens += freed
        return freed

    def nodes(self) -> list[TreeNode]:
        """Every node that holds tokens, in every namespace (for tests, stats and saving)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.ns is None:
                out.append(n)
            stack.extend(n.children.values())
        return out
