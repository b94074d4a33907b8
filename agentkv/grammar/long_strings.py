"""Strings with a length bound above MAX_LENGTH_BOUND (1,000 characters): counted in blocks.

A bound of n characters written as one chain of states would take a chain position per character,
each as many states as a JSON string character has (escapes, UTF-8 sequences): ~30,000 states for
1,000 characters. Above that bound a string of lo..hi characters is written as whole blocks of
BLOCK characters (one rule, called once per block, so its states are shared by every block) followed
by a remainder of fewer than BLOCK: a length L is L // BLOCK blocks and L % BLOCK characters, so
the bound is exact and the automaton grows with hi / BLOCK. The parser's configuration holds the
block count below the position inside the block.

A pattern or format with such a bound would need the product of its automaton with the count; the
bound is dropped where the pattern's strings are never that long, and relaxed otherwise (validated
after generation).
"""

from __future__ import annotations

from agentkv.grammar.dfa import minimal_dfa
from agentkv.grammar.expr import NOTHING, Intersect, Ref, Repeat, alt, seq
from agentkv.grammar.json_values import MAX_LENGTH_BOUND, STRING_CHAR

BLOCK = 32


class LongStrings:
    """Mixed into the converter (json_schema.py), which supplies rules, prefix, relax and deadline."""

    def long_string_body(self, lo: int, hi: int | None):
        """The JSON string body of lo..hi characters (hi None: at least lo)."""
        if hi is not None and hi < lo:
            return NOTHING
        name = f"{self.prefix}json:block{BLOCK}"
        if name not in self.rules:
            self.rules[name] = Repeat(STRING_CHAR, BLOCK, BLOCK)
        block = Ref(name)
        q_lo, r_lo = divmod(lo, BLOCK)
        if hi is None:
            return seq(Repeat(block, q_lo, None), Repeat(STRING_CHAR, r_lo, BLOCK - 1)) if r_lo == 0 else \
                alt(seq(Repeat(block, q_lo, q_lo), Repeat(STRING_CHAR, r_lo, BLOCK - 1)),
                    seq(Repeat(block, q_lo + 1, None), Repeat(STRING_CHAR, 0, BLOCK - 1)))
        q_hi, r_hi = divmod(hi, BLOCK)
        if q_lo == q_hi:
            return seq(Repeat(block, q_lo, q_lo), Repeat(STRING_CHAR, r_lo, r_hi))
        parts = [seq(Repeat(block, q_lo, q_lo), Repeat(STRING_CHAR, r_lo, BLOCK - 1))]
        if q_hi - 1 >= q_lo + 1:
            parts.append(seq(Repeat(block, q_lo + 1, q_hi - 1), Repeat(STRING_CHAR, 0, BLOCK - 1)))
        parts.append(seq(Repeat(block, q_hi, q_hi), Repeat(STRING_CHAR, 0, r_hi)))
        return alt(*parts)

    def long_bounds(self, constraints: list, lo: int, hi: int | None, ptr: str) -> tuple[int, int | None]:
        """The length bounds to intersect with a pattern's or format's language (`constraints`) where
        one bound is above MAX_LENGTH_BOUND: kept where small, dropped where the language's strings
        are never longer (its automaton has no cycle and no longer path), else relaxed."""
        keep_lo = lo if lo <= MAX_LENGTH_BOUND else 0
        keep_hi = hi if hi is None or hi <= MAX_LENGTH_BOUND else None
        if hi is not None and keep_hi is None:
            longest = _longest(constraints, self.deadline)
            if longest is None or longest > hi:
                self.relax("maxLength", f"{ptr}/maxLength", f"maxLength {hi} beside a pattern or format is above "
                           f"the {MAX_LENGTH_BOUND} characters a grammar counts exactly")
        if lo > MAX_LENGTH_BOUND:
            self.relax("minLength", f"{ptr}/minLength", f"minLength {lo} beside a pattern or format is above the "
                       f"{MAX_LENGTH_BOUND} characters a grammar counts exactly")
        return keep_lo, keep_hi


def _longest(constraints: list, deadline: float) -> int | None:
    """The most bytes a string of the constraints' language takes (None: unbounded or no constraint);
    a bound on characters at or above it holds for every string."""
    if not constraints:
        return None
    lang = constraints[0]
    for c in constraints[1:]:
        lang = Intersect(lang, c)
    d = minimal_dfa(lang, deadline)
    live = _live(d)
    memo: dict[int, int | None] = {}
    on_path: set[int] = set()

    def depth(s: int) -> int | None:  # longest path to acceptance; None on a cycle
        if s in memo:
            return memo[s]
        if s in on_path:
            return None
        on_path.add(s)
        best: int | None = 0
        for _, _, t in d.trans[s]:
            if t in live:
                sub = depth(t)
                if sub is None:
                    best = None
                    break
                best = max(best, sub + 1)
        on_path.discard(s)
        memo[s] = best
        return best

    try:
        return depth(0)
    except RecursionError:  # a very long chain: treat as unbounded
        return None


def _live(d) -> set[int]:
    """States from which an accepting state is reachable."""
    back: dict[int, list[int]] = {}
    for s, row in enumerate(d.trans):
        for _, _, t in row:
            back.setdefault(t, []).append(s)
    live = {s for s, a in enumerate(d.accept) if a}
    todo = list(live)
    while todo:
        for p in back.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    return live
