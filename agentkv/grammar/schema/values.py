"""Expressions for JSON strings (escaped as JSON writes them) and string formats (numbers: schema/numbers.py).

Strings are written compactly the way `json.dumps(..., ensure_ascii=False)` writes them: characters
raw, except `"`, `\\` and control characters, which take their short escape (`\\n`) or `\\u00XX`.
Unconstrained strings also accept any `\\uXXXX` escape outside the surrogate range (a surrogate pair
would count as two characters against minLength/maxLength, so it is not offered).
"""

from __future__ import annotations

import functools

from agentkv.errors import GrammarError
from agentkv.grammar.automata.expr import (
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
    seq,
    subtract,
)
from agentkv.grammar.automata.regex import match_expr

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
MAX_LENGTH_BOUND = 256  # longer bounds: counted in blocks (schema/strings.py), or relaxed beside a pattern


def _escape_of(cp: int):
    """How JSON writes the character `cp` that needs an escape: its short escape, or \\u00XX (either case)."""
    if cp in SHORT_ESCAPES:
        return lit(SHORT_ESCAPES[cp])
    return seq(lit("\\u00"), chars(str(cp >> 4)), chars(*{f"{cp & 15:x}", f"{cp & 15:X}"}))


ESCAPES = {cp: _escape_of(cp) for lo, hi in NEEDS_ESCAPE for cp in range(lo, hi + 1)}


@functools.lru_cache(maxsize=4096)  # (a string language recurs: the same names, formats and patterns across schemas)
def escaped(e):
    """Rewrite a character-level expression so it matches the JSON-string-body encoding of its strings."""
    if isinstance(e, Chars):
        safe = subtract(e.ranges, NEEDS_ESCAPE)
        out = [Chars(safe)] if safe else []
        for lo, hi in e.ranges:
            for lo2, hi2 in NEEDS_ESCAPE:
                out.extend(ESCAPES[cp] for cp in range(max(lo, lo2), min(hi, hi2) + 1))
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


# -- formats ------------------------------------------------------------------------------------

# RFC 3339 full-date: each month's days, February 29 only in leap years (divisible by 4, and
# centuries only when divisible by 400).
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = (r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)")
# RFC 3339 time. A leap second (:60) is only valid where the time is 23:59:60 in UTC; the grammar
# offers it as 23:59:60 with a zero offset (telling other offsets apart would take ~1,440 states).
_OFFSET = r"([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
# Fractional seconds: at most 9 digits (nanoseconds), as real values have; unbounded, a small model
# writes digits until max_tokens.
_FRAC = r"(\.[0-9]{1,9})?"
_TIME = (rf"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{_FRAC}{_OFFSET}"
         rf"|23:59:60{_FRAC}([Zz]|[+-]00:00))")
# RFC 3339 appendix A durations (`P1DT2H`, `PT1.5S`, `P2W`), each number at most 9 digits (Python's
# timedelta holds up to 999,999,999 days); seconds may take a fraction, as Pydantic writes them.
_DUR_N = r"[0-9]{1,9}"
_DUR_SECOND = rf"{_DUR_N}{_FRAC}S"
_DUR_MINUTE = rf"{_DUR_N}M({_DUR_SECOND})?"
_DUR_TIME = rf"T({_DUR_N}H({_DUR_MINUTE})?|{_DUR_MINUTE}|{_DUR_SECOND})"
_DUR_DATE = rf"({_DUR_N}D|{_DUR_N}M({_DUR_N}D)?|{_DUR_N}Y({_DUR_N}M({_DUR_N}D)?)?)({_DUR_TIME})?"
# Base64 (RFC 4648): whole quanta of 4 characters, and a last one of 2 or 3 whose unused bits are
# zero (strict decoders refuse others), padded with `=` (standard) or optionally (url-safe).
def _base64(alphabet: str, optional_padding: bool) -> str:
    two, three = r"[AQgw]", r"[AEIMQUYcgkosw048]"
    pad2, pad1 = ("(==)?", "(=)?") if optional_padding else ("==", "=")
    return rf"({alphabet}{{4}})*({alphabet}{two}{pad2}|{alphabet}{{2}}{three}{pad1})?"


_BASE64 = _base64(r"[A-Za-z0-9+/]", False)
_BASE64URL = _base64(r"[A-Za-z0-9_-]", True)
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
    "duration": rf"P({_DUR_DATE}|{_DUR_TIME}|{_DUR_N}W)",
    "binary": r"[\s\S]*",  # OpenAPI's raw bytes, which Pydantic reads from any string
    "byte": _BASE64,  # OpenAPI's base64
    "base64": _BASE64,
    "base64url": _BASE64URL,  # Pydantic's bytes with ser_json_bytes="base64"
}


def format_expr(name: str, where: str | None):
    """A format agentkv enforces (FORMATS), as a character-level expression; the converter treats
    any other format as an annotation (schema/json_schema.py)."""
    return match_expr(FORMATS[name], where)
