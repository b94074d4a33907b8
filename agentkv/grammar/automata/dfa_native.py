"""Rule automata built in C (csrc/nfa_build.c, dfa_build.c, dfa_minimize.c): an expression is
encoded as int32 code, each distinct node once, and C builds its Thompson NFA, determinizes and
minimizes it in one call; products and machines likewise. automata/dfa.py calls this where the library loads.
"""

from __future__ import annotations

import ctypes
import functools
import time

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar import native
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
)
from agentkv.grammar.automata.rule_dfa import MAX_DFA_STATES, MAX_NFA_STATES, RuleDFA, utf8_ranges


def product(lib, left, right, keep_right: bool, deadline: float):
    """The minimal intersection (`keep_right`) or difference of two call-free RuleDFAs."""
    acc1, acc2 = _bytes(left.accept), _bytes(right.accept)  # (held: C reads them)
    t1, t2 = _rows(left.table), _rows(right.table)
    return _result(lib.agentkv_dfa_product(
        len(acc1), _ptr(t1), _ptr(acc1), len(acc2), _ptr(t2), _ptr(acc2), int(keep_right),
        MAX_DFA_STATES, _seconds(deadline)), [])


def machine(lib, table: np.ndarray, accept: np.ndarray):
    """A call-free DFA given as its table, minimized."""
    acc, rows = _bytes(accept), _rows(table)
    return _result(lib.agentkv_dfa_minimize(len(acc), _ptr(rows), _ptr(acc)), [])


def expression(lib, expr, deadline: float, minimal):
    """The minimal DFA of a rule's expression: encoded, then NFA, subsets and minimization in C.
    `minimal(e, deadline)` gives the DFAs embedded whole (intersections, differences, machines):
    dfa.minimal_dfa, with its cache. Where the extension module is built (native.expr_module), it
    reads the expression objects and hands back the result itself."""
    ext = _expr_module()
    if ext is not None:
        (n, k, table, accept, columns, column, calls, error), names = ext.expr_to_dfa(
            expr, deadline, _seconds(deadline), minimal, MAX_NFA_STATES, MAX_DFA_STATES)
        if error:
            _raise(error)
        # (views of the extension's bytearrays, not copies)
        return RuleDFA(np.frombuffer(table, dtype=np.int32).reshape(n, 256), calls,
                       np.frombuffer(accept, dtype=bool),
                       (np.frombuffer(columns, dtype=np.int32).reshape(n, k), np.frombuffer(column, dtype=np.uint8)),
                       names)
    code, root, names, embedded = encode(expr, deadline, minimal)
    dfa_off = np.cumsum([0] + [len(d.accept) for d in embedded], dtype=np.int32)
    tables = _rows(np.concatenate([d.table for d in embedded])) if embedded else np.zeros((0, 256), dtype=np.int32)
    accepts = _bytes(np.concatenate([d.accept for d in embedded]) if embedded else np.zeros(0, dtype=bool))
    return _result(lib.agentkv_expr_to_dfa(_ptr(code), root, _ptr(dfa_off), _ptr(tables), _ptr(accepts),
                                           MAX_NFA_STATES, MAX_DFA_STATES, _seconds(deadline)), names)


# Node kinds of the encoding csrc/nfa_build.c builds its NFA from (its X_* constants).
X_LIT, X_RANGES, X_SEQ, X_ALT, X_REPEAT, X_REF, X_DFA = range(7)


def encode(expr, deadline: float, minimal) -> tuple[np.ndarray, int, list[str], list]:
    """`expr` as int32 code for the C NFA builder: each distinct node once, after its children,
    as its kind and arguments (children by their offset). Returns the code, the root's offset, the
    rule names (a REF's argument indexes them; sorted), and the minimal DFAs of intersections,
    differences and machines (an X_DFA's argument indexes them)."""
    names: dict[str, int] = {}  # in the order met; renumbered sorted at the end
    ref_args: list[int] = []
    code: list[int] = []
    embedded: list = []
    at: dict[int, int] = {}

    def put(e) -> int:
        key = id(e)
        hit = at.get(key)
        if hit is not None:
            return hit
        kind = type(e)
        if kind is Lit:
            node = [X_LIT, len(e.data), *e.data]
        elif kind is Seq or kind is Alt:
            node = [X_SEQ if kind is Seq else X_ALT, len(e.items)]
            for it in e.items:
                node.append(put(it))
        elif kind is Chars or kind is ByteSet:
            node = _ranges_node(e.ranges, kind is Chars)
        elif kind is Repeat:
            node = [X_REPEAT, e.min, -1 if e.max is None else e.max, put(e.item)]
        elif kind is Ref:
            ref_args.append(len(code) + 1)
            node = [X_REF, names.setdefault(e.name, len(names))]
        elif kind is Intersect or kind is Diff or kind is Machine:
            embedded.append(minimal(e, deadline))
            node = [X_DFA, len(embedded) - 1]
        else:
            _refuse(e)
        at[key] = len(code)
        code.extend(node)
        return at[key]

    root = put(expr)
    put = None  # (a recursive closure is a reference cycle: emptied, its scope is freed now, not by the collector)
    order = sorted(names)
    if order != list(names):
        sorted_index = {name: i for i, name in enumerate(order)}
        renumber = [sorted_index[name] for name in names]
        for i in ref_args:
            code[i] = renumber[code[i]]
    return np.array(code, dtype=np.int32), root, order, embedded


@functools.lru_cache(maxsize=4096)
def _ranges_node(ranges, characters: bool) -> tuple[int, ...]:
    """An X_RANGES node: a character set's UTF-8 byte-range sequences (a byte set's ranges)."""
    seqs = utf8_ranges(ranges) if characters else [[r] for r in ranges]
    node = [X_RANGES, len(seqs)]
    for sq in seqs:
        node.append(len(sq))
        for lo, hi in sq:
            node += (lo, hi)
    return tuple(node)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _rows(table: np.ndarray) -> np.ndarray:
    """A table as C reads it: int32, row after row (held by the caller while C runs)."""
    return np.ascontiguousarray(table, dtype=np.int32)


def _bytes(accept: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(accept, dtype=np.uint8)


def _seconds(deadline: float) -> float:
    return max(0.0, min(deadline - time.monotonic(), 1e9))


_CLASS_OF = native.DfaStruct.class_of.offset


def _raise(error: int):
    """The error of a csrc/dfa.h result that could not be built."""
    if error == native.DFA_TOO_MANY:
        raise GrammarError(f"grammar too large: more than {MAX_DFA_STATES} states in one rule; simplify it")
    if error == native.DFA_TOO_MANY_NFA:
        raise GrammarError(f"grammar too large: more than {MAX_NFA_STATES} automaton states; lower the "
                           "repetition bounds (maxLength, maxItems, {m,n}) or simplify the schema")
    if error == native.DFA_TIMEOUT:
        raise GrammarError("grammar compilation timed out")
    raise MemoryError("the grammar's automaton construction ran out of memory")


def _refuse(e):
    """What encoding meets where an expression should be (the extension calls it too)."""
    if type(e) is Anchor:
        raise GrammarError(f"regex anchor '{e.kind}' is only supported at the start or end of a pattern")
    raise TypeError(f"not a grammar expression: {e!r}")


@functools.cache
def _expr_module():
    ext = native.expr_module()
    if ext is not None:
        ext.configure((Lit, Chars, ByteSet, Seq, Alt, Repeat, Ref, Intersect, Diff, Machine), _ranges_node, _refuse)
    return ext


def _result(result: int, names: list[str]):
    """A RuleDFA copied out of a csrc/dfa.h result, which is then freed."""
    if not result:
        raise MemoryError("the grammar's automaton construction ran out of memory")
    try:
        r = native.DfaStruct.from_address(result)
        if r.error:
            _raise(r.error)
        n, nc, k = r.n, r.n_calls, r.k
        table = np.empty((n, 256), dtype=np.int32)
        accept = np.empty(n, dtype=bool)  # (C's bytes are 0 or 1)
        columns = np.empty((n, k), dtype=np.int32)
        column = np.empty(256, dtype=np.uint8)
        memmove = ctypes.memmove
        memmove(table.ctypes.data, r.table, 1024 * n)
        memmove(accept.ctypes.data, r.accept, n)
        memmove(columns.ctypes.data, r.ctab, 4 * n * k)
        memmove(column.ctypes.data, result + _CLASS_OF, 256)
        # (a state without calls holds the one empty tuple: a list per state was as many objects
        # for the collector to scan in every rule automaton kept)
        calls: list = [()] * n
        if nc:
            flat = np.empty(3 * nc, dtype=np.int32)
            ctypes.memmove(flat.ctypes.data, r.calls, flat.nbytes)
            flat = flat.tolist()
            rows: dict[int, list] = {}
            for i in range(0, 3 * nc, 3):
                rows.setdefault(flat[i], []).append((names[flat[i + 1]], flat[i + 2]))
            for s, row in rows.items():
                calls[s] = tuple(row)
        return RuleDFA(table, calls, accept, (columns, column), tuple(names))
    finally:
        native.load().agentkv_dfa_free(result)
