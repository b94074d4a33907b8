"""Expressions for JSON scalars: strings (escaped as JSON writes them), numbers with exact bounds, formats.

Strings are written compactly the way `json.dumps(..., ensure_ascii=False)` writes them: characters
raw, except `"`, `\\` and control characters, which take their short escape (`\\n`) or `\\u00XX`.
Unconstrained strings also accept any `\\uXXXX` escape outside the surrogate range (a surrogate pair
would count as two characters against minLength/maxLength, so it is not offered).
"""

from __future__ import annotations

from agentkv.errors import GrammarError
from agentkv.grammar.expr import (
    EMPTY,
    Alt,
    ByteSet,
    Chars,
    Lit,
    Repeat,
    Seq,
    alt,
    chars,
    complement,
    lit,
    opt,
    seq,
    star,
    subtract,
)
from agentkv.grammar.regex import match_expr

HEX = chars(("0", "9"), ("a", "f"), ("A", "F"))
DIGIT = chars(("0", "9"))
NONZERO = chars(("1", "9"))
SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
NEEDS_ESCAPE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
# \uXXXX escapes of BMP scalar values only (no surrogate halves).
U_ESCAPE = seq(lit("\\u"), alt(seq(chars(("0", "9"), ("a", "c"), ("A", "C"), ("e", "f"), ("E", "F")), HEX, HEX, HEX),
                              seq(chars("d", "D"), chars(("0", "7")), HEX, HEX)))
STRING_CHAR = alt(Chars(complement(NEEDS_ESCAPE)),
                  seq(lit("\\"), chars('"', "\\", "/", "b", "f", "n", "r", "t")), U_ESCAPE)
MAX_LENGTH_BOUND = 1000


def escaped(e):
    """Rewrite a character-level expression so it matches the JSON-string-body encoding of its strings."""
    if isinstance(e, Chars):
        safe = subtract(e.ranges, NEEDS_ESCAPE)
        out = [Chars(safe)] if safe else []
        for lo, hi in e.ranges:
            for lo2, hi2 in NEEDS_ESCAPE:
                for cp in range(max(lo, lo2), min(hi, hi2) + 1):
                    if cp in SHORT_ESCAPES:
                        out.append(lit(SHORT_ESCAPES[cp]))
                    else:
                        out.append(seq(lit("\\u00"), chars(str(cp >> 4)), chars(*{f"{cp & 15:x}", f"{cp & 15:X}"})))
        return alt(*out)
    if isinstance(e, Lit):
        text = e.data.decode("utf-8")
        return seq(*[escaped(chars(c)) for c in text]) if any(ord(c) < 0x20 or c in '"\\' for c in text) else e
    if isinstance(e, Seq):
        return seq(*[escaped(x) for x in e.items])
    if isinstance(e, Alt):
        return alt(*[escaped(x) for x in e.items])
    if isinstance(e, Repeat):
        return Repeat(escaped(e.item), e.min, e.max)
    if isinstance(e, ByteSet):
        raise GrammarError("byte-level expressions cannot appear in a JSON string")
    return e


def _check_length_bounds(min_len: int, max_len: int | None, where: str | None) -> None:
    for name, v in (("maxLength", max_len), ("minLength", min_len)):
        if v is not None and v > MAX_LENGTH_BOUND:
            raise GrammarError(f"{name} {v} is above the {MAX_LENGTH_BOUND} agentkv enforces exactly; "
                               "lower it or drop it", where)


def string_body(min_len: int = 0, max_len: int | None = None, where: str | None = None):
    _check_length_bounds(min_len, max_len, where)
    if max_len is not None and max_len < min_len:
        return Alt(())
    return Repeat(STRING_CHAR, min_len, max_len)


def length_bounded(min_len: int, max_len: int | None, where: str | None):
    """Any characters (before escaping), with a length bound; used to intersect with a pattern or format."""
    _check_length_bounds(min_len, max_len, where)
    return Repeat(Chars(complement([])), min_len, max_len)


# -- numbers ------------------------------------------------------------------------------------

NATURAL = alt(lit("0"), seq(NONZERO, star(DIGIT)))
INTEGER = seq(opt(lit("-")), NATURAL)
FRACTION = seq(lit("."), Repeat(DIGIT, 1, None))
EXPONENT = seq(chars("e", "E"), opt(chars("+", "-")), Repeat(DIGIT, 1, None))
NUMBER = seq(INTEGER, opt(FRACTION), opt(EXPONENT))


def _same_length(lo: str, hi: str):
    """Digit strings of len(lo) between lo and hi inclusive (equal lengths)."""
    if not lo:
        return EMPTY
    if lo.count("0") == len(lo) and hi.count("9") == len(hi):
        # every digit string of this length: stops the two-sided split below from recursing into
        # both halves at every digit (2^n calls for 0..9007199254740991, zod's int bounds)
        return Repeat(DIGIT, len(lo), len(lo))
    if lo[0] == hi[0]:
        return seq(lit(lo[0]), _same_length(lo[1:], hi[1:]))
    n = len(lo) - 1
    parts = [seq(lit(lo[0]), _same_length(lo[1:], "9" * n))]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(seq(chars((chr(ord(lo[0]) + 1), chr(ord(hi[0]) - 1))), Repeat(DIGIT, n, n)))
    parts.append(seq(lit(hi[0]), _same_length("0" * n, hi[1:])))
    return alt(*parts)


def natural_range(lo: int, hi: int | None):
    """Canonical decimal naturals (no leading zeros) in [lo, hi]; hi None is unbounded."""
    if hi is not None and hi < lo:
        return Alt(())
    parts = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for n in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = min(hi, 10 ** n - 1) if hi is not None else 10 ** n - 1
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    if hi is None:
        parts.append(seq(NONZERO, Repeat(DIGIT, len(str(lo)), None)))
    return alt(*parts)


def integer_range(lo: int | None, hi: int | None):
    if lo is None and hi is None:
        return INTEGER
    parts = []
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo or 0, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        mag_lo = max(-hi, 1) if hi is not None else 1
        parts.append(seq(lit("-"), natural_range(mag_lo, -lo if lo is not None else None)))
    return alt(*parts)


def _decimal_magnitude(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool):
    """Non-negative decimals (no exponent) m with lo <(=) m <(=) hi, for integer lo and hi."""
    any_frac = opt(FRACTION)
    zero_frac = opt(seq(lit("."), Repeat(lit("0"), 1, None)))
    nonzero_frac = seq(lit("."), star(DIGIT), NONZERO, star(DIGIT))
    parts = []
    first_open = lo + 1
    parts.append(seq(natural_range(lo, lo), nonzero_frac if lo_excl else any_frac))
    if hi is None:
        parts.append(seq(natural_range(first_open, None), any_frac))
    elif hi > lo:
        if hi - 1 >= first_open:
            parts.append(seq(natural_range(first_open, hi - 1), any_frac))
        if not hi_excl:
            parts.append(seq(natural_range(hi, hi), zero_frac))
    elif hi == lo:
        if lo_excl or hi_excl:
            return Alt(())
        return seq(natural_range(lo, lo), zero_frac)
    else:
        return Alt(())
    return alt(*parts)


def number_range(lo, lo_excl: bool, hi, hi_excl: bool, where: str | None):
    """JSON numbers within bounds. Bounds must be whole numbers; bounded numbers are written without exponent."""
    if lo is None and hi is None:
        return NUMBER
    for v in (lo, hi):
        if v is not None and float(v) != int(v):
            raise GrammarError(f"numeric bound {v} on a number: agentkv enforces whole-number bounds only", where)
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        a, a_excl = (0, False) if lo is None or lo < 0 else (lo, lo_excl)
        parts.append(_decimal_magnitude(a, a_excl, hi, hi_excl))
    if lo is None or lo < 0:
        # -m with lo <= -m <= hi  <=>  max(-hi, 0) <= m <= -lo ; zero itself is written unsigned
        m_lo, m_lo_excl = (0, True) if hi is None or hi >= 0 else (-hi, hi_excl)
        m_hi = None if lo is None else -lo
        parts.append(seq(lit("-"), _decimal_magnitude(m_lo, m_lo_excl, m_hi, lo_excl)))
    return alt(*parts)


# -- formats ------------------------------------------------------------------------------------

# RFC 3339 full-date: each month's days, February 29 only in leap years (divisible by 4, and
# centuries only when divisible by 400).
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = (r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)")
# RFC 3339 time. A leap second (:60) is only valid where the time is 23:59:60 in UTC; the grammar
# offers it as 23:59:60 with a zero offset (telling other offsets apart would take ~1,440 states).
_OFFSET = r"([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_TIME = (rf"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?{_OFFSET}"
         r"|23:59:60(\.[0-9]+)?([Zz]|[+-]00:00))")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16 = r"[0-9a-fA-F]{1,4}"
_IPV4 = rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}"
_LS32 = rf"({_H16}:{_H16}|{_IPV4})"
_IPV6 = "|".join([
    rf"({_H16}:){{6}}{_LS32}", rf"::({_H16}:){{5}}{_LS32}", rf"({_H16})?::({_H16}:){{4}}{_LS32}",
    rf"(({_H16}:){{0,1}}{_H16})?::({_H16}:){{3}}{_LS32}", rf"(({_H16}:){{0,2}}{_H16})?::({_H16}:){{2}}{_LS32}",
    rf"(({_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}", rf"(({_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(({_H16}:){{0,5}}{_H16})?::{_H16}", rf"(({_H16}:){{0,6}}{_H16})?::",
])
# RFC 3986, appendix A, as written there (the whole grammar is regular).
_PCT = r"%[0-9A-Fa-f]{2}"
_UNRESERVED_SUB = r"[A-Za-z0-9._~!$&'()*+,;=-]"  # unreserved and sub-delims
_PCHAR = rf"({_UNRESERVED_SUB}|{_PCT}|[:@])"
_SEGMENT, _SEGMENT_NZ = rf"{_PCHAR}*", rf"{_PCHAR}+"
_SEGMENT_NZ_NC = rf"({_UNRESERVED_SUB}|{_PCT}|@)+"
_IP_LITERAL = rf"\[({_IPV6}|v[0-9A-Fa-f]+\.({_UNRESERVED_SUB}|:)+)\]"
_AUTHORITY = rf"(({_UNRESERVED_SUB}|{_PCT}|:)*@)?({_IP_LITERAL}|({_UNRESERVED_SUB}|{_PCT})*)(:[0-9]*)?"
_PATH_ABEMPTY = rf"(/{_SEGMENT})*"
_PATH_ABSOLUTE = rf"/({_SEGMENT_NZ}(/{_SEGMENT})*)?"
_QUERY_FRAGMENT = rf"(\?({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?"
_URI = (rf"[A-Za-z][A-Za-z0-9+.-]*:(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ}(/{_SEGMENT})*)?"
        rf"{_QUERY_FRAGMENT}")
_RELATIVE_REF = (rf"(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ_NC}(/{_SEGMENT})*)?"
                 rf"{_QUERY_FRAGMENT}")
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    # An address with one @, a dotted domain, no spaces or quotes (RFC 5321 quoted local parts are not offered).
    "email": r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
             r"@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*",
    "uri": _URI,
    "uri-reference": rf"{_URI}|{_RELATIVE_REF}",
}


def format_expr(name: str, where: str | None):
    if name not in FORMATS:
        raise GrammarError(f"format '{name}' is not enforced by agentkv (supported: {', '.join(sorted(FORMATS))}); "
                           "drop it or replace it with a 'pattern'", where)
    return match_expr(FORMATS[name], where)
