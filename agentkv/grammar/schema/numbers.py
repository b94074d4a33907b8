"""JSON numbers as expressions: exact integer and decimal bounds, and `multipleOf`.

Bounds may be any decimal (`minimum: 0.5`, `exclusiveMaximum: 99.99`): a bounded number is written
without an exponent, and its text is compared with the bound digit by digit (the integer part as a
range of naturals, the fraction as a language of digit strings above or below the bound's). A
`multipleOf` step p / 10^s is a remainder automaton over the digits (`Machine`): the value times
10^s must be a whole multiple of p, so past s fraction digits only zeros follow. `-0` is not
offered where a number is bounded.

For generation, numbers may also be held to a number of digits (`number_shape`; llama.cpp's bound:
16 integer digits, 16 fraction digits), so that a model cannot run a number on until max_tokens; a
bound the schema itself gives is never cut by it (the caps grow to hold the schema's own bounds).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from math import gcd

from agentkv.errors import GrammarError
from agentkv.grammar.automata.expr import EMPTY, Alt, Intersect, Machine, Repeat, alt, chars, lit, opt, seq, star

DIGIT = chars(("0", "9"))
NONZERO = chars(("1", "9"))
NATURAL = alt(lit("0"), seq(NONZERO, star(DIGIT)))
INTEGER = seq(opt(lit("-")), NATURAL)
FRACTION = seq(lit("."), Repeat(DIGIT, 1, None))
EXPONENT = seq(chars("e", "E"), opt(chars("+", "-")), Repeat(DIGIT, 1, None))
NUMBER = seq(INTEGER, opt(FRACTION), opt(EXPONENT))
# The digits a generated number may have where its schema leaves it unbounded (JsonSchemaConverter's
# number_digits, SamplingParams.number_digits): llama.cpp's bound.
NUMBER_DIGITS = 16
# A multipleOf whose step needs more remainders than this is not enforced by the grammar (its
# automaton has about this many states per fraction digit).
MAX_MULTIPLE_STATES = 4096


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


def number_shape(int_digits: int, frac_digits: int, exp_digits: int, integer: bool):
    """Numbers of at most `int_digits` integer digits, `frac_digits` fraction digits and `exp_digits`
    exponent digits (integers: no fraction, no exponent)."""
    natural = alt(lit("0"), seq(NONZERO, Repeat(DIGIT, 0, int_digits - 1)))
    if integer:
        return seq(opt(lit("-")), natural)
    return seq(opt(lit("-")), natural, opt(seq(lit("."), Repeat(DIGIT, 1, frac_digits))),
               opt(seq(chars("e", "E"), opt(chars("+", "-")), Repeat(DIGIT, 1, exp_digits))))


def held_to_digits(numbers, digits: int, integer: bool, exact: list[Decimal]):
    """`numbers` held to `digits` integer, fraction and exponent digits (number_shape), the caps grown
    to hold each of `exact` (the schema's bounds and multipleOf step), and a fraction digit past them."""
    whole = frac = 0
    for v in exact:
        i, f = _split(abs(v))
        whole, frac = max(whole, len(str(i))), max(frac, len(f))
    shape = number_shape(max(digits, whole), max(digits, frac + 1), digits, integer)
    return shape if numbers is NUMBER or numbers is INTEGER else Intersect(numbers, shape)


# -- decimal bounds ----------------------------------------------------------------------------------


def decimal(v, where: str | None) -> Decimal:
    """A bound as an exact decimal: a float by its shortest repr (0.1 is 0.1, not 0.1000000000000000055...)."""
    try:
        d = Decimal(repr(v)) if isinstance(v, float) else Decimal(v)
    except (InvalidOperation, TypeError, ValueError):
        raise GrammarError(f"{v!r} is not a number", where) from None
    if not d.is_finite():
        raise GrammarError(f"{v!r} is not a finite number", where)
    return d


def _split(d: Decimal) -> tuple[int, str]:
    """A non-negative decimal as (integer part, fraction digits without trailing zeros)."""
    whole = int(d)
    frac = format(d - whole, "f").partition(".")[2].rstrip("0")
    return whole, frac


def _fraction(frac_digits):
    """The text after the integer part for a set of fraction digit strings: `.` and the digits."""
    return seq(lit("."), frac_digits)


def _frac_above(f: str, inclusive: bool):
    """The fraction text (possibly absent) of values whose fraction is >= (or >) 0.f."""
    if not f:
        return opt(FRACTION) if inclusive else _fraction(seq(star(DIGIT), NONZERO, star(DIGIT)))
    parts = []
    for k, d in enumerate(f):
        if d != "9":
            parts.append(seq(lit(f[:k]), chars((chr(ord(d) + 1), "9")), star(DIGIT)))
    parts.append(seq(lit(f), star(DIGIT)) if inclusive else seq(lit(f), star(DIGIT), NONZERO, star(DIGIT)))
    return _fraction(alt(*parts))


def _frac_below(f: str, inclusive: bool):
    """The fraction text (possibly absent) of values whose fraction is <= (or <) 0.f."""
    if not f:
        return opt(_fraction(Repeat(lit("0"), 1, None))) if inclusive else Alt(())
    parts = [lit(f[:k]) for k in range(1, len(f))]  # a proper prefix: less, f having no trailing zeros
    for k, d in enumerate(f):
        if d != "0":
            parts.append(seq(lit(f[:k]), chars(("0", chr(ord(d) - 1))), star(DIGIT)))
    if inclusive:
        parts.append(seq(lit(f), star(lit("0"))))
    return opt(_fraction(alt(*parts)))


def _magnitude(lo: Decimal, lo_excl: bool, hi: Decimal | None, hi_excl: bool):
    """Non-negative decimals m (no exponent) with lo <(=) m <(=) hi; 0 <= lo."""
    li, lf = _split(lo)
    if hi is None:
        return alt(seq(natural_range(li, li), _frac_above(lf, not lo_excl)),
                   seq(natural_range(li + 1, None), opt(FRACTION)))
    if hi < lo or hi == lo and (lo_excl or hi_excl):
        return Alt(())
    hi_i, hf = _split(hi)
    if li == hi_i:
        both = Intersect(_frac_above(lf, not lo_excl), _frac_below(hf, not hi_excl))
        return seq(natural_range(li, li), both)
    parts = [seq(natural_range(li, li), _frac_above(lf, not lo_excl))]
    if hi_i - 1 >= li + 1:
        parts.append(seq(natural_range(li + 1, hi_i - 1), opt(FRACTION)))
    parts.append(seq(natural_range(hi_i, hi_i), _frac_below(hf, not hi_excl)))
    return alt(*parts)


def number_range(lo, lo_excl: bool, hi, hi_excl: bool, where: str | None):
    """JSON numbers within bounds (any decimals); bounded numbers are written without an exponent."""
    if lo is None and hi is None:
        return NUMBER
    lo = None if lo is None else decimal(lo, where)
    hi = None if hi is None else decimal(hi, where)
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        a, a_excl = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_excl)
        parts.append(_magnitude(a, a_excl, hi, hi_excl))
    if lo is None or lo < 0:
        # -m with lo <= -m <= hi  <=>  max(-hi, 0) <= m <= -lo ; zero itself is written unsigned
        m_lo, m_lo_excl = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, hi_excl)
        parts.append(seq(lit("-"), _magnitude(m_lo, m_lo_excl, None if lo is None else -lo, lo_excl)))
    return alt(*parts)


# -- multipleOf --------------------------------------------------------------------------------------


def multiple_of(step, integer: bool, where: str | None):
    """Numbers (integers only where `integer`) without an exponent that are multiples of `step`;
    None where the step needs more than MAX_MULTIPLE_STATES remainders (the caller relaxes it)."""
    d = decimal(step, where)
    if d <= 0:
        raise GrammarError(f"multipleOf must be greater than 0, not {step!r}", where)
    sign, digits, exp = d.normalize().as_tuple()
    p = int("".join(map(str, digits)))
    s = max(0, -exp)
    if exp > 0:
        p *= 10 ** exp
    if integer:  # an integer v is a multiple of p / 10^s where v * 10^s is, i.e. v = 0 mod p / gcd(p, 10^s)
        p, s = p // gcd(p, 10 ** s), 0
    if p * (s + 2) > MAX_MULTIPLE_STATES:
        return None
    return Machine.build(_remainder_dfa(p, s, integer))


def _remainder_dfa(p: int, s: int, integer: bool):
    """(transitions, accepting) of the texts -?(0|[1-9][0-9]*)(.[0-9]+)? whose value times 10^s is a
    multiple of p. States: 0 start, 1 after '-', then per remainder r: int(r), after '0' (r = 0),
    dot(r), frac(r, c) for c = 1..s fraction digits read, and zeros (past s digits: only 0)."""
    states: dict[tuple, int] = {}
    rows: list[list[tuple[int, int, int]]] = []
    accept: list[bool] = []

    def state(key) -> int:
        if key not in states:
            states[key] = len(rows)
            rows.append([])
            kind, r, c = key
            done = kind in ("int", "zero", "frac", "tail")
            accept.append(done and (r * 10 ** (s - c)) % p == 0)
            todo.append(key)
        return states[key]

    def digit_edges(key, nxt) -> list[tuple[int, int, int]]:
        return [(0x30 + d, 0x30 + d, state(nxt(d))) for d in range(10)]

    todo: list[tuple] = []
    state(("start", 0, 0))
    while todo:
        key = todo.pop()
        kind, r, c = key
        edges: list[tuple[int, int, int]] = []
        if kind in ("start", "minus"):
            if kind == "start":
                edges.append((0x2D, 0x2D, state(("minus", 0, 0))))
            edges.append((0x30, 0x30, state(("zero", 0, 0))))
            edges += [(0x30 + d, 0x30 + d, state(("int", d % p, 0))) for d in range(1, 10)]
        elif kind == "int":
            edges += digit_edges(key, lambda d, r=r: ("int", (10 * r + d) % p, 0))
        if kind in ("int", "zero") and not integer:
            edges.append((0x2E, 0x2E, state(("dot", r, 0))))
        if kind == "dot" and s == 0:  # a step of whole numbers: the fraction is zeros
            edges.append((0x30, 0x30, state(("tail", r, 0))))
        elif kind == "dot" or kind == "frac" and c < s:
            edges += digit_edges(key, lambda d, r=r, c=c: ("frac", (10 * r + d) % p, c + 1))
        elif kind in ("frac", "tail"):
            edges.append((0x30, 0x30, state(("tail", r, c))))
        rows[states[key]] = sorted(edges)
    return rows, tuple(accept)  # (byte by byte: minimal_dfa merges adjacent intervals to one class)
