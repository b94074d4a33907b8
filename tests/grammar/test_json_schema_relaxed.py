"""What the grammar enforces exactly that it used to refuse (decimal bounds, decimal `multipleOf`,
long length bounds, the formats Pydantic emits), and what it relaxes instead: each relaxed keyword
listed with its pointer, the check after generation catching what the grammar let through, and a
strict compiler refusing all of it."""

import json
import random

import pytest

from agentkv.grammar import GrammarError
from agentkv.grammar.schema.validation import SchemaCheck
from agentkv.grammar.schema.walk import find_serialization
from tests.grammar.test_json_schema_suite import assert_like_jsonschema, assert_values
from tests.grammar_helpers import BYTE_COMPILER, STRICT_BYTE_COMPILER, accepts

NUMBERS = [0, 1, -1, 2, 0.5, -0.5, 0.25, 0.49, 0.51, 1.5, 2.5, 3.75, 99.99, 100, 100.01, -99.99, 7, 21, 0.1, 0.3,
           0.01, 0.001, 12.34, 12.345, -12.34, 1000, 999.99, -1000]  # (not 0.07: jsonschema's float division)


@pytest.mark.parametrize("schema", [
    {"type": "number", "minimum": 0.5},
    {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 99.99},
    {"type": "number", "minimum": -99.99, "maximum": 0.25},
    {"type": "number", "exclusiveMaximum": -0.5},
    {"type": "number", "minimum": 0.49, "maximum": 0.51},
    {"type": "number", "multipleOf": 0.01},
    {"type": "number", "multipleOf": 0.5, "minimum": -1, "maximum": 3.75},
    {"type": "number", "multipleOf": 2.5},
    {"type": "number", "multipleOf": 0.3},
    {"type": "integer", "multipleOf": 7},
    {"type": "integer", "multipleOf": 0.5},
    {"type": "integer", "minimum": 0.5, "maximum": 99.99},
    {"allOf": [{"multipleOf": 0.5}, {"multipleOf": 0.3}], "type": "number"},
])
def test_decimal_bounds_and_multiples_like_jsonschema(schema):
    assert_like_jsonschema(schema, NUMBERS)
    assert not BYTE_COMPILER.compile_json_schema(schema).relaxed
    STRICT_BYTE_COMPILER.compile_json_schema(schema)  # exact: a strict compiler takes it too


def test_decimal_text_forms():
    """Fractions compare digit by digit: trailing zeros, long fractions and the bound itself."""
    g = BYTE_COMPILER.compile_json_schema({"type": "number", "exclusiveMinimum": 0.5, "maximum": 1.25})
    for good in ["0.50001", "0.6", "1", "1.0", "1.25", "1.2500", "1.2499999"]:
        assert accepts(g, good), good
    for bad in ["0.5", "0.50", "0.500", "1.25001", "1.3", "2", "-0.7", "5e-1"]:
        assert not accepts(g, bad), bad
    m = BYTE_COMPILER.compile_json_schema({"type": "number", "multipleOf": 0.05})
    for good in ["0", "0.05", "1.1", "1.10", "1.1000", "-3.45", "20"]:
        assert accepts(m, good), good
    for bad in ["0.01", "1.11", "1.1001", "0.051"]:
        assert not accepts(m, bad), bad


def _string(n: int, rng: random.Random) -> str:
    return "".join(rng.choice(["a", " ", "é", "\n", '"', "語", "🙂", "\\"]) for _ in range(n))


@pytest.mark.parametrize("lo,hi", [(0, 1040), (1030, 1100), (1035, None), (1024, 1056), (1001, 1001)])
def test_long_length_bounds_counted_in_blocks(lo, hi):
    """Lengths above 1,000 characters are exact (escapes and multi-byte characters count one each)."""
    schema = {"type": "string", "maxLength": hi, "minLength": lo} if hi is not None else \
        {"type": "string", "minLength": lo}
    g = BYTE_COMPILER.compile_json_schema(schema)
    assert not g.relaxed and g.num_states < 5000
    rng = random.Random(lo)
    for n in sorted({0, 1, lo - 1, lo, lo + 1, 1023, 1024, 1025, 1039, 1040, 1041, 1056, 1057, 1099, 1100, 1101}):
        if n < 0:
            continue
        text = json.dumps(_string(n, rng), ensure_ascii=False)
        assert accepts(g, text) == (n >= lo and (hi is None or n <= hi)), n


def test_long_bound_beside_a_pattern():
    """Dropped where the pattern's strings are never that long; relaxed (and checked after) otherwise."""
    short = BYTE_COMPILER.compile_json_schema({"type": "string", "format": "uuid", "maxLength": 4096})
    assert not short.relaxed
    url = BYTE_COMPILER.compile_json_schema({"type": "string", "format": "uri", "maxLength": 2083})
    assert [(r.pointer, r.keyword, r.checked) for r in url.relaxed] == [("#/maxLength", "maxLength", True)]
    with pytest.raises(GrammarError, match="maxLength 2083"):
        STRICT_BYTE_COMPILER.compile_json_schema({"type": "string", "format": "uri", "maxLength": 2083})


# winget's package identifier: four dotted parts of up to 32 characters (131 in all), at most 128.
PACKAGE_ID = {"type": "string", "maxLength": 128,
              "pattern": r'^[^\.\s\\/:\*\?"<>\|\x01-\x1f]{1,32}(\.[^\.\s\\/:\*\?"<>\|\x01-\x1f]{1,32}){1,3}$'}


def test_bound_beside_a_large_pattern_is_checked_after():
    """The product of that pattern (2,180 states) with a count to 128 once took 13 s to pass 200,000
    states; the bound is relaxed instead, and the check after holds it."""
    g = BYTE_COMPILER.compile_json_schema(PACKAGE_ID)
    assert [(r.pointer, r.keyword, r.checked) for r in g.relaxed] == [("#/maxLength", "maxLength", True)]
    check = SchemaCheck(PACKAGE_ID)
    fits, too_long = ".".join(["a" * 32] * 3 + ["b" * 29]), ".".join(["a" * 32] * 4)
    assert len(fits) == 128 and len(too_long) == 131
    for value in (fits, too_long, "Microsoft.Edge"):
        assert find_serialization(g, value) is not None
    assert check.error(fits) is None and check.error("Microsoft.Edge") is None and check.error(too_long)
    assert find_serialization(g, "a..b") is None  # the pattern itself stays in the grammar
    # a bound the pattern's strings never reach is dropped, not counted: the same grammar as without it
    short = {"type": "string", "pattern": "^[a-z]{1,8}$"}
    assert BYTE_COMPILER.compile_json_schema({**short, "maxLength": 9}).num_states == \
        BYTE_COMPILER.compile_json_schema(short).num_states
    assert_values({**short, "maxLength": 3, "minLength": 2}, ["ab", "abc"], ["a", "abcd", "AB"])


@pytest.mark.parametrize("fmt,good,bad", [
    ("duration", ["P1D", "PT1H30M", "PT0.5S", "P1Y2M3DT4H5M6S", "P2W", "P0D"],
     ["P", "PT", "P1W1D", "PT1.5H", "P1.5D", "1D", "P1DT", "PT1234567890S", "PT1.1234567891S"]),
    ("time", ["10:00:00.123456789Z"], ["10:00:00.1234567891Z"]),
    ("byte", ["", "aGVsbG8=", "aGVsbA==", "YWJj"], ["aGVsbG8", "a", "aGVsbB==", "a-_="]),
    ("base64url", ["", "aGVsbG8=", "aGVsbG8", "a-_w"], ["a", "a+/=", "aGVsbB=="]),
    ("binary", ["", "any text\n\u2028"], []),
])
def test_formats_pydantic_writes(fmt, good, bad):
    assert_values({"type": "string", "format": fmt}, good, bad)


RELAXED = [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, [("#/uniqueItems", "uniqueItems", True)],
     ["a", "b"], ["a", "a"]),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}, [("#/oneOf", "oneOf", True)], -1, 2),
    ({"type": "string", "format": "hostname"}, [("#/format", "format", True)], "a.example", "x..y"),
    ({"type": "string", "format": "color"}, [("#/format", "format", False)], "x..y", None),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}},
     [("#/properties/a/pattern", "pattern", True)], {"a": "xy"}, {"a": "y"}),
    ({"type": "array", "contains": {"const": 1}}, [("#/contains", "contains", True)], [1, 2], [2]),
    ({"not": {"type": "string", "minLength": 2}}, [("#/not", "not", True)], "a", "ab"),
    ({"type": "object", "unevaluatedProperties": False, "properties": {"a": {}}},
     [("#/unevaluatedProperties", "unevaluatedProperties", True)], {"a": 1}, {"b": 1}),
    ({"if": {"minLength": 2}, "then": {"pattern": "^a"}}, [("#/if", "if", True)], "ab", "bb"),
]


@pytest.mark.parametrize("schema,relaxed,good,bad", RELAXED)
def test_relaxed_keywords_are_listed_checked_after_and_refused_when_strict(schema, relaxed, good, bad):
    g = BYTE_COMPILER.compile_json_schema(schema)
    assert [(r.pointer, r.keyword, r.checked) for r in g.relaxed] == relaxed
    assert g.needs_validation == any(r[2] for r in relaxed)
    check = SchemaCheck(schema)
    if good is not None:
        assert find_serialization(g, good) is not None and check.error(good) is None
    if bad is not None:  # the grammar lets it through; the check after does not
        assert find_serialization(g, bad) is not None and check.error(bad) is not None
    with pytest.raises(GrammarError):
        STRICT_BYTE_COMPILER.compile_json_schema(schema)


def test_probes_do_not_relax():
    """Telling oneOf branches apart reads their patterns; a pattern it cannot read makes it judge the
    branches as written, and the pattern is relaxed where its branch compiles, at that pointer."""
    schema = {"oneOf": [{"type": "string", "pattern": "(?<=a)b"}, {"type": "string", "maxLength": 1}]}
    g = BYTE_COMPILER.compile_json_schema(schema)
    assert sorted((r.pointer, r.keyword) for r in g.relaxed) == [("#/oneOf", "oneOf"), ("#/oneOf/0/pattern", "pattern")]


def test_probes_read_refs_whose_targets_merge_only_by_relaxing():
    """yamllint: a oneOf branch is a $ref with an `if` beside it, and the target has its own `if`;
    the two merge only by relaxing one, which a probe may not do: the branches are then judged as
    written (possibly overlapping), not refused."""
    schema = {"oneOf": [{"type": "string"},
                        {"$ref": "#/$defs/a", "if": {"properties": {"k": {"const": 2}}}, "then": {"required": ["m"]}}],
              "$defs": {"a": {"type": "object", "if": {"properties": {"k": {"const": 1}}},
                              "then": {"required": ["n"]}}}}
    g = BYTE_COMPILER.compile_json_schema(schema)
    assert ("#/oneOf", "oneOf") in [(r.pointer, r.keyword) for r in g.relaxed]
    check = SchemaCheck(schema)
    for good in ["x", {"k": 1, "n": 0}, {"k": 2, "m": 0}, {"k": 3}]:
        assert check.error(good) is None and find_serialization(g, good) is not None, good
    assert check.error({"k": 2}) is not None and check.error({"k": 1}) is not None
    with pytest.raises(GrammarError):
        STRICT_BYTE_COMPILER.compile_json_schema(schema)


def test_relaxed_keywords_inside_lark_json_blocks_are_listed():
    g = BYTE_COMPILER.compile_lark('start: "x" %json {"type": "array", "uniqueItems": true}')
    assert [r.keyword for r in g.relaxed] == ["uniqueItems"]


def test_check_takes_decimal_multiples_exactly():
    """jsonschema alone divides floats (0.07 / 0.01 = 7.000000000000001: refused); the check does not."""
    check = SchemaCheck({"type": "number", "multipleOf": 0.01})
    assert check.error(0.07) is None and check.error(1.15) is None and check.error(0.071) is not None


def test_check_reads_given_documents_and_ecma_patterns():
    doc = {"$id": "https://example.com/d.json", "$defs": {"n": {"type": "integer"}}}
    check = SchemaCheck({"$ref": "https://example.com/d.json#/$defs/n"}, {"https://example.com/d.json": doc})
    assert check.error(3) is None and "integer" in check.error("x")
    letters = SchemaCheck({"type": "string", "pattern": "^\\p{L}+$"})
    assert letters.error("héllo") is None and letters.error("h1") is not None
    # a document not given: the compiler refuses it (either way); the check fails a value reaching it
    missing = SchemaCheck({"type": "object", "properties": {"a": {"$ref": "https://example.com/missing.json"}}})
    assert missing.error({}) is None and "pass that document" in missing.error({"a": 1})
    with pytest.raises(GrammarError, match="documents="):
        BYTE_COMPILER.compile_json_schema({"$ref": "https://example.com/missing.json"})


@pytest.mark.parametrize("pattern,good,bad", [
    (r"^\d+$", ["12"], ["\u0661\u0662", "1\u0663"]),  # ECMA's \d is ASCII; Python's takes any digit
    (r"^\w+$", ["a_1"], ["\u00e9"]),
    (r"^\s$", [" ", "\u00a0", "\u2028", "\ufeff"], ["x"]),
    (r"^.$", ["x", "\u00e9"], ["\n", "\r", "\u2028"]),
    (r"^[^\d]$", ["x"], ["5"]),
    # ECMA's [^] is any character, [] none; the grammar's reader relaxes them, the check holds them
    (r"^a[^]b$", ["a\nb"], ["ab"]),
    (r"^[]a$", [], ["a", "]a"]),
])
def test_check_reads_patterns_as_ecma_does_like_the_grammar(pattern, good, bad):
    schema = {"type": "string", "pattern": pattern}
    g, check = BYTE_COMPILER.compile_json_schema(schema), SchemaCheck(schema)
    for v in good:
        assert check.error(v) is None and find_serialization(g, v) is not None, v
    for v in bad:
        assert check.error(v) is not None, v
        assert find_serialization(g, v) is None or [r.keyword for r in g.relaxed] == ["pattern"], v


def test_pydantic_constraints_beyond_its_plain_schema():
    """What a model's validation refuses, its grammar refuses: Decimal digits, HttpUrl schemes, year 0,
    leap seconds, oversized durations."""
    import datetime
    import decimal
    from typing import Annotated

    from pydantic import Field, HttpUrl, ValidationError, create_model

    cases = [
        (
            Annotated[decimal.Decimal, Field(max_digits=5, decimal_places=2)],
            ["1.5", "-999.99", "123.45", '"12.30"', "0"], ["1234.5", "0.001", "1e2", '"1.234"', '"1000"']),
        (
            Annotated[decimal.Decimal, Field(max_digits=3)], ["999", "0.12", "1.5", '"9.99"'],
            ["1000", "0.1234", '"12.34"']),
        (HttpUrl, ['"https://example.com/a"', '"http://x.org"'],
         ['"ftp://x.org"', '"mailto:a@b.c"', '"http://"', '"https://?q"']),
        (datetime.datetime, ['"2020-01-01T00:00:00Z"'], ['"0000-01-01T00:00:00Z"', '"2016-12-31T23:59:60Z"']),
        (datetime.date, ['"0001-01-01"'], ['"0000-01-01"']),
        (datetime.timedelta, ['"P999999D"', '"PT1.5S"'], ['"P489916829M"', '"P1234567D"']),
    ]
    for annotation, good, bad in cases:
        model = create_model("M", v=(annotation, ...))
        g = BYTE_COMPILER.compile_json_schema(model)
        for text in good:
            model.model_validate_json(f'{{"v":{text}}}')  # the model takes it...
            assert accepts(g, f'{{"v":{text}}}'), (annotation, text)  # ...and so does its grammar
        for text in bad:  # (most the model refuses too; 1e2 and P1234567D it takes, in forms not offered)
            assert not accepts(g, f'{{"v":{text}}}'), (annotation, text)
    for annotation, text in [(datetime.date, '"0000-01-01"'), (datetime.timedelta, '"P489916829M"'),
                             (HttpUrl, '"mailto:a@b.c"'), (datetime.datetime, '"2016-12-31T23:59:60Z"')]:
        with pytest.raises(ValidationError):  # what the plain schema allowed, and the model refuses
            create_model("M", v=(annotation, ...)).model_validate_json(f'{{"v":{text}}}')
