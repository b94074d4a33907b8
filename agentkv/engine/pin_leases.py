"""Pins that end on their own: a pin given `ttl_s` is released when that long passes without a
request whose prompt runs through its prefix (each such request renews it). An agent that stops
calling, or a session nobody continues, gives its pinned KV back without being told to.

Kept by the radix cache (radix_cache.py), on the engine thread: `renew` runs where the cache counts
a path as used, `due` where the engine loop wakes (it sleeps no longer than `seconds_left`).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PinLeases:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._ttl: dict[int, float] = {}  # pin id -> its time to live
        self._deadline: dict[int, float] = {}  # pin id -> when it ends unless renewed
        self._by_node: dict[object, set[int]] = {}  # the node a pin ends at -> its leased pins
        self._node: dict[int, object] = {}
        self.gone: set[int] = set()  # pins whose lease ran out (unpinning one is a no-op)
        self.expired = 0  # how many ran out

    def __bool__(self) -> bool:
        return bool(self._ttl)

    def add(self, pin_id: int, node: object, ttl_s: float, left_s: float | None = None) -> None:
        """`left_s`: until the first end, where less than `ttl_s` (a pin brought back after a restart)."""
        first = ttl_s if left_s is None else min(left_s, ttl_s)
        self._ttl[pin_id], self._deadline[pin_id], self._node[pin_id] = ttl_s, self.clock() + first, node
        self._by_node.setdefault(node, set()).add(pin_id)

    def drop(self, pin_id: int) -> None:
        """The pin was released (by its owner, or by `due`): no lease any more."""
        if pin_id not in self._ttl:
            return
        node = self._node.pop(pin_id)
        del self._ttl[pin_id], self._deadline[pin_id]
        self._by_node[node].discard(pin_id)
        if not self._by_node[node]:
            del self._by_node[node]

    def renew(self, node) -> None:
        """A request used the path from the root to `node`: every leased pin ending on it starts over."""
        now = self.clock()
        while node is not None:
            for pin_id in self._by_node.get(node, ()):
                self._deadline[pin_id] = now + self._ttl[pin_id]
            node = node.parent

    def due(self) -> list[int]:
        """The pins whose lease has run out (the caller releases them; they are counted and dropped)."""
        now = self.clock()
        out = [p for p, d in self._deadline.items() if d <= now]
        for p in out:
            self.drop(p)
            self.gone.add(p)
            self.expired += 1
        return out

    def lease(self, pin_id: int) -> tuple[float, float] | None:
        """(its time to live, the seconds left of it), or None for a pin without one."""
        if pin_id not in self._ttl:
            return None
        return self._ttl[pin_id], max(0.0, self._deadline[pin_id] - self.clock())

    def seconds_left(self) -> float | None:
        """Until the next lease runs out (None: no lease)."""
        return max(0.0, min(self._deadline.values()) - self.clock()) if self._deadline else None
