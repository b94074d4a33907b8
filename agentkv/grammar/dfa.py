"""One rule's expression -> a DFA over bytes and rule calls (a call to rule R is one more symbol).

The expression becomes a Thompson NFA over byte ranges (characters lowered to their UTF-8
sequences), with call edges for references; subset construction makes it deterministic, and
minimize.py merges the states no input can tell apart. Intersections and differences of call-free
languages (string length bounds, formats, patterns) are product automata. Minimal DFAs are cached
by expression across compilations: the same strings, numbers and formats recur schema after schema.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from agentkv.errors import GrammarError
from agentkv.grammar.expr import (
    Alt,
    Anchor,
    ByteSet,
    Chars,
    Diff,
    Intersect,
    Lit,
    Machine,
    Ref,
    Repeat,
    Seq,
    refs,
    subtract,
)
from agentkv.grammar.minimize import minimize

MAX_NFA_STATES = 400_000
MAX_DFA_STATES = 200_000


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences matching exactly the UTF-8 encodings of code points lo..hi."""
    out = []
    for a, b in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF)):
        s, e = max(lo, a), min(hi, b)
        if s <= e:
            out.extend(_split_same_length(s, e))
    return out


def _split_same_length(s: int, e: int) -> list[list[tuple[int, int]]]:
    n = len(chr(s).encode("utf-8", "surrogatepass"))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (s & ~m) != (e & ~m):
            if s & m:
                return _split_same_length(s, s | m) + _split_same_length((s | m) + 1, e)
            if (e & m) != m:
                return _split_same_length(s, (e & ~m) - 1) + _split_same_length(e & ~m, e)
    bs, be = chr(s).encode("utf-8", "surrogatepass"), chr(e).encode("utf-8", "surrogatepass")
    return [[(bs[i], be[i]) for i in range(n)]]


class _NFA:
    def __init__(self, deadline: float):
        self.bytes: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.calls: list[list[tuple[str, int]]] = []
        self.deadline = deadline
        self._chars_cache: dict = {}

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise GrammarError(f"grammar too large: more than {MAX_NFA_STATES} automaton states; "
                               "lower the repetition bounds (maxLength, maxItems, {m,n}) or simplify the schema")
        self.bytes.append([])
        self.eps.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def build(self, e, s: int) -> int:
        """Add `e` starting at state `s`; return its end state."""
        if isinstance(e, Lit):
            for b in e.data:
                t = self.new()
                self.bytes[s].append((b, b, t))
                s = t
            return s
        if isinstance(e, (Chars, ByteSet)):
            end = self.new()
            seqs = (self._utf8(e.ranges) if isinstance(e, Chars) else [[r] for r in e.ranges])
            for sq in seqs:
                cur = s
                for k, (lo, hi) in enumerate(sq):
                    t = end if k == len(sq) - 1 else self.new()
                    self.bytes[cur].append((lo, hi, t))
                    cur = t
            return end
        if isinstance(e, Seq):
            for it in e.items:
                s = self.build(it, s)
            return s
        if isinstance(e, Alt):
            end = self.new()
            for it in e.items:
                start = self.new()
                self.eps[s].append(start)
                self.eps[self.build(it, start)].append(end)
            return end
        if isinstance(e, Repeat):
            if time.monotonic() > self.deadline:
                raise GrammarError("grammar compilation timed out")
            for _ in range(e.min):
                s = self.build(e.item, s)
            if e.max is None:
                loop = self.new()
                self.eps[s].append(loop)
                self.eps[self.build(e.item, loop)].append(loop)
                return loop
            end = self.new()
            self.eps[s].append(end)
            for _ in range(e.max - e.min):
                s = self.build(e.item, s)
                self.eps[s].append(end)
            return end
        if isinstance(e, Ref):
            t = self.new()
            self.calls[s].append((e.name, t))
            return t
        if isinstance(e, (Intersect, Diff, Machine)):
            if not isinstance(e, Machine) and (refs(e.left) or refs(e.right)):
                raise GrammarError("an intersection or difference of languages must not involve rule references")
            prod = minimal_dfa(e, self.deadline)
            base = len(self.eps)
            for _ in prod.accept:
                self.new()
            end = self.new()
            self.eps[s].append(base)
            for k, row in enumerate(prod.trans):
                self.bytes[base + k].extend((lo, hi, base + t) for lo, hi, t in row)
                if prod.accept[k]:
                    self.eps[base + k].append(end)
            return end
        if isinstance(e, Anchor):
            raise GrammarError(f"regex anchor '{e.kind}' is only supported at the start or end of a pattern")
        raise TypeError(f"not a grammar expression: {e!r}")

    def _utf8(self, ranges):
        key = ranges
        if key not in self._chars_cache:
            seqs = []
            for lo, hi in subtract(ranges, []):
                seqs.extend(utf8_sequences(lo, hi))
            self._chars_cache[key] = seqs
        return self._chars_cache[key]


def _sweep(edges):
    """Split byte-range edges into disjoint intervals: yields (lo, hi + 1, frozenset of targets)."""
    if not edges:
        return
    events = sorted([(lo, 1, t) for lo, _, t in edges] + [(hi + 1, -1, t) for _, hi, t in edges])
    active: dict[int, int] = {}
    prev = None
    i = 0
    while i < len(events):
        x = events[i][0]
        if prev is not None and active and x > prev:
            yield prev, x, frozenset(active)
        while i < len(events) and events[i][0] == x:
            _, d, t = events[i]
            n = active.get(t, 0) + d
            if n:
                active[t] = n
            else:
                active.pop(t, None)
            i += 1
        prev = x


@dataclass
class RuleDFA:
    trans: list[list[tuple[int, int, int]]]  # per state: (lo, hi, target) byte intervals
    calls: list[list[tuple[str, int]]]
    accept: list[bool]


def determinize(expr, deadline: float) -> RuleDFA:
    nfa = _NFA(deadline)
    start = nfa.new()
    final = nfa.build(expr, start)

    def closure(states) -> frozenset:
        out, stack = set(states), list(states)
        while stack:
            for t in nfa.eps[stack.pop()]:
                if t not in out:
                    out.add(t)
                    stack.append(t)
        return frozenset(out)

    closure_cache: dict[frozenset, frozenset] = {}
    first = closure([start])
    index = {first: 0}
    order = [first]
    trans, calls, accept = [], [], []
    i = 0
    while i < len(order):
        if i % 64 == 0 and time.monotonic() > deadline:
            raise GrammarError("grammar compilation timed out")
        if len(order) > MAX_DFA_STATES:
            raise GrammarError(f"grammar too large: more than {MAX_DFA_STATES} states in one rule; simplify it")
        cur = order[i]
        i += 1
        row = []
        for a, b, targets in _sweep([edge for s in cur for edge in nfa.bytes[s]]):
            tgt = closure_cache.get(targets)
            if tgt is None:
                tgt = closure_cache[targets] = closure(targets)
            if tgt not in index:
                index[tgt] = len(order)
                order.append(tgt)
            j = index[tgt]
            if row and row[-1][2] == j and row[-1][1] == a - 1:
                row[-1] = (row[-1][0], b - 1, j)
            else:
                row.append((a, b - 1, j))
        by_rule: dict[str, list[int]] = {}
        for s in cur:
            for name, t in nfa.calls[s]:
                by_rule.setdefault(name, []).append(t)
        crow = []
        for name, targets in by_rule.items():
            tgt = closure(targets)
            if tgt not in index:
                index[tgt] = len(order)
                order.append(tgt)
            crow.append((name, index[tgt]))
        trans.append(row)
        calls.append(crow)
        accept.append(final in cur)
    return RuleDFA(trans, calls, accept)


def product(d1: RuleDFA, d2: RuleDFA, keep_right: bool, deadline: float) -> RuleDFA:
    """Product automaton: intersection (`keep_right`) or difference d1 - d2 of two call-free DFAs."""
    index = {(0, 0): 0}
    order = [(0, 0)]
    trans, accept = [], []
    i = 0
    while i < len(order):
        if i % 256 == 0 and time.monotonic() > deadline:
            raise GrammarError("grammar compilation timed out")
        a, b = order[i]
        i += 1
        edges = [(lo, hi, (0, t)) for lo, hi, t in d1.trans[a]]
        if b >= 0:
            edges += [(lo, hi, (1, t)) for lo, hi, t in d2.trans[b]]
        row = []
        for x, y, targets in _sweep(edges):
            t1 = next((t for side, t in targets if side == 0), None)
            if t1 is None:
                continue
            t2 = next((t for side, t in targets if side == 1), -1)
            if keep_right and t2 < 0:
                continue
            key = (t1, t2)
            if key not in index:
                index[key] = len(order)
                order.append(key)
            row.append((x, y - 1, index[key]))
        trans.append(row)
        acc2 = b >= 0 and d2.accept[b]
        accept.append(d1.accept[a] and (acc2 if keep_right else not acc2))
    return RuleDFA(trans, [[] for _ in trans], accept)


# Minimal DFAs by expression, across compilations: the same strings, numbers, formats and
# patterns recur in schema after schema (a rule's expression names the rules it calls, so equal
# expressions are equal rules).
_DFAS: OrderedDict = OrderedDict()
MAX_CACHED_DFAS = 1024
_DFAS_LOCK = threading.Lock()


def minimal_dfa(expr, deadline: float) -> RuleDFA:
    """The minimal DFA of `expr` (minimized so that, e.g., a pattern's tail after its match is one
    state; see minimize.py), cached."""
    with _DFAS_LOCK:
        hit = _DFAS.get(expr)
        if hit is not None:
            _DFAS.move_to_end(expr)
            return hit
    if isinstance(expr, (Intersect, Diff)):
        left, right = minimal_dfa(expr.left, deadline), minimal_dfa(expr.right, deadline)
        dfa = minimize(product(left, right, keep_right=isinstance(expr, Intersect), deadline=deadline), deadline)
    elif isinstance(expr, Machine):
        dfa = minimize(RuleDFA([list(r) for r in expr.trans], [[] for _ in expr.trans], list(expr.accept)), deadline)
    else:
        dfa = minimize(determinize(expr, deadline), deadline)
    with _DFAS_LOCK:
        _DFAS[expr] = dfa
        if len(_DFAS) > MAX_CACHED_DFAS:
            _DFAS.popitem(last=False)
    return dfa


def is_empty(expr, deadline: float) -> bool:
    """Does a call-free expression match no string at all?"""
    d = minimal_dfa(expr, deadline)
    seen, stack = {0}, [0]
    while stack:
        s = stack.pop()
        if d.accept[s]:
            return False
        for _, _, t in d.trans[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return True


def language_matches(expr, text: str, deadline: float) -> bool:
    """Does a call-free expression match `text` (as UTF-8) in full?"""
    d = minimal_dfa(expr, deadline)  # cached: called once per property name with the same patterns
    s = 0
    for b in text.encode():
        s = next((t for lo, hi, t in d.trans[s] if lo <= b <= hi), -1)
        if s < 0:
            return False
    return d.accept[s]
