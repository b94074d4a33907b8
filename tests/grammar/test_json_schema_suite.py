"""The official JSON Schema test suite (draft 2020-12) as a ratcheted baseline.

Every case whose schema compiles is checked by walking the instance through the compiled grammar
(in whichever key order the grammar writes) and, where the grammar relaxed a keyword, by the check
after generation (schema/validation.py). A case passes when valid instances are accepted and invalid ones
refused. `tests/data/json_schema_suite_passing.txt` lists the passing cases: losing one fails this
test; gaining some is reported, and `AGENTKV_UPDATE_RATCHET=1` rewrites the file. An invalid
instance accepted is never tolerated, recorded or not. A strict compiler must refuse, not relax.
"""

import itertools
import json
from pathlib import Path

import pytest

from agentkv.grammar import GrammarError
from agentkv.grammar.schema.validation import SchemaCheck
from agentkv.grammar.schema.walk import SearchBudgetExceeded, find_serialization
from tests.conftest import shared_data
from tests.grammar_helpers import BYTE_COMPILER, STRICT_BYTE_COMPILER, check_ratchet

RATCHET = Path(__file__).parents[1] / "data" / "json_schema_suite_passing.txt"


def run_suite(root: Path, compiler=BYTE_COMPILER) -> tuple[set[str], list[str], int]:
    passing, bad, total = set(), [], 0
    for path in sorted(root.glob("*.json")):
        for group in json.loads(path.read_text()):
            try:
                g = compiler.compile_json_schema(group["schema"])
            except GrammarError:
                total += len(group["tests"])
                continue
            if compiler.strict:
                assert not g.relaxed, (path.stem, group["description"], g.relaxed)
            check = SchemaCheck(group["schema"]) if g.needs_validation else None
            for case in group["tests"]:
                total += 1
                name = f"{path.stem} :: {group['description']} :: {case['description']}"
                try:
                    accepted = find_serialization(g, case["data"], budget=200_000) is not None
                except SearchBudgetExceeded:
                    continue
                accepted = accepted and (check is None or check.error(case["data"]) is None)
                if accepted and not case["valid"]:
                    bad.append(name)
                elif accepted == case["valid"]:
                    passing.add(name)
    return passing, bad, total


def assert_values(schema, good, bad) -> None:
    """The schema's grammar writes every value of `good` (in some key order) and none of `bad`."""
    g = BYTE_COMPILER.compile_json_schema(schema)
    for value in good:
        assert find_serialization(g, value) is not None, value
    for value in bad:
        assert find_serialization(g, value) is None, value


def assert_like_jsonschema(schema, values) -> None:
    """The schema's grammar writes exactly the values jsonschema (draft 2020-12) calls valid."""
    import jsonschema

    check = jsonschema.Draft202012Validator(schema)
    good = [v for v in values if check.is_valid(v)]
    bad = [v for v in values if not check.is_valid(v)]
    assert good and bad  # a table with one side empty would prove little
    assert_values(schema, good, bad)


def test_json_schema_suite_ratchet():
    passing, bad, total = run_suite(shared_data("json-schema-test-suite/draft2020-12"))
    assert not bad, f"invalid instances accepted: {bad}"
    gained = check_ratchet(RATCHET, passing, "cases that passed")
    print(f"\nJSON Schema suite: {len(passing)}/{total} cases pass; {gained} newly "
          "(run with AGENTKV_UPDATE_RATCHET=1 to record them)")


def test_json_schema_suite_strict_grammars_alone():
    """A strict compiler relaxes nothing: each grammar it builds is exact on its own (no check after)."""
    passing, bad, total = run_suite(shared_data("json-schema-test-suite/draft2020-12"), STRICT_BYTE_COMPILER)
    assert not bad, f"invalid instances accepted: {bad}"
    strict_ratchet = set(RATCHET.read_text().splitlines())
    print(f"\nJSON Schema suite, strict: {len(passing)}/{total} cases pass "
          f"({len(strict_ratchet - passing)} pass only with relaxed keywords validated after)")


def test_one_of_discriminated_objects_needs_object_type():
    """Found by sampling SchemaStore's plagiarize-me: branches told apart by a discriminator property
    still overlap on every non-object value unless a `type: object` (own or sibling) rules those out."""
    branches = [{"properties": {"t": {"const": k}}, "required": ["t"]} for k in ("a", "b")]
    with pytest.raises(GrammarError, match="oneOf"):
        STRICT_BYTE_COMPILER.compile_json_schema({"oneOf": branches})
    assert [r.keyword for r in BYTE_COMPILER.compile_json_schema({"oneOf": branches}).relaxed] == ["oneOf"]
    g = BYTE_COMPILER.compile_json_schema({"type": "object", "oneOf": branches})
    assert find_serialization(g, {"t": "a"}) == '{"t":"a"}'
    assert find_serialization(g, "x") is None and find_serialization(g, {"t": "c"}) is None


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "object", "minProperties": 1}, [{"a": 1}, {"a": 1, "b": 2}], [{}]),
    ({"type": "object", "maxProperties": 1, "properties": {"a": {}, "b": {}}},
     [{}, {"a": 1}, {"b": 1}, {"c": 1}], [{"a": 1, "b": 2}, {"c": 1, "d": 2}, {"a": 1, "c": 2}]),
    ({"type": "object", "minProperties": 2, "maxProperties": 3, "properties": {"a": {}, "b": {}}, "required": ["a"]},
     [{"a": 1, "b": 2}, {"a": 1, "x": 2}, {"a": 1, "b": 2, "x": 3}],
     [{"a": 1}, {"a": 1, "b": 2, "x": 3, "y": 4}, {"b": 1, "x": 2}]),
    ({"type": "object", "minProperties": 1, "additionalProperties": False,
      "properties": {k: {} for k in "abcdef"}}, [{"f": 1}, {"a": 1, "f": 2}], [{}, {"g": 1}]),
    ({"type": "object", "maxProperties": 2, "properties": {k: {} for k in "abcdef"}},
     [{"a": 1, "f": 2}, {"z": 1}, {}], [{"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 2, "z": 3}]),
])
def test_min_and_max_properties_count_members(schema, good, bad):
    assert_values(schema, good, bad)


def test_properties_bounds_that_contradict_or_need_too_many_members_are_refused():
    with pytest.raises(GrammarError, match="accepts no string"):
        BYTE_COMPILER.compile_json_schema({"type": "object", "minProperties": 3, "maxProperties": 2})
    with pytest.raises(GrammarError, match="maxProperties 100 is above the 64"):
        STRICT_BYTE_COMPILER.compile_json_schema({"type": "object", "maxProperties": 100})
    relaxed = BYTE_COMPILER.compile_json_schema({"type": "object", "maxProperties": 100}).relaxed
    assert [(r.pointer, r.keyword) for r in relaxed] == [("#/maxProperties", "maxProperties")]


def test_one_of_branches_apart_by_listed_values_or_by_their_all_of_parts():
    """Found in SchemaStore: a list of values against a pattern or a bound (azure-containerapp-template,
    compilerdefaults), and branches built with allOf on a shared base (abc-clinical-demand-forecast)."""
    g = BYTE_COMPILER.compile_json_schema(
        {"oneOf": [{"enum": ["HTTP", "HTTPS"]}, {"type": "string", "pattern": "^\\[.*\\]$", "minLength": 2}]})
    assert find_serialization(g, "HTTP") and find_serialization(g, "[x]")
    assert find_serialization(g, "FTP") is None and find_serialization(g, "x]") is None
    g = BYTE_COMPILER.compile_json_schema({"oneOf": [{"const": 0}, {"type": "integer", "minimum": 1}]})
    assert find_serialization(g, 0) == "0" and find_serialization(g, 5) == "5" and find_serialization(g, -1) is None
    base = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    branches = [{"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"kind": {"const": k}}, "required": ["kind"]}]}
                for k in ("a", "b")]
    g = BYTE_COMPILER.compile_json_schema({"$defs": {"base": base}, "oneOf": branches})
    assert find_serialization(g, {"id": "x", "kind": "b"}) is not None
    assert find_serialization(g, {"id": "x", "kind": "c"}) is None and find_serialization(g, {"kind": "a"}) is None
    # Still refused where a listed value could match the other branch too.
    for overlapping in ([{"enum": ["HTTP", "[a]"]}, {"type": "string", "pattern": "^\\[.*\\]$"}],
                        [{"const": 1}, {"type": "integer", "minimum": 1}]):
        with pytest.raises(GrammarError, match="oneOf"):
            STRICT_BYTE_COMPILER.compile_json_schema({"oneOf": overlapping})


DISCRIMINATED = {
    "type": "object", "properties": {"kind": {"enum": ["a", "b", "c"]}, "x": {}, "y": {}},
    "allOf": [{"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}},
              {"if": {"properties": {"kind": {"const": "b"}}, "required": ["kind"]},
               "then": {"required": ["y"]}, "else": {"properties": {"y": False}}}]}


@pytest.mark.parametrize("schema,good,bad", [
    # Each case of the discriminator: a listed value, another value, absent (the first `if` holds then).
    (DISCRIMINATED, [{"kind": "a", "x": 1}, {"kind": "b", "y": 1}, {"kind": "c"}, {"x": 1}],
     [{"kind": "a"}, {"kind": "b"}, {"kind": "c", "y": 1}, {}, {"x": 1, "y": 2}, {"kind": "d"}]),
    # No type: a non-object satisfies every `if`, so every `then` applies (vacuously here).
    ({"properties": {"k": {"enum": [1, 2]}}, "if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["z"]},
      "else": {"type": "object"}}, ["s", 3, {"k": 1, "z": 0}, {"k": 2}, {"z": 1}], [{"k": 1}, {}]),
    # A non-object satisfies the `if`, so a `then` that asks for an object refuses it.
    ({"properties": {"k": {"enum": [1, 2]}}, "if": {"properties": {"k": {"const": 1}}},
      "then": {"type": "object", "required": ["z"]}}, [{"k": 2}, {"z": 1}, {"k": 1, "z": 1}], ["s", 3, None, {"k": 1}]),
    # ... and each case of an object admits objects only (here the second `then` refuses non-objects).
    ({"properties": {"k": {"enum": [1, 2]}}, "allOf": [
        {"if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["a"]}},
        {"if": {"properties": {"k": {"const": 2}}}, "then": {"type": "object"}}]},
     [{"k": 1, "a": 0}, {"k": 2}, {"a": 0}], ["s", 3, {"k": 1}, {}]),
    ({"properties": {"k": {"enum": [1]}}, "if": {"properties": {"k": {"const": 1}}, "required": ["k"]},
      "then": {"type": "object"}}, [{}, {"k": 1}], ["s", None]),
    # A string discriminator without listed values: the other values are "any but the listed strings".
    ({"type": "object", "properties": {"k": {"type": "string"}}, "if": {"properties": {"k": {"const": "a"}}},
      "then": {"required": ["z"]}},
     [{"k": "a", "z": 1}, {"k": "b"}, {"k": "ab"}, {"z": 0}], [{"k": "a"}, {}, {"k": 1}]),
    # `not` of listed strings.
    ({"type": "string", "not": {"enum": ["a", "b"]}}, ["c", "", "ab"], ["a", "b", 1]),
    ({"not": {"const": "x"}}, [1, "y", {}, None, ["x"]], ["x"]),
    ({"enum": ["a", "b", "c"], "not": {"const": "b"}}, ["a", "c"], ["b"]),
    ({"type": "string", "allOf": [{"not": {"const": "a"}}, {"not": {"const": "b"}}]}, ["c"], ["a", "b"]),
])
def test_if_then_else_on_a_discriminator_and_not_of_strings(schema, good, bad):
    assert_values(schema, good, bad)


@pytest.mark.parametrize("schema,good,bad", [
    ({"dependentRequired": {"a": ["b"]}}, [{}, {"b": 1}, {"a": 1, "b": 2}, "s", 3], [{"a": 1}]),
    ({"type": "object", "properties": {"b": {}, "a": {}}, "dependencies": {"a": ["b", "c"]}},
     [{"b": 1}, {"a": 1, "b": 2, "c": 3}, {"c": 1}], [{"a": 1}, {"a": 1, "b": 1}]),
    ({"dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}}}},
     [{"a": 1, "b": 2}, {"b": "x"}, {"a": 0}], [{"a": 1, "b": "x"}]),
    # Two dependencies, one on the other's presence, on a closed object.
    ({"dependencies": {"a": {"required": ["x"]}, "b": ["a"]}, "additionalProperties": False,
      "properties": {"a": {}, "b": {}, "x": {}}},
     [{}, {"a": 1, "x": 1}, {"a": 1, "b": 1, "x": 1}, {"x": 1}], [{"b": 1}, {"a": 1}, {"a": 1, "b": 1}]),
])
def test_dependencies_by_which_properties_are_present(schema, good, bad):
    assert_values(schema, good, bad)


@pytest.mark.parametrize("schema,what", [
    ({"dependentRequired": {"a": "b"}}, "maps a name to an array of names"),
    ({"dependencies": {k: ["z"] for k in "abcde"}}, "dependencies on 5 properties"),
    ({"if": {"properties": {"k": {"minLength": 2}}}, "then": {"required": ["z"]}}, "only with const or enum"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "tests one property"),
    ({"properties": {"k": {"type": "number"}}, "if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["z"]}},
     "not all strings"),
    ({"allOf": [{"if": {"properties": {"a": {"const": 1}}}, "then": {}}, {"if": {"properties": {"b": {"const": 1}}}}]},
     "same property"),
    ({"not": {"type": "integer"}}, "keyword 'not' is not supported"),
    ({"not": {"minLength": 2}}, "keyword 'not' is not supported"),
    # a negation that would recurse forever through properties
    ({"not": {"$ref": "#/$defs/x"}, "$defs": {"x": {"properties": {"a": {"$ref": "#/$defs/x"}}}}},
     "keyword 'not' is not supported"),
    ({"if": {"properties": {"k": {"const": 1}}}, "allOf": {"required": ["k"]}}, r"not of type .array. \(at #/allOf\)"),
    # A malformed keyword in a branch is no proof that a listed value fails it (and no crash).
    ({"oneOf": [{"enum": ["a"]}, {"type": "string", "minLength": "x"}]}, "oneOf"),
])
def test_other_conditionals_and_nots_are_refused(schema, what):
    with pytest.raises(GrammarError, match=what):
        STRICT_BYTE_COMPILER.compile_json_schema(schema)


@pytest.mark.parametrize("schema,good,bad", [
    # string keywords next to a list keep the listed strings that meet them (other types pass)
    ({"enum": ["a", "abc", "abcd", 5], "minLength": 2, "maxLength": 3}, ["abc", 5], ["a", "abcd"]),
    ({"enum": ["ab", "ba", "ca"], "pattern": "^[ab]"}, ["ab", "ba"], ["ca"]),
    ({"const": "2020-01-01", "format": "date"}, ["2020-01-01"], []),
    ({"enum": ["2020-01-01", "soon"], "format": "date"}, ["2020-01-01"], ["soon"]),
    # number bounds likewise (exclusive, and draft-04's boolean form)
    ({"enum": [1, 2, 3, 3.5, "x"], "exclusiveMinimum": 1, "maximum": 3}, [2, 3, "x"], [1, 3.5]),
    ({"enum": [1, 2], "minimum": 1, "exclusiveMinimum": True}, [2], [1]),
])
def test_listed_values_checked_against_their_siblings(schema, good, bad):
    assert_values(schema, good, bad)


@pytest.mark.parametrize("schema,what", [
    ({"enum": ["a"], "minLength": "x"}, r"not of type .integer. \(at #/minLength\)"),
    ({"enum": ["a"], "pattern": "(?=a)"}, "lookaround"),
    ({"enum": [{"a": 1}], "properties": {"a": {"type": "string"}}}, "together with 'properties'"),
    ({"enum": [1], "minimum": "0"}, r"not of type .number. \(at #/minimum\)"),
])
def test_listed_values_with_keywords_not_checked_are_refused(schema, what):
    with pytest.raises(GrammarError, match=what):
        STRICT_BYTE_COMPILER.compile_json_schema(schema)


@pytest.mark.parametrize("fmt,good,bad", [
    ("date", ["2024-02-29", "2000-02-29", "1999-12-31", "2023-04-30", "0000-02-29"],
     ["2023-02-29", "1900-02-29", "2024-02-30", "2023-04-31", "2024-13-01", "2024-00-10", "24-01-01"]),
    # a leap second only as 23:59:60 UTC (offered with a zero offset)
    ("time", ["23:59:60Z", "23:59:60.5-00:00", "08:30:00.5+02:00", "00:00:00z"],
     ["24:00:00Z", "08:30:00", "08:30:60Z", "23:59:60+01:00", "23:58:60Z"]),
    ("date-time", ["2024-01-01T00:00:00Z", "2024-01-01t10:00:00-05:30"],
     ["2024-01-01 00:00:00Z", "2024-01-01T00:00", "2023-02-29T00:00:00Z"]),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456"]),
    ("ipv4", ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3", "01.2.3.4"]),
    ("ipv6", ["::1", "2001:db8::8a2e:370:7334", "::ffff:192.0.2.1"], ["1:2:3:4:5:6:7:8:9", "2001::db8::1", "12345::"]),
    ("email", ["a.b@example.com", "x+y@h"], ["a@", "@h", "a b@h", "a..b@h"]),
    # RFC 3986 as written in its appendix A
    ("uri", ["http://x.org/a?b#c", "urn:isbn:0451450523", "mailto:a@b", "http://[::1]:80/", "http://[v7.abc]/",
             "file:///etc/hosts", "a:", "http://u:pw@host:8080/p/a%20b?q=1&r=2", "ldap://[2001:db8::7]/c=GB?o?one",
             "tel:+1-816-555-1212", "http://a/b?c=/d?e#/f?"],
     ["/relative", "1http://x", "http://a b", "a:%zz", "http://[::1", "a:#[", "a:#b#c", "http://[1::2::3]/",
      "http://x/?q=[1]", "http://h:x/", ""]),
    ("uri-reference", ["", "a/b", "/x?y#z", "http://x", "#frag", "./a:b", "a?b:c", "//host/p", "//[::1]:8/"],
     ["1:abc", ":x", "a b", "%zz", "a:%g0", "#a#b", "//[::1/"]),
])
def test_formats(fmt, good, bad):
    assert_values({"type": "string", "format": fmt}, good, bad)


ONE_OF_PROPS = {"a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "integer"}, "k": {"type": "integer"}}


@pytest.mark.parametrize("schema", [
    # branches that differ only in `required` (SchemaStore's aiproj and bitrise have this shape)
    {"oneOf": [{"type": "object", "properties": ONE_OF_PROPS, "additionalProperties": False, "required": r}
               for r in (["a", "k"], ["b", "k"], ["c", "k"], ["k"])] + [{"type": "null"}]},
    {"oneOf": [{"type": "object", "properties": ONE_OF_PROPS, "required": ["a"]},
               {"type": "object", "properties": ONE_OF_PROPS, "required": ["b"]}, {"type": "string"}]},
    # siblings merged into every branch first
    {"type": "object", "properties": ONE_OF_PROPS, "oneOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},
])
def test_one_of_branches_apart_only_by_required_names(schema):
    """Every combination of present names (and a few other values) against jsonschema's verdict."""
    values = [None, "s", 3, {"a": 1}, {"k": "x"}]
    for n in range(5):
        for names in itertools.combinations("abck", n):
            values.append({x: (1 if x in "ck" else "v") for x in names})
            values.append({**values[-1], "z": True})
    assert_like_jsonschema(schema, values)


def test_one_of_branches_that_differ_in_more_than_required_are_refused():
    schema = {"oneOf": [{"type": "object", "required": ["a"]},
                        {"type": "object", "required": ["b"], "properties": {"a": {"type": "string"}}}]}
    with pytest.raises(GrammarError, match="oneOf branches that may overlap"):
        STRICT_BYTE_COMPILER.compile_json_schema(schema)


def test_one_of_branches_apart_as_written_stay_apart_with_siblings():
    """Siblings merged into each branch put the discriminator's const inside an allOf."""
    schema = {"type": "object", "properties": {"k": {"type": "string"}, "x": {"type": "integer"}},
              "oneOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
                        {"properties": {"k": {"const": "b"}}, "required": ["k", "x"]}]}
    assert_values(schema, [{"k": "a"}, {"k": "a", "x": 1}, {"k": "b", "x": 2}], [{"k": "b"}, {"k": "c"}, {}, "a"])


@pytest.mark.parametrize("branches,good,bad", [
    # patterns whose languages share no string (SchemaStore's dein: a URL, a path, a repo name)
    ([{"type": "string", "pattern": "^https?://"}, {"type": "string", "pattern": "^[~/][a-z/]+$"},
      {"type": "string", "pattern": "^[a-z]+/[a-z]+$"}],
     ["http://x", "~/a", "/a/b", "user/repo"], ["ftp://x", "a", "user/repo/x", 3]),
    # lengths apart, and a format against a pattern
    ([{"type": "string", "maxLength": 2}, {"type": "string", "minLength": 3, "pattern": "^a"}],
     ["", "xy", "abc"], ["xyz"]),
    ([{"type": "string", "format": "date"}, {"type": "string", "pattern": "^[a-z]+$"}], ["2024-01-02", "ab"], ["2024"]),
])
def test_one_of_string_branches_apart_by_their_languages(branches, good, bad):
    assert_values({"oneOf": branches}, good, bad)


def test_one_of_string_branches_whose_languages_meet_are_refused():
    schema = {"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}]}  # "ab" is both
    with pytest.raises(GrammarError, match="oneOf branches that may overlap"):
        STRICT_BYTE_COMPILER.compile_json_schema(schema)


NOT_VALUES = [None, True, 1, 1.5, "s", [], [1]] + [
    {k: v for k in names} for n in range(4) for names in itertools.combinations("abc", n) for v in (1, "x")]


@pytest.mark.parametrize("schema", [
    {"not": {"required": ["a"]}},
    {"type": "object", "not": {"required": ["a", "b"]}},
    {"allOf": [{"not": {"required": ["a"]}}, {"not": {"required": ["b"]}}]},  # two nots merged
    {"not": {"properties": {"a": {"type": "string"}}, "required": ["a"]}},
    {"not": {"type": "object", "properties": {"a": {"type": "string"}}}},
    {"not": {"type": ["string", "null"]}},
    {"not": {"anyOf": [{"required": ["a", "b"]}, {"required": ["c"]}]}},
    {"not": {"$ref": "#/$defs/t"}, "$defs": {"t": {"required": ["c"], "properties": {"a": {"type": "boolean"}}}}},
])
def test_not_of_types_and_property_tests(schema):
    """Each against jsonschema's verdict on values of every type and objects with every name set."""
    assert_like_jsonschema(schema, NOT_VALUES)


NAME_VALUES = [{}, 1] + [{k: 1 for k in names} for n in range(3)
                         for names in itertools.combinations(["a", "bb", "ccc", "c", "ab", "x1", "xyz", "b", ""], n)]


@pytest.mark.parametrize("schema", [
    {"propertyNames": {"anyOf": [{"enum": ["ab", "c"]}, {"not": {}}]}},  # SchemaStore's claude-code manifests
    {"propertyNames": {"enum": ["a", "bb", "ccc"], "maxLength": 2}},  # listed names meet their siblings
    {"propertyNames": {"anyOf": [{"pattern": "^x"}, {"maxLength": 1}], "minLength": 1}},
    {"propertyNames": {"not": {"enum": ["a"]}, "maxLength": 2}},
    {"propertyNames": {"type": "string", "anyOf": [{"const": "a"}, {"pattern": "^b"}]}},
    {"propertyNames": {"$ref": "#/$defs/none"}, "$defs": {"none": False}},  # a TypeError before
])
def test_property_names_with_any_of_not_and_listed_names(schema):
    """Against jsonschema's verdict on objects with every combination of up to two names."""
    assert_like_jsonschema(schema, NAME_VALUES)


@pytest.mark.parametrize("lo,hi", [
    (0, 9007199254740991),  # zod's int bounds (Number.MAX_SAFE_INTEGER): 2^16 recursive splits before
    (-9007199254740991, 9007199254740991),
    (0, 10 ** 12 - 1), (123, 98765), (-5000, -17), (10 ** 15, 10 ** 15 + 3),
])
def test_integer_bounds_of_any_size(lo, hi):
    import random

    rnd = random.Random(lo ^ hi)
    near = [lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 0, -1, 10 ** 16, -(10 ** 16)]
    values = near + [rnd.randint(lo, hi) for _ in range(40)] + [rnd.randint(-(10 ** 17), 10 ** 17) for _ in range(40)]
    assert_values({"type": "integer", "minimum": lo, "maximum": hi},
                  [v for v in values if lo <= v <= hi], [v for v in values if not lo <= v <= hi])


def test_a_schema_that_accepts_nothing_is_refused_naming_where():
    """An enum put on an array instead of its items (a tool schema of BFCL's live_simple does it) cannot
    be met: the error names the property, the innermost place that accepts nothing, not only the root."""
    schema = {"type": "object", "required": ["targets", "metrics"], "properties": {
        "targets": {"type": "array", "items": {"type": "string"}},
        "metrics": {"type": "array", "items": {"type": "string"}, "enum": ["trust", "buzz"]}}}
    with pytest.raises(GrammarError, match=r"no value meets the schema at #/properties/metrics \("):
        BYTE_COMPILER.compile_json_schema(schema)
    schema["required"] = ["targets"]  # optional: the object is written without it
    assert_values(schema, [{"targets": []}], [{"targets": [], "metrics": ["trust"]}])
