"""Regex -> grammar expression, for the dialect JSON Schema `pattern` and Lark terminals use.

Supported: literals, escapes (`\\d \\w \\s` and negations, `\\n \\t \\xHH \\uHHHH \\u{H..}`), classes
with ranges and negation, `.`, groups (capturing, `(?:...)`, named), alternation, quantifiers
`* + ? {n} {n,} {n,m}` (lazy forms match the same language), and `^`/`$` at the edges. In a JSON
Schema `pattern`, lookaheads right after a leading `^` (`^(?!\\.)`, `^(?!(?:meta|local)$).*`): a
lookahead at the start of the string is a regular condition on the whole string, so `^(?!A)B` is the
difference of B's strings and those that start with a match of A (intersection for `(?=A)`). Other
lookaround, backreferences, word boundaries and Unicode property classes raise `GrammarError` rather
than being approximated: a pattern we cannot enforce exactly is never enforced loosely.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from agentkv.errors import GrammarError
from agentkv.grammar.automata.expr import (
    Alt,
    Anchor,
    Chars,
    Diff,
    Expr,
    Intersect,
    Lit,
    Repeat,
    Seq,
    alt,
    complement,
    normalize_ranges,
    seq,
    subtract,
)

DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ECMA-262 WhiteSpace and LineTerminator.
SPACE = normalize_ranges([(9, 13), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                          (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                          (0xFEFF, 0xFEFF)])
DOT = complement([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
SIMPLE_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
MAX_REPEAT = 10_000
LOOKAROUND = "uses lookaround (not supported here: only a lookahead right after a leading '^' of a JSON Schema pattern)"


@dataclass(frozen=True)
class Look:
    """`(?=expr)` or (negative) `(?!expr)` at the start of a top-level branch (see search_expr)."""

    negative: bool
    expr: Expr


class _Parser:
    def __init__(self, pattern: str, where: str | None, lookahead: bool = False):
        self.p, self.i, self.where = pattern, 0, where
        self.lookahead = lookahead  # take lookaheads right after a leading '^' (search_expr)
        self.depth = 0

    def error(self, what: str) -> GrammarError:
        caret = " " * self.i + "^"
        return GrammarError(f"regex {what} at offset {self.i}:\n  {self.p}\n  {caret}", self.where)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < len(self.p) else ""

    def take(self) -> str:
        c = self.peek()
        if not c:
            raise self.error("ends early")
        self.i += 1
        return c

    def parse(self) -> Expr:
        e = self.alternation()
        if self.i != len(self.p):
            raise self.error("has an unbalanced ')'")
        return e

    def alternation(self) -> Expr:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else Alt(tuple(branches))

    def sequence(self) -> Expr:
        items = []
        while self.peek() and self.peek() not in "|)":
            if (self.lookahead and self.depth == 0 and self.p.startswith(("(?=", "(?!"), self.i)
                    and items and items[0] == Anchor("^") and all(isinstance(x, Look) for x in items[1:])):
                items.append(self.look())
            else:
                items.append(self.quantified())
        return seq(*items) if items else Seq(())

    def look(self) -> Look:
        negative = self.p[self.i + 2] == "!"
        self.i += 3
        e = self.group_body()
        if self.peek() in ("*", "+", "?") or self.peek() == "{" and self._bounds_ahead():
            raise self.error("quantifies a lookahead")
        return Look(negative, e)

    def quantified(self) -> Expr:
        atom = self.atom()
        while True:
            c = self.peek()
            if c == "*":
                lo, hi = 0, None
            elif c == "+":
                lo, hi = 1, None
            elif c == "?":
                lo, hi = 0, 1
            elif c == "{" and self._bounds_ahead():
                lo, hi = self._bounds()
                self.i -= 1  # _bounds consumed the closing brace; the shared step below re-takes it
            else:
                return atom
            self.i += 1
            if isinstance(atom, Anchor):
                raise self.error("quantifies an anchor")
            if self.peek() == "?":
                self.i += 1  # lazy: same language
            elif self.peek() == "+":
                raise self.error("uses a possessive quantifier (not supported)")
            atom = Repeat(atom, lo, hi)

    def _bounds_ahead(self) -> bool:
        j = self.i + 1
        while j < len(self.p) and (self.p[j].isdigit() or self.p[j] == ","):
            j += 1
        return j < len(self.p) and self.p[j] == "}" and self.p[self.i + 1].isdigit()

    def _bounds(self) -> tuple[int, int | None]:
        end = self.p.index("}", self.i)
        body = self.p[self.i + 1:end]
        self.i = end + 1
        lo_s, comma, hi_s = body.partition(",")
        lo = int(lo_s)
        hi = (int(hi_s) if hi_s else None) if comma else lo
        if hi is not None and hi < lo:
            raise self.error(f"has a bound {{{body}}} whose maximum is below its minimum")
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"repeats {{{body}}} beyond the {MAX_REPEAT} limit")
        return lo, hi

    def atom(self) -> Expr:
        c = self.take()
        if c == "(":
            return self.group()
        if c == "[":
            return Chars(self.char_class())
        if c == ".":
            return Chars(DOT)
        if c == "^":
            return Anchor("^")
        if c == "$":
            return Anchor("$")
        if c == "\\":
            ranges = self.escape(in_class=False)
            return Chars(ranges) if isinstance(ranges, tuple) else ranges
        if c in "*+?":
            self.i -= 1
            raise self.error(f"has nothing to repeat before '{c}'")
        if c == ")":
            raise self.error("has an unbalanced ')'")
        return Lit(c.encode())

    def group(self) -> Expr:
        if self.peek() == "?":
            kind = self.peek(1)
            if kind == ":":
                self.i += 2
            elif kind == "<" and self.peek(2) not in "=!" or kind == "P" and self.peek(2) == "<":
                self.i = self.p.index(">", self.i) + 1
            elif kind in "=!" or (kind == "<" and self.peek(2) in "=!"):
                raise self.error(LOOKAROUND)
            else:
                raise self.error(f"uses the group flag '(?{kind}' (not supported)")
        return self.group_body()

    def group_body(self) -> Expr:
        """The alternation inside a group, through its ')' (one level deeper: no lookahead there)."""
        self.depth += 1
        e = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.error("misses a ')'")
        self.i += 1
        return e

    def escape(self, in_class: bool):
        c = self.take()
        if c in CLASS_ESCAPES:
            return CLASS_ESCAPES[c]
        if c.lower() in CLASS_ESCAPES:
            return complement(CLASS_ESCAPES[c.lower()])
        if c in SIMPLE_ESCAPES and not (c == "0" and self.peek().isdigit()):
            return ((SIMPLE_ESCAPES[c],) * 2,)
        if c == "x":
            return self._hex(2)
        if c == "u":
            if self.peek() == "{":
                end = self.p.index("}", self.i)
                cp = int(self.p[self.i + 1:end], 16)
                self.i = end + 1
                return ((cp, cp),)
            return self._hex(4)
        if c == "c" and self.peek().isalpha():
            cp = ord(self.take().upper()) - 64
            return ((cp, cp),)
        if c == "b" and in_class:
            return ((8, 8),)
        if c.isdigit() or c == "k":
            raise self.error("uses a backreference (not supported)")
        if c in "bB":
            raise self.error(f"uses the word boundary \\{c} (not supported)")
        if c in "pP":
            raise self.error(f"uses the Unicode property class \\{c} (not supported)")
        if c.isalnum():
            raise self.error(f"uses the unknown escape \\{c}")
        return ((ord(c), ord(c)),)

    def _hex(self, n: int):
        digits = self.p[self.i:self.i + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error("has a malformed hex escape")
        self.i += n
        cp = int(digits, 16)
        if 0xD800 <= cp <= 0xDBFF and self.p[self.i:self.i + 2] == "\\u":  # surrogate pair
            low = int(self.p[self.i + 2:self.i + 6], 16)
            if 0xDC00 <= low <= 0xDFFF:
                self.i += 6
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
        return ((cp, cp),)

    def char_class(self) -> tuple[tuple[int, int], ...]:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            lo_set = self.escape(in_class=True) if c == "\\" else ((ord(c), ord(c)),)
            single = len(lo_set) == 1 and lo_set[0][0] == lo_set[0][1]
            if self.peek() == "-" and self.peek(1) not in ("]", "") and single:
                self.i += 1
                h = self.take()
                hi_set = self.escape(in_class=True) if h == "\\" else ((ord(h), ord(h)),)
                if len(hi_set) != 1 or hi_set[0][0] != hi_set[0][1]:
                    raise self.error("has a class range ending in a class escape")
                lo, hi = lo_set[0][0], hi_set[0][0]
                if hi < lo:
                    raise self.error("has a class range out of order")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_set)
        out = normalize_ranges(ranges)
        return complement(out) if negate else subtract(out, [])


ANY = Repeat(Chars(complement([])), 0, None)


def parse_regex(pattern: str, where: str | None = None) -> Expr:
    """Parse `pattern` to an expression that may still hold `Anchor` nodes."""
    return _Parser(pattern, where).parse()


def _strip_edges(e: Expr, where: str | None) -> tuple[Expr, bool, bool]:
    """Remove a leading `^` and a trailing `$` of one branch; say which were there."""
    items = list(e.items) if isinstance(e, Seq) else [e]
    start = bool(items) and items[0] == Anchor("^")
    if start:
        items.pop(0)
    end = bool(items) and items[-1] == Anchor("$")
    if end:
        items.pop()
    body = seq(*items) if items else Seq(())
    _reject_anchors(body, where)
    return body, start, end


def _reject_anchors(e: Expr, where: str | None) -> None:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Anchor):
            raise GrammarError(f"regex anchor '{x.kind}' in the middle of a pattern is not supported", where)
        if isinstance(x, (Seq, Alt)):
            stack.extend(x.items)
        elif isinstance(x, Repeat):
            stack.append(x.item)


def _branches(e: Expr) -> list[Expr]:
    """Top-level alternatives, looking through a group that is the whole pattern (`^(a|b)$` stays whole)."""
    if isinstance(e, Alt):
        return list(e.items)
    return [e]


def search_expr(pattern: str, where: str | None = None) -> Expr:
    """The strings that *contain* a match (JSON Schema `pattern` semantics): `.*` where unanchored."""
    out = []
    for branch in _branches(_Parser(pattern, where, lookahead=True).parse()):
        looks = []
        if isinstance(branch, Seq) and branch.items[:1] == (Anchor("^"),):
            rest = list(branch.items[1:])
            while rest and isinstance(rest[0], Look):
                looks.append(rest.pop(0))
            branch = seq(Anchor("^"), *rest)
        body, start, end = _strip_edges(branch, where)
        e = seq(*([] if start else [ANY]), body, *([] if end else [ANY]))
        for look in looks:
            # At the start of the string, (?=A) holds where the string starts with a match of A.
            starts_with = alt(*(seq(b, *([] if e_ else [ANY]))
                                for b, _, e_ in (_strip_edges(x, where) for x in _branches(look.expr))))
            e = Diff(e, starts_with) if look.negative else Intersect(e, starts_with)
        out.append(e)
    return alt(*out)


@functools.lru_cache(maxsize=1024)  # (a terminal every part of a composed grammar repeats is parsed once)
def match_expr(pattern: str, where: str | None = None) -> Expr:
    """The strings that match `pattern` entirely (Lark terminals, `compile_regex`)."""
    out = []
    for branch in _branches(parse_regex(pattern, where)):
        body, _, _ = _strip_edges(branch, where)
        out.append(body)
    return alt(*out)


__all__ = ["match_expr", "parse_regex", "search_expr"]
