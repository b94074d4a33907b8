"""The string rules of the JSON Schema converter: a string schema's language (lengths, pattern,
format, a `not` of listed strings), and lengths of any size.

A bound of n characters written as one chain of states would take a chain position per character,
each as many states as a JSON string character has (escapes, UTF-8 sequences): ~30,000 states for
1,000 characters. Above MAX_LENGTH_BOUND (256) a string of lo..hi characters is written as whole
blocks of BLOCK characters (one rule, called once per block, so its states are shared by every
block) followed by a remainder of fewer than BLOCK: a length L is L // BLOCK blocks and L % BLOCK
characters, so the bound is exact and the automaton grows with hi / BLOCK. The parser's
configuration holds the block count below the position inside the block.

A pattern or format with a length bound needs the product of its automaton with the count: the
bound is dropped where the pattern's strings are never that long, and relaxed (validated after
generation) where it is above MAX_LENGTH_BOUND or the product could grow past PRODUCT_BUDGET.
"""

from __future__ import annotations

from agentkv.errors import GrammarError
from agentkv.grammar.automata.dfa import minimal_dfa
from agentkv.grammar.automata.expr import NOTHING, Diff, Intersect, Ref, Repeat, alt, lit, seq
from agentkv.grammar.automata.regex import search_expr
from agentkv.grammar.schema.merge import excluded_strings
from agentkv.grammar.schema.objects import escape_all, schema_count
from agentkv.grammar.schema.validation import CHECKED_FORMATS
from agentkv.grammar.schema.values import (
    FORMATS,
    MAX_LENGTH_BOUND,
    STRING_CHAR,
    format_expr,
    length_bounded,
    string_body,
)

BLOCK = 32
# A length bound beside a pattern is the product of the pattern's automaton with a count of
# characters: up to (pattern states) x (bound + 1) states. Above this, the bound is validated after
# generation instead (one such rule took 13 s to pass 200,000 states).
PRODUCT_BUDGET = 100_000


class StringRules:
    """Mixed into the converter (schema/json_schema.py), which supplies rules, prefix, relax, deadline and
    string_expr."""

    def string_language(self, schema: dict, ptr: str):
        """The decoded strings a string schema allows, as a character-level expression (None: any):
        lengths, patterns and format intersected, less the strings a `not` lists."""
        lo = schema_count(schema, "minLength", ptr) or 0
        hi = schema_count(schema, "maxLength", ptr)
        patterns = schema.get("pattern")
        patterns = [] if patterns is None else [patterns] if isinstance(patterns, str) else list(patterns)
        constraints = []
        for p in patterns:
            try:
                constraints.append(search_expr(p, f"{ptr}/pattern"))
            except GrammarError as e:  # lookbehind, a backreference, \p{..}: validated after instead
                self.relax("pattern", f"{ptr}/pattern", str(e).rsplit(" (at ", 1)[0])
        fmt = schema.get("format")
        if fmt is not None:
            if fmt in FORMATS:
                constraints.append(format_expr(fmt, f"{ptr}/format"))
            else:  # any string in the grammar: checked after (regex, hostname), else an annotation (2020-12)
                self.relax("format", f"{ptr}/format", f"format '{fmt}' is not in the grammar (it holds "
                           f"{', '.join(sorted(FORMATS))}); replace it with a 'pattern' to enforce it",
                           checked=fmt in CHECKED_FORMATS)
        if lo or hi is not None:
            lo, hi = self.bounds_beside(constraints or [length_bounded(0, None, ptr)], lo, hi, ptr)
        if lo or hi is not None:
            constraints.append(length_bounded(lo, hi, ptr))
        excluded = excluded_strings(schema.get("not"))
        if not constraints and not excluded:
            return None
        body = constraints[0] if constraints else length_bounded(0, None, ptr)
        for c in constraints[1:]:
            body = Intersect(body, c)
        return Diff(body, alt(*map(lit, excluded))) if excluded else body

    def t_string(self, schema, ptr):
        excluded = excluded_strings(schema.get("not"))
        if "pattern" not in schema and "format" not in schema and not excluded:
            lo, hi = schema_count(schema, "minLength", ptr) or 0, schema_count(schema, "maxLength", ptr)
            if lo > MAX_LENGTH_BOUND or (hi or 0) > MAX_LENGTH_BOUND:
                return self.string_expr(self.long_string_body(lo, hi))
            return self.string_expr(string_body(lo, hi, ptr))
        lang = self.string_language(schema, ptr)
        return self.string_expr(string_body() if lang is None else escape_all(lang))

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

    def bounds_beside(self, constraints: list, lo: int, hi: int | None, ptr: str) -> tuple[int, int | None]:
        """The length bounds to intersect with a pattern's or format's language (`constraints`): a
        maxLength its strings never reach is dropped (the automaton is smaller without it); a bound
        above MAX_LENGTH_BOUND, or one whose product with the language's automaton could pass
        PRODUCT_BUDGET states, is relaxed (validated after generation)."""
        lang = minimal_dfa(_intersection(constraints), self.deadline)
        states = len(lang.accept)
        if hi is not None:
            longest = _longest(lang)
            if longest is not None and longest <= hi:
                hi = None  # vacuous
            elif hi > MAX_LENGTH_BOUND or states * (hi + 1) > PRODUCT_BUDGET:
                self.relax("maxLength", f"{ptr}/maxLength", _too_many("maxLength", hi, states))
                hi = None
        if lo > MAX_LENGTH_BOUND or states * (lo + 1) > PRODUCT_BUDGET:
            self.relax("minLength", f"{ptr}/minLength", _too_many("minLength", lo, states))
            lo = 0
        return lo, hi


def _too_many(keyword: str, bound: int, states: int) -> str:
    if bound > MAX_LENGTH_BOUND:
        return (f"{keyword} {bound} beside a pattern or format is above the {MAX_LENGTH_BOUND} characters a "
                "grammar counts exactly")
    return (f"{keyword} {bound} beside a pattern or format of {states} states would need up to "
            f"{states * (bound + 1):,} states counted together (the budget is {PRODUCT_BUDGET:,})")


def _intersection(constraints: list):
    lang = constraints[0]
    for c in constraints[1:]:
        lang = Intersect(lang, c)
    return lang


def _longest(d) -> int | None:
    """The most bytes a string of `d`'s language takes (None: unbounded); a bound on characters at
    or above it holds for every string."""
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
        for t in d.targets(s):
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
    for s in range(len(d.accept)):
        for t in d.targets(s):
            back.setdefault(t, []).append(s)
    live = {s for s, a in enumerate(d.accept) if a}
    todo = list(live)
    while todo:
        for p in back.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    return live
