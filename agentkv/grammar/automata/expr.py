"""Grammar expressions: the one intermediate form every front end (regex, JSON Schema, Lark) lowers to.

A grammar is a set of named rules, each an expression over literal bytes, Unicode character sets,
sequence, alternation, bounded repetition and references to other rules. References are what make
a grammar context-free; everything else is regular and is compiled to one DFA per rule.
Nodes are frozen and hashable so identical sub-expressions share work.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


@dataclass(frozen=True)
class Lit:
    """A literal byte string."""

    data: bytes


@dataclass(frozen=True)
class Chars:
    """One Unicode scalar value from a set, as UTF-8 (sorted, disjoint, non-adjacent ranges)."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ByteSet:
    """One raw byte from a set (for grammars over bytes rather than characters)."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    items: tuple


@dataclass(frozen=True)
class Repeat:
    item: object
    min: int
    max: int | None  # None: unbounded


@dataclass(frozen=True)
class Ref:
    """A call to another rule of the grammar."""

    name: str


@dataclass(frozen=True)
class Intersect:
    """Strings both sides match (both sides regular: no rule references)."""

    left: object
    right: object


@dataclass(frozen=True)
class Diff:
    """Strings `left` matches and `right` does not (both sides regular)."""

    left: object
    right: object


@dataclass(frozen=True)
class Machine:
    """A call-free language given as its DFA over bytes (state 0 starts; rows of (lo, hi, target)
    byte intervals): what no expression writes compactly, such as the texts of multiples of a
    number (schema/numbers.py)."""

    trans: tuple[tuple[tuple[int, int, int], ...], ...]
    accept: tuple[bool, ...]

    @classmethod
    def build(cls, dfa: tuple) -> Machine:
        trans, accept = dfa
        return cls(tuple(tuple(row) for row in trans), tuple(bool(a) for a in accept))


@dataclass(frozen=True)
class Anchor:
    """`^` or `$` in a regex; only allowed where the front end can resolve it (see automata/regex.py)."""

    kind: str


Expr = Lit | Chars | ByteSet | Seq | Alt | Repeat | Ref | Intersect | Diff | Machine | Anchor


def _cached_hash(self) -> int:
    """A composite node's hash, computed once: nodes are the keys of the rule-automata cache at
    every level, and a tree shares subtrees, so hashing it afresh each time can take time
    exponential in its depth. Not pickled: a string's hash differs between processes."""
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash((type(self).__name__, *(v for k, v in self.__dict__.items() if k not in _DERIVED)))
        object.__setattr__(self, "_hash", h)
    return h


_DERIVED = ("_hash", "_refs")  # kept on a node once computed; not fields


def _state_without_hash(self) -> dict:
    return {k: v for k, v in self.__dict__.items() if k not in _DERIVED}


for _cls in (Seq, Alt, Repeat, Intersect, Diff, Machine):
    _cls.__hash__ = _cached_hash
    _cls.__getstate__ = _state_without_hash

EMPTY = Seq(())
NOTHING = Alt(())


def normalize_ranges(ranges) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def chars(*ranges) -> Chars:
    """`chars((0x30, 0x39), "_")`: ranges as pairs or single characters."""
    flat = []
    for r in ranges:
        if isinstance(r, str):
            flat.append((ord(r), ord(r)))
        else:
            flat.append(tuple(ord(x) if isinstance(x, str) else x for x in r))
    return Chars(normalize_ranges(flat))


def complement(ranges) -> tuple[tuple[int, int], ...]:
    """Every Unicode scalar value not in `ranges` (surrogates are never characters)."""
    out, nxt = [], 0
    for lo, hi in normalize_ranges(list(ranges) + [SURROGATES]):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


def subtract(ranges, removed) -> tuple[tuple[int, int], ...]:
    keep = complement(removed)
    out = []
    for lo, hi in ranges:
        for klo, khi in keep:
            a, b = max(lo, klo), min(hi, khi)
            if a <= b:
                out.append((a, b))
    return normalize_ranges(out)


def lit(text: str | bytes) -> Lit:
    return Lit(text.encode() if isinstance(text, str) else text)


def seq(*items) -> Expr:
    flat = []
    for it in items:
        kind = type(it)
        if kind is Seq:
            flat.extend(it.items)
        elif kind is Alt and not it.items:  # (NOTHING; `==` was two dataclass comparisons an item)
            return NOTHING
        else:
            flat.append(it)
    merged: list = []
    for it in flat:  # adjacent literals become one (smaller automata, same language)
        if merged and type(it) is Lit and type(merged[-1]) is Lit:
            merged[-1] = Lit(merged[-1].data + it.data)
        else:
            merged.append(it)
    return merged[0] if len(merged) == 1 else Seq(tuple(merged))


def alt(*items) -> Expr:
    flat, seen = [], set()
    for it in items:
        for sub in it.items if isinstance(it, Alt) else (it,):
            # Leaves dedup by value; composite nodes by identity (hashing a shared DAG is exponential).
            key = sub if isinstance(sub, (Lit, Chars, ByteSet, Ref)) else id(sub)
            if key not in seen:
                seen.add(key)
                flat.append(sub)
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def opt(item) -> Expr:
    return Repeat(item, 0, 1)


def star(item) -> Expr:
    return Repeat(item, 0, None)


def plus(item) -> Expr:
    return Repeat(item, 1, None)


def refs(expr) -> frozenset[str]:
    """Names of the rules `expr` calls (kept on a composite node: linking and building both ask)."""
    if isinstance(expr, (Seq, Alt, Repeat, Intersect, Diff)):
        hit = expr.__dict__.get("_refs")
        if hit is None:
            hit = frozenset(_refs(expr))
            object.__setattr__(expr, "_refs", hit)
        return hit
    return frozenset(_refs(expr))


def renamed(expr, prefix: str, memo: dict | None = None):
    """`expr` with every rule it calls named `prefix + name` (a grammar's rules moved into another's)."""
    if not refs(expr):
        return expr
    memo = {} if memo is None else memo
    hit = memo.get(id(expr))
    if hit is None:
        if isinstance(expr, Ref):
            hit = Ref(prefix + expr.name)
        elif isinstance(expr, Seq):
            hit = Seq(tuple(renamed(e, prefix, memo) for e in expr.items))
        elif isinstance(expr, Alt):
            hit = Alt(tuple(renamed(e, prefix, memo) for e in expr.items))
        else:  # Repeat (Intersect and Diff are regular: they call no rule)
            hit = Repeat(renamed(expr.item, prefix, memo), expr.min, expr.max)
        memo[id(expr)] = hit
    return hit


def _refs(expr) -> set[str]:
    out: set[str] = set()
    stack, seen = [expr], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:  # a shared subtree once
            continue
        seen.add(id(e))
        if isinstance(e, Ref):
            out.add(e.name)
        elif isinstance(e, (Seq, Alt)):
            stack.extend(e.items)
        elif isinstance(e, Repeat):
            stack.append(e.item)
        elif isinstance(e, (Intersect, Diff)):
            stack.extend((e.left, e.right))
    return out
