"""One rule's expression -> a DFA over bytes and rule calls (a call to rule R is one more symbol).

The expression becomes a Thompson NFA over byte ranges (characters lowered to their UTF-8
sequences), with call edges for references; subset construction over byte classes makes it
deterministic and minimization merges the states no input can tell apart, in C (automata/dfa_native.py;
csrc/nfa_build.c, dfa_build.c, dfa_minimize.c), or in Python (automata/dfa_python.py, automata/minimize.py) where no
compiler is present.
Intersections and differences of call-free languages (string length bounds, formats, patterns) are
product automata. Minimal DFAs are cached by expression across compilations, within a byte budget:
the same strings, numbers and formats recur schema after schema.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar import native
from agentkv.grammar.automata import dfa_native, dfa_python
from agentkv.grammar.automata.expr import (
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
)
from agentkv.grammar.automata.minimize import minimize
from agentkv.grammar.automata.rule_dfa import (
    MAX_DFA_STATES,
    MAX_NFA_STATES,
    RuleDFA,
    rows_table,
    table_edges,
    utf8_ranges,
)


class NFA:
    """A Thompson NFA as flat edge lists: bytes (source, lo, hi, target), epsilon (source, target),
    calls (source, rule name, return state)."""

    def __init__(self, deadline: float):
        self.n = 0
        self.edges: list[tuple[int, int, int, int]] = []
        self.eps: list[tuple[int, int]] = []
        self.calls: list[tuple[int, str, int]] = []
        self.deadline = deadline

    def new(self) -> int:
        if self.n >= MAX_NFA_STATES:
            raise GrammarError(f"grammar too large: more than {MAX_NFA_STATES} automaton states; "
                               "lower the repetition bounds (maxLength, maxItems, {m,n}) or simplify the schema")
        self.n += 1
        return self.n - 1

    def build(self, e, s: int) -> int:
        """Add `e` starting at state `s`; return its end state."""
        if isinstance(e, Lit):
            for b in e.data:
                t = self.new()
                self.edges.append((s, b, b, t))
                s = t
            return s
        if isinstance(e, (Chars, ByteSet)):
            end = self.new()
            seqs = (utf8_ranges(e.ranges) if isinstance(e, Chars) else [[r] for r in e.ranges])
            for sq in seqs:
                cur = s
                for k, (lo, hi) in enumerate(sq):
                    t = end if k == len(sq) - 1 else self.new()
                    self.edges.append((cur, lo, hi, t))
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
                self.eps.append((s, start))
                self.eps.append((self.build(it, start), end))
            return end
        if isinstance(e, Repeat):
            if time.monotonic() > self.deadline:
                raise GrammarError("grammar compilation timed out")
            for _ in range(e.min):
                s = self.build(e.item, s)
            if e.max is None:
                loop = self.new()
                self.eps.append((s, loop))
                self.eps.append((self.build(e.item, loop), loop))
                return loop
            end = self.new()
            self.eps.append((s, end))
            for _ in range(e.max - e.min):
                s = self.build(e.item, s)
                self.eps.append((s, end))
            return end
        if isinstance(e, Ref):
            t = self.new()
            self.calls.append((s, e.name, t))
            return t
        if isinstance(e, (Intersect, Diff, Machine)):
            prod = minimal_dfa(e, self.deadline)  # (refuses rule calls inside)
            base = self.n
            for _ in range(len(prod.accept) + 1):
                self.new()
            end = base + len(prod.accept)
            self.eps.append((s, base))
            self.edges.extend(table_edges(prod.table, base))
            self.eps.extend((base + k, end) for k in np.nonzero(prod.accept)[0].tolist())
            return end
        if isinstance(e, Anchor):
            raise GrammarError(f"regex anchor '{e.kind}' is only supported at the start or end of a pattern")
        raise TypeError(f"not a grammar expression: {e!r}")

def determinize(expr, deadline: float) -> RuleDFA:
    """`expr`'s DFA by subset construction in Python, not minimized (the twin; tests compare)."""
    nfa = NFA(deadline)
    start = nfa.new()
    final = nfa.build(expr, start)
    return dfa_python.determinize(nfa, start, final, MAX_DFA_STATES, deadline)


# Minimal DFAs by expression, across compilations: the same strings, numbers, formats and
# patterns recur in schema after schema (a rule's expression names the rules it calls, so equal
# expressions are equal rules). Each is kept over its byte classes (_pack): 10-60 columns where the
# table has 256, so the budget holds the rules of a few hundred schemas, not of sixty.
_DFAS: OrderedDict = OrderedDict()  # expr -> (packed RuleDFA, bytes)
MAX_CACHED_DFA_BYTES = 64 << 20
_dfa_bytes = 0
_dfa_evictions = 0
_DFAS_LOCK = threading.Lock()


def minimal_dfa(expr, deadline: float) -> RuleDFA:
    """The minimal DFA of `expr` (minimized so that, e.g., a pattern's tail after its match is one
    state; see automata/minimize.py), cached."""
    with _DFAS_LOCK:
        hit = _DFAS.get(expr)
        if hit is not None:
            _DFAS.move_to_end(expr)
    if hit is not None:
        return _unpack(hit[0])
    lib = native.load()  # (None: the Python twin builds it)
    if isinstance(expr, (Intersect, Diff)):
        left, right = minimal_dfa(expr.left, deadline), minimal_dfa(expr.right, deadline)
        if any(left.calls) or any(right.calls):
            raise GrammarError("an intersection or difference of languages must not involve rule references")
        keep_right = isinstance(expr, Intersect)
        dfa = (dfa_native.product(lib, left, right, keep_right, deadline) if lib is not None else
               minimize(dfa_python.product(left, right, keep_right, MAX_DFA_STATES, deadline), deadline))
    elif isinstance(expr, Machine):
        table, accept = rows_table(expr.trans), np.array(expr.accept, dtype=bool)
        dfa = (dfa_native.machine(lib, table, accept) if lib is not None else
               minimize(RuleDFA(table, [[] for _ in accept], accept), deadline))
    else:
        dfa = (dfa_native.expression(lib, expr, deadline, minimal_dfa) if lib is not None else
               minimize(determinize(expr, deadline), deadline))
    if dfa.rules is None:  # (C names them as it encodes the expression; the Python twins do not)
        dfa.rules = tuple(sorted(refs(expr)))
    packed = _pack(dfa)
    size = packed[0].nbytes + 256 + 64 * len(dfa.accept)
    with _DFAS_LOCK:
        global _dfa_bytes, _dfa_evictions
        if expr not in _DFAS:
            _DFAS[expr] = (packed, size)
            _dfa_bytes += size
        while _dfa_bytes > MAX_CACHED_DFA_BYTES and len(_DFAS) > 1:
            _dfa_bytes -= _DFAS.popitem(last=False)[1][1]
            _dfa_evictions += 1
    return dfa


def _pack(d: RuleDFA) -> tuple:
    """A RuleDFA as the cache keeps it: its table's distinct columns and each byte's column (the
    byte classes C found, where it built the DFA)."""
    if d.classes is not None:
        return (*d.classes, d.calls, d.accept, d.rules)
    by_byte = np.ascontiguousarray(d.table.T)
    keys = by_byte.view(np.dtype((np.void, by_byte.shape[1] * by_byte.itemsize))).ravel()
    _, first, column = np.unique(keys, return_index=True, return_inverse=True)
    return np.ascontiguousarray(d.table[:, first]), column.astype(np.uint8), d.calls, d.accept, d.rules


def _unpack(packed: tuple) -> RuleDFA:
    columns, column, calls, accept, rules = packed
    # (a column gather comes out in Fortran order; C reads tables row by row)
    return RuleDFA(np.ascontiguousarray(columns[:, column]), calls, accept, (columns, column), rules)


def cache_info() -> dict[str, int]:
    """The rule automata kept across compilations: how many, their bytes, how many were evicted."""
    with _DFAS_LOCK:
        return {"dfas": len(_DFAS), "dfa_bytes": _dfa_bytes, "dfa_evictions": _dfa_evictions}


def clear_cache() -> None:
    global _dfa_bytes
    with _DFAS_LOCK:
        _DFAS.clear()
        _dfa_bytes = 0


def is_empty(expr, deadline: float) -> bool:
    """Does a call-free expression match no string at all?"""
    d = minimal_dfa(expr, deadline)
    seen, stack = {0}, [0]
    while stack:
        s = stack.pop()
        if d.accept[s]:
            return False
        for t in d.targets(s):
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return True


def language_matches(expr, text: str, deadline: float) -> bool:
    """Does a call-free expression match `text` (as UTF-8) in full?"""
    d = minimal_dfa(expr, deadline)  # cached: called once per property name with the same patterns
    s = 0
    for b in text.encode():
        s = int(d.table[s, b])
        if s < 0:
            return False
    return bool(d.accept[s])
