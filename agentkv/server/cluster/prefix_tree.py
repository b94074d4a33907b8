"""An approximate radix tree of the prompts each replica has served, for cache-aware routing.

Keys are text (the rendered prompt), not token ids: the router then needs no tokenizer and no
model, and a shared text prefix is a shared token prefix up to the last token or so, which is all a
routing decision needs. It is approximate: it records what each replica was sent, not what its
radix cache still holds (the replica may have evicted it), and it forgets on its own schedule.

Each node records the replicas whose prompts passed through it, with the time they last did; a
replica's prompts are marked along their whole path, so its match for a text is the depth of the
deepest node on the text's path that carries its mark. Every replica has a character budget: past
it, its least recently used leaves lose its mark (and nodes nobody marks are removed).
"""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("edge", "children", "marks", "parent")

    def __init__(self, edge: str, parent: _Node | None):
        self.edge = edge  # the text from the parent to this node
        self.children: dict[str, _Node] = {}
        self.marks: dict[str, int] = {}  # replica -> last time it passed here
        self.parent = parent


class PrefixTree:
    def __init__(self, max_chars_per_replica: int = 2_000_000):
        if max_chars_per_replica < 1:
            raise ValueError("max_chars_per_replica must be at least 1")
        self.max_chars = max_chars_per_replica
        self.root = _Node("", None)
        self.chars: dict[str, int] = {}  # replica -> characters of the nodes it marks
        self._clock = itertools.count(1)

    def insert(self, text: str, replica: str) -> None:
        """Record that `replica` was sent `text` (its whole path is marked as just used)."""
        now = next(self._clock)
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                child = _Node(text[i:], node)
                node.children[text[i]] = child
            else:
                n = _common(child.edge, text, i)
                if n < len(child.edge):
                    child = self._split(child, n)
            i += len(child.edge)
            if replica not in child.marks:
                self.chars[replica] = self.chars.get(replica, 0) + len(child.edge)
            child.marks[replica] = now
            node = child
        self.chars.setdefault(replica, 0)
        if self.chars[replica] > self.max_chars:
            self._evict(replica, self.chars[replica] - self.max_chars)

    def match(self, text: str) -> dict[str, int]:
        """For each replica, how many leading characters of `text` it has been sent (0s left out)."""
        out: dict[str, int] = {}
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            n = _common(child.edge, text, i)
            for r in child.marks:
                out[r] = i + n
            if n < len(child.edge):
                break
            i += n
            node = child
        return out

    def remove_replica(self, replica: str) -> None:
        """Forget a replica everywhere (it failed or left)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.marks.pop(replica, None) is not None:
                self._prune(node)
        self.chars.pop(replica, None)

    # -- internals ---------------------------------------------------------------------------------

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut `child`'s edge after n characters; returns the new upper node (same marks)."""
        parent = child.parent
        upper = _Node(child.edge[:n], parent)
        upper.marks = dict(child.marks)  # both halves keep the marks: each replica's count is unchanged
        parent.children[upper.edge[0]] = upper
        child.edge = child.edge[n:]
        child.parent = upper
        upper.children[child.edge[0]] = child
        return upper

    def _evict(self, replica: str, excess: int) -> None:
        """Drop `replica`'s least recently used leaves until `excess` characters are freed."""
        heap = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if replica in node.marks and not any(replica in c.marks for c in node.children.values()):
                heap.append((node.marks[replica], id(node), node))
        heapq.heapify(heap)
        while excess > 0 and heap:
            _, _, node = heapq.heappop(heap)
            del node.marks[replica]
            self.chars[replica] -= len(node.edge)
            excess -= len(node.edge)
            parent = node.parent
            self._prune(node)
            if parent is not self.root and replica in parent.marks and \
                    not any(replica in c.marks for c in parent.children.values()):
                heapq.heappush(heap, (parent.marks[replica], id(parent), parent))

    def _prune(self, node: _Node) -> None:
        """Remove `node` and its unmarked ancestors while they mark nothing and lead nowhere."""
        while node is not self.root and not node.marks and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent


def _common(edge: str, text: str, start: int) -> int:
    n = 0
    limit = min(len(edge), len(text) - start)
    while n < limit and edge[n] == text[start + n]:
        n += 1
    return n
