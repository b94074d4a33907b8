"""Subset construction and products in Python: the twin of csrc/dfa_build.c where no compiler is
present (or AGENTKV_NATIVE_GRAMMAR=0). The same languages; automata/minimize.py then merges equivalent states.
"""

from __future__ import annotations

import time

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.automata.rule_dfa import RuleDFA, rows_table


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


class _States:
    """A construction's states, numbered as first met and visited in that order (breadth first),
    within a state limit and a deadline."""

    def __init__(self, first, max_states: int, deadline: float):
        self.index = {first: 0}
        self.order = [first]
        self.max_states, self.deadline = max_states, deadline

    def id(self, key) -> int:
        if key not in self.index:
            self.index[key] = len(self.order)
            self.order.append(key)
        return self.index[key]

    def __iter__(self):
        i = 0
        while i < len(self.order):
            if i % 64 == 0 and time.monotonic() > self.deadline:
                raise GrammarError("grammar compilation timed out")
            if len(self.order) > self.max_states:
                raise GrammarError(f"grammar too large: more than {self.max_states} states in one rule; simplify it")
            yield self.order[i]
            i += 1


def determinize(nfa, start: int, final: int, max_states: int, deadline: float):
    """The DFA of an NFA (dfa.NFA) by subset construction, not minimized."""

    out_bytes: list[list[tuple[int, int, int]]] = [[] for _ in range(nfa.n)]
    eps: list[list[int]] = [[] for _ in range(nfa.n)]
    calls: list[list[tuple[str, int]]] = [[] for _ in range(nfa.n)]
    for s, lo, hi, t in nfa.edges:
        out_bytes[s].append((lo, hi, t))
    for s, t in nfa.eps:
        eps[s].append(t)
    for s, name, t in nfa.calls:
        calls[s].append((name, t))

    def closure(seeds) -> frozenset:
        out, stack = set(seeds), list(seeds)
        while stack:
            for t in eps[stack.pop()]:
                if t not in out:
                    out.add(t)
                    stack.append(t)
        return frozenset(out)

    closure_cache: dict[frozenset, frozenset] = {}
    states = _States(closure([start]), max_states, deadline)
    trans, dcalls, accept = [], [], []
    for cur in states:
        row = []
        for a, b, targets in _sweep([edge for s in cur for edge in out_bytes[s]]):
            tgt = closure_cache.get(targets)
            if tgt is None:
                tgt = closure_cache[targets] = closure(targets)
            row.append((a, b - 1, states.id(tgt)))
        by_rule: dict[str, list[int]] = {}
        for s in sorted(cur):
            for name, t in calls[s]:
                by_rule.setdefault(name, []).append(t)
        trans.append(row)
        dcalls.append([(name, states.id(closure(by_rule[name]))) for name in sorted(by_rule)])
        accept.append(final in cur)
    return RuleDFA(rows_table(trans), dcalls, np.array(accept, dtype=bool))


def product(d1, d2, keep_right: bool, max_states: int, deadline: float):
    """Product automaton: intersection (`keep_right`) or difference d1 - d2 of two call-free DFAs."""

    states = _States((0, 0), max_states, deadline)
    rows, accept = [], []
    none = np.full(256, -1, dtype=np.int64)
    n2 = len(d2.accept)
    for a, b in states:
        left = d1.table[a].astype(np.int64)
        right = d2.table[b].astype(np.int64) if b >= 0 else none
        keep = (left >= 0) & (right >= 0) if keep_right else left >= 0
        keys = left * (n2 + 1) + right + 1
        uniq, first, inverse = np.unique(keys[keep], return_index=True, return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int32)
        for j in np.argsort(first).tolist():  # numbered in byte order, as the C product does
            ids[j] = states.id((int(uniq[j]) // (n2 + 1), int(uniq[j]) % (n2 + 1) - 1))
        row = np.full(256, -1, dtype=np.int32)
        row[keep] = ids[inverse.reshape(-1)]
        rows.append(row)
        acc2 = b >= 0 and bool(d2.accept[b])
        accept.append(bool(d1.accept[a]) and (acc2 if keep_right else not acc2))
    return RuleDFA(np.array(rows, dtype=np.int32).reshape(-1, 256), [[] for _ in rows], np.array(accept, dtype=bool))
