"""A rule's DFA as every stage holds it (a byte table, rule calls, accepting states), the bounds on
its size, and characters as UTF-8 byte ranges: the definitions the builders in C (dfa_native.py)
and in Python (dfa_python.py, minimize.py) and the cache over them (dfa.py) share.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from agentkv.grammar.automata.expr import subtract

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


@functools.lru_cache(maxsize=4096)
def utf8_ranges(ranges) -> list[list[tuple[int, int]]]:
    """A character set's UTF-8 encodings as byte-range sequences."""
    seqs = []
    for lo, hi in subtract(ranges, []):
        seqs.extend(utf8_sequences(lo, hi))
    return seqs


@dataclass
class RuleDFA:
    table: np.ndarray  # [n, 256] int32: the next state per byte, -1 for none
    calls: list  # per state: its (rule, return state) pairs, by rule (a list or tuple; empty: none)
    accept: np.ndarray  # [n] bool
    # (columns [n, k] int32, column [256] uint8): `table` as byte classes, `columns[:, column]`.
    # Where the builder gave them (C), the cache keeps them as they are instead of finding them.
    classes: tuple | None = None
    rules: tuple | None = None  # the names of the rules its expression calls, sorted (linking reads them)

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


def rows_table(rows) -> np.ndarray:
    """Rows of (lo, hi, target) byte intervals -> an [n, 256] int32 table (-1: no transition)."""
    table = np.full((len(rows), 256), -1, dtype=np.int32)
    for s, row in enumerate(rows):
        for lo, hi, t in row:
            table[s, lo:hi + 1] = t
    return table
