"""The shortest text from each automaton state to its rule's end: what closes an output that must end
within a token budget (budget closing, docs/structured.md).

dist[s] is 0 where the rule may return at s, else the least of 1 + dist[t] over a byte edge s -> t and
len(r) + dist[ret] over a call (r, ret) from s, where len(r) = dist[start of r]. A call's cost rests
on two other states' distances, so states are settled in Knuth's generalization of Dijkstra's order
(the grammar problem: a sum is never less than its parts): a call is relaxed once both its callee's
start and its return state are settled. Settling is lazy: a query settles the states its state
reaches (through bytes, returns and callees) that no earlier query settled; an earlier answer never
changes, since a state's distance depends only on the states it reaches.

A call into a composed grammar's part that is not linked yet (its start is -1, grammar/composer.py)
is no way out: a state whose only way to its end is through such a part has no distance (None), and
the part is named in `pending`, for the grammar to link and ask again (`relinked`).
"""

from __future__ import annotations

import heapq

import numpy as np

from agentkv.grammar.automata.automaton import Automaton


def _rank(b: int) -> tuple[int, int]:
    """Among bytes that close equally fast, printable ASCII first: a required string filled to its
    minLength reads as `aaa`, not as control or continuation bytes."""
    if 0x61 <= b <= 0x7A:
        return (0, b)
    return (1 if 0x21 <= b <= 0x7E else 2 if b == 0x20 else 3, b)


_BYTE_ORDER = np.array(sorted(range(256), key=_rank), dtype=np.int64)


class Shortest:
    """Distances and shortest closing text per state of one automaton, settled as queries reach them.

    The automaton may be replaced by a longer one holding the same states first (a composed grammar
    linking a part: `use`); what was settled stays true there."""

    def __init__(self, automaton: Automaton):
        self.automaton = automaton
        self._dist: dict[int, int] = {}
        self._hop: dict[int, tuple | None] = {}  # state -> None (its rule may end here), ("b", t), ("c", rule, ret)
        self._unreachable: set[int] = set()  # settled with no way to its end (through unlinked parts only)
        self._texts: dict[int, bytes] = {}  # a rule start's shortest text, kept (calls repeat it)
        self.pending: set[int] = set()  # rules not linked yet that settled states could have called

    def use(self, automaton: Automaton) -> None:
        self.automaton = automaton

    def relinked(self) -> None:
        """Parts were linked since: states that had no way to their end are settled again when asked
        (those settled keep their distance: a way through a new part may be shorter, theirs still holds)."""
        self._unreachable.clear()
        self.pending.clear()

    def distance(self, s: int) -> int | None:
        """Bytes from `s` to the end of its rule at the fewest, or None where there is no way there."""
        if s not in self._dist and s not in self._unreachable:
            self._settle(s)
        return self._dist.get(s)

    def text(self, s: int) -> bytes:
        """The shortest text from `s` to its rule's end (`distance(s)` bytes); raises KeyError where
        there is none."""
        if self.distance(s) is None:
            raise KeyError(s)
        a, out = self.automaton, bytearray()
        while (hop := self._hop[s]) is not None:
            if hop[0] == "b":
                t = hop[1]
                out.append(int(_BYTE_ORDER[a.trans[s][_BYTE_ORDER] == t][0]))  # the first byte there, by rank
                s = t
            else:
                start = int(a.starts[hop[1]])
                body = self._texts.get(start)
                if body is None:
                    body = self._texts[start] = self.text(start)
                out += body
                s = hop[2]
        return bytes(out)

    def _settle(self, origin: int) -> None:
        a = self.automaton
        dist, done = self._dist, self._unreachable
        # the unsettled states `origin` reaches, with their edges
        region, todo = {origin}, [origin]
        succ: dict[int, np.ndarray] = {}
        while todo:
            s = todo.pop()
            row = a.trans[s]
            nxt = np.unique(row[row >= 0])
            succ[s] = nxt
            more = [int(t) for t in nxt]
            for r, ret in a.calls.get(s, ()):
                if a.starts[r] >= 0:
                    more += (int(a.starts[r]), ret)
                else:
                    self.pending.add(r)
            for t in more:
                if t not in region and t not in dist and t not in done:
                    region.add(t)
                    todo.append(t)
        heap: list = []  # (distance, state, tie, hop): `tie` keeps hops of equal distance from being compared
        tie = iter(range(1 << 62))
        preds: dict[int, list[int]] = {}
        waits: dict[int, list[tuple[int, int, int]]] = {}  # a call's two inputs -> (caller, rule, ret)
        for s in region:
            if a.accept[s]:
                heap.append((0, s, next(tie), None))
            for t in succ[s].tolist():
                if t in region:
                    preds.setdefault(t, []).append(s)
                elif t in dist:
                    heap.append((dist[t] + 1, s, next(tie), ("b", t)))
            for r, ret in a.calls.get(s, ()):
                start = int(a.starts[r])
                if start < 0:
                    continue
                if start in region or ret in region:
                    for x in {start, ret} & region:
                        waits.setdefault(x, []).append((s, r, ret))
                elif start in dist and ret in dist:
                    heap.append((dist[start] + dist[ret], s, next(tie), ("c", r, ret)))
        heapq.heapify(heap)
        hop = self._hop
        while heap:
            d, s, _, h = heapq.heappop(heap)
            if s in dist:
                continue
            dist[s], hop[s] = d, h
            for p in preds.get(s, ()):
                if p not in dist:
                    heapq.heappush(heap, (d + 1, p, next(tie), ("b", s)))
            for p, r, ret in waits.get(s, ()):
                start = int(a.starts[r])
                if p not in dist and start in dist and ret in dist:
                    heapq.heappush(heap, (dist[start] + dist[ret], p, next(tie), ("c", r, ret)))
        done.update(s for s in region if s not in dist)
