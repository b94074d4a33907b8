"""One rule's expression -> a DFA over bytes and rule calls (a call to rule R is one more symbol).

The expression becomes a Thompson NFA over byte ranges (characters lowered to their UTF-8
sequences), with call edges for references; subset construction over byte classes makes it
deterministic and minimization merges the states no input can tell apart, in C
(csrc/dfa_build.c), or in Python (dfa_python.py, minimize.py) where no compiler is present.
Intersections and differences of call-free languages (string length bounds, formats, patterns) are
product automata. Minimal DFAs are cached by expression across compilations, within a byte budget:
the same strings, numbers and formats recur schema after schema.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar import dfa_python, native
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
            seqs = (_utf8(e.ranges) if isinstance(e, Chars) else [[r] for r in e.ranges])
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
            if not isinstance(e, Machine) and (refs(e.left) or refs(e.right)):
                raise GrammarError("an intersection or difference of languages must not involve rule references")
            prod = minimal_dfa(e, self.deadline)
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

@dataclass
class RuleDFA:
    table: np.ndarray  # [n, 256] int32: the next state per byte, -1 for none
    calls: list[list[tuple[str, int]]]  # per state: (rule, return state), by rule
    accept: np.ndarray  # [n] bool

    def targets(self, s: int) -> list[int]:
        """The states one byte leads to from `s`."""
        row = self.table[s]
        return np.unique(row[row >= 0]).tolist()


def table_edges(table: np.ndarray, base: int = 0) -> list[tuple[int, int, int, int]]:
    """A DFA table's transitions as byte-interval edges (source, lo, hi, target), offset by `base`."""
    src, byte = np.nonzero(table >= 0)
    if not len(src):
        return []
    dst = table[src, byte]
    start = np.ones(len(src), dtype=bool)
    start[1:] = (src[1:] != src[:-1]) | (byte[1:] != byte[:-1] + 1) | (dst[1:] != dst[:-1])
    first = np.nonzero(start)[0]
    last = np.append(first[1:], len(src)) - 1
    return list(zip((src[first] + base).tolist(), byte[first].tolist(), byte[last].tolist(),
                    (dst[first] + base).tolist()))


def determinize(expr, deadline: float) -> RuleDFA:
    """`expr`'s DFA by subset construction in Python, not minimized (the twin; tests compare)."""
    nfa = NFA(deadline)
    start = nfa.new()
    final = nfa.build(expr, start)
    return dfa_python.determinize(nfa, start, final, MAX_DFA_STATES, deadline)


# Minimal DFAs by expression, across compilations: the same strings, numbers, formats and
# patterns recur in schema after schema (a rule's expression names the rules it calls, so equal
# expressions are equal rules).
_DFAS: OrderedDict = OrderedDict()  # expr -> (RuleDFA, bytes)
MAX_CACHED_DFA_BYTES = 64 << 20
_dfa_bytes = 0
_DFAS_LOCK = threading.Lock()


def minimal_dfa(expr, deadline: float) -> RuleDFA:
    """The minimal DFA of `expr` (minimized so that, e.g., a pattern's tail after its match is one
    state; see minimize.py), cached."""
    with _DFAS_LOCK:
        hit = _DFAS.get(expr)
        if hit is not None:
            _DFAS.move_to_end(expr)
            return hit[0]
    lib = native.load()
    if isinstance(expr, (Intersect, Diff)):
        left, right = minimal_dfa(expr.left, deadline), minimal_dfa(expr.right, deadline)
        keep_right = isinstance(expr, Intersect)
        if lib is not None:
            acc1, acc2 = _bytes(left.accept), _bytes(right.accept)  # (held: C reads them)
            dfa = _native(lib.agentkv_dfa_product(
                len(acc1), _ptr(left.table), _ptr(acc1), len(acc2), _ptr(right.table), _ptr(acc2), int(keep_right),
                MAX_DFA_STATES, _seconds(deadline)), [])
        else:
            dfa = minimize(dfa_python.product(left, right, keep_right, MAX_DFA_STATES, deadline), deadline)
    elif isinstance(expr, Machine):
        table, accept = dfa_python.rows_table(expr.trans), np.array(expr.accept, dtype=bool)
        if lib is not None:
            acc = _bytes(accept)
            dfa = _native(lib.agentkv_dfa_minimize(len(acc), _ptr(table), _ptr(acc)), [])
        else:
            dfa = minimize(RuleDFA(table, [[] for _ in accept], accept), deadline)
    elif lib is not None:
        code, root, names, embedded = encode(expr, deadline)
        dfa_off = np.cumsum([0] + [len(d.accept) for d in embedded], dtype=np.int32)
        tables = np.concatenate([d.table for d in embedded]) if embedded else np.zeros((0, 256), dtype=np.int32)
        accepts = _bytes(np.concatenate([d.accept for d in embedded]) if embedded else np.zeros(0, dtype=bool))
        dfa = _native(lib.agentkv_expr_to_dfa(_ptr(code), root, _ptr(dfa_off), _ptr(tables), _ptr(accepts),
                                              MAX_NFA_STATES, MAX_DFA_STATES, _seconds(deadline)), names)
    else:
        dfa = minimize(determinize(expr, deadline), deadline)
    size = dfa.table.nbytes + 64 * len(dfa.accept)
    with _DFAS_LOCK:
        global _dfa_bytes
        if expr not in _DFAS:
            _DFAS[expr] = (dfa, size)
            _dfa_bytes += size
        while _dfa_bytes > MAX_CACHED_DFA_BYTES and len(_DFAS) > 1:
            _dfa_bytes -= _DFAS.popitem(last=False)[1][1]
    return dfa


# Node kinds of the encoding csrc/dfa_build.c builds its NFA from (its X_* constants).
X_LIT, X_RANGES, X_SEQ, X_ALT, X_REPEAT, X_REF, X_DFA = range(7)


def encode(expr, deadline: float) -> tuple[np.ndarray, int, list[str], list[RuleDFA]]:
    """`expr` as int32 code for the C NFA builder: each distinct node once, after its children,
    as its kind and arguments (children by their offset). Returns the code, the root's offset, the
    rule names (a REF's argument indexes them; sorted), and the minimal DFAs of intersections,
    differences and machines (an X_DFA's argument indexes them)."""
    names = sorted(refs(expr))
    rule = {name: i for i, name in enumerate(names)}
    code: list[int] = []
    embedded: list[RuleDFA] = []
    at: dict[int, int] = {}

    def put(e) -> int:
        key = id(e)
        if key in at:
            return at[key]
        if isinstance(e, Lit):
            node = [X_LIT, len(e.data), *e.data]
        elif isinstance(e, (Chars, ByteSet)):
            seqs = _utf8(e.ranges) if isinstance(e, Chars) else [[r] for r in e.ranges]
            node = [X_RANGES, len(seqs)]
            for sq in seqs:
                node.append(len(sq))
                for lo, hi in sq:
                    node += (lo, hi)
        elif isinstance(e, (Seq, Alt)):
            kids = [put(it) for it in e.items]
            node = [X_SEQ if isinstance(e, Seq) else X_ALT, len(kids), *kids]
        elif isinstance(e, Repeat):
            node = [X_REPEAT, e.min, -1 if e.max is None else e.max, put(e.item)]
        elif isinstance(e, Ref):
            node = [X_REF, rule[e.name]]
        elif isinstance(e, (Intersect, Diff, Machine)):
            if not isinstance(e, Machine) and (refs(e.left) or refs(e.right)):
                raise GrammarError("an intersection or difference of languages must not involve rule references")
            embedded.append(minimal_dfa(e, deadline))
            node = [X_DFA, len(embedded) - 1]
        elif isinstance(e, Anchor):
            raise GrammarError(f"regex anchor '{e.kind}' is only supported at the start or end of a pattern")
        else:
            raise TypeError(f"not a grammar expression: {e!r}")
        at[key] = len(code)
        code.extend(node)
        return at[key]

    root = put(expr)
    return np.array(code, dtype=np.int32), root, names, embedded


@functools.lru_cache(maxsize=4096)
def _utf8(ranges) -> list[list[tuple[int, int]]]:
    """A character set's UTF-8 encodings as byte-range sequences."""
    seqs = []
    for lo, hi in subtract(ranges, []):
        seqs.extend(utf8_sequences(lo, hi))
    return seqs


def clear_cache() -> None:
    global _dfa_bytes
    with _DFAS_LOCK:
        _DFAS.clear()
        _dfa_bytes = 0


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _bytes(accept: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(accept, dtype=np.uint8)


def _seconds(deadline: float) -> float:
    return max(0.0, min(deadline - time.monotonic(), 1e9))


def _native(result: int, names: list[str]) -> RuleDFA:
    """A RuleDFA copied out of csrc/dfa_build.c's result, which is then freed."""
    lib = native.load()
    if not result:
        raise MemoryError("the grammar's automaton construction ran out of memory")
    try:
        r = native.DfaStruct.from_address(result)
        if r.error == native.DFA_TOO_MANY:
            raise GrammarError(f"grammar too large: more than {MAX_DFA_STATES} states in one rule; simplify it")
        if r.error == native.DFA_TOO_MANY_NFA:
            raise GrammarError(f"grammar too large: more than {MAX_NFA_STATES} automaton states; lower the "
                               "repetition bounds (maxLength, maxItems, {m,n}) or simplify the schema")
        if r.error == native.DFA_TIMEOUT:
            raise GrammarError("grammar compilation timed out")
        if r.error:
            raise MemoryError("the grammar's automaton construction ran out of memory")
        n, nc = r.n, r.n_calls
        table = np.empty((n, 256), dtype=np.int32)
        accept = np.empty(n, dtype=bool)  # (C's bytes are 0 or 1)
        ctypes.memmove(table.ctypes.data, r.table, table.nbytes)
        ctypes.memmove(accept.ctypes.data, r.accept, n)
        calls: list[list[tuple[str, int]]] = [[] for _ in range(n)]
        if nc:
            flat = np.empty(3 * nc, dtype=np.int32)
            ctypes.memmove(flat.ctypes.data, r.calls, flat.nbytes)
            flat = flat.tolist()
            for i in range(0, 3 * nc, 3):
                calls[flat[i]].append((names[flat[i + 1]], flat[i + 2]))
        return RuleDFA(table, calls, accept)
    finally:
        lib.agentkv_dfa_free(result)


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
