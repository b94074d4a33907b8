"""$ref across documents (schema/refs.py): relative references read against `$id`, embedded resources,
documents supplied by URI, and references that `allOf` carries from one document into another."""

import pytest

from agentkv.grammar import GrammarError
from agentkv.grammar.schema.refs import SchemaResources
from agentkv.grammar.schema.walk import find_serialization
from tests.grammar_helpers import BYTE_COMPILER, STRICT_BYTE_COMPILER

OTHER = {
    "$id": "https://example.com/schemas/other.json",
    "$defs": {
        "name": {"type": "string", "maxLength": 3},
        "names": {"type": "array", "items": {"$ref": "#/$defs/name"}},  # relative: within other.json
        "tagged": {"$anchor": "tag", "type": "string", "pattern": "^t"},
        "obj": {"type": "object", "properties": {"enum": {"$ref": "#/$defs/name"}}},  # a name, not a keyword
    },
}
ROOT = {
    "$id": "https://example.com/schemas/root.json",
    "$defs": {"name": {"type": "integer"}},  # same pointer as other.json's: must not be confused
    "type": "object",
    "properties": {
        "names": {"$ref": "other.json#/$defs/names"},
        "merged": {"allOf": [{"$ref": "other.json#/$defs/names"}, {"minItems": 1}]},
        "tag": {"$ref": "other.json#tag"},
        "mine": {"$ref": "root.json#/$defs/name"},  # this document, named by its URI
        "enum": {"$ref": "#/$defs/name"},  # a property named like a keyword
        "obj": {"$ref": "other.json#/$defs/obj"},
    },
    "additionalProperties": False,
}
DOCS = {"https://example.com/schemas/other.json": OTHER}


def writes(schema, value, **kw) -> bool:
    return find_serialization(BYTE_COMPILER.compile_json_schema(schema, **kw), value) is not None


@pytest.mark.parametrize("value, ok", [
    ({"names": ["ab", "c"]}, True),
    ({"names": ["abcd"]}, False),  # other.json's name: at most 3 characters
    ({"names": [1]}, False),  # not root.json's name
    ({"merged": ["ab"]}, True),
    ({"merged": []}, False),
    ({"merged": [1]}, False),  # allOf brought other.json's relative $ref here: still other.json's
    ({"tag": "tx"}, True),
    ({"tag": "x"}, False),
    ({"mine": 7}, True),
    ({"mine": "ab"}, False),
    ({"enum": 7}, True),
    ({"enum": "a"}, False),
    ({"obj": {"enum": "ab"}}, True),
    ({"obj": {"enum": 1}}, False),
])
def test_references_into_a_supplied_document(value, ok):
    assert writes(ROOT, value, documents=DOCS) is ok


def test_a_document_not_supplied_is_named_in_the_error():
    with pytest.raises(GrammarError, match=r"https://example\.com/schemas/other\.json.*documents="):
        STRICT_BYTE_COMPILER.compile_json_schema(ROOT)
    with pytest.raises(GrammarError, match="documents="):  # relaxing would leave a value there unchecked
        BYTE_COMPILER.compile_json_schema(ROOT)
    with pytest.raises(GrammarError, match="URI strings to schemas"):
        BYTE_COMPILER.compile_json_schema(ROOT, documents={"https://example.com/schemas/other.json": 3})
    unused = {"type": "object", "$defs": {"x": {"$ref": "missing.json"}}}  # never followed: no error
    assert writes(unused, {"a": 1})
    assert SchemaResources(ROOT).missing == {"https://example.com/schemas/other.json"}
    assert SchemaResources(ROOT, DOCS).missing == set()


def test_the_cache_tells_documents_apart():
    other = {**OTHER, "$defs": {**OTHER["$defs"], "name": {"type": "string"}}}  # no maxLength
    loose = {"https://example.com/schemas/other.json": other}
    assert writes(ROOT, {"names": ["abcd"]}, documents=loose)
    assert not writes(ROOT, {"names": ["abcd"]}, documents=DOCS)


def test_documents_reach_further_documents():
    first = {"$id": "https://example.com/a/first.json", "$ref": "../b/second.json#/$defs/n"}
    second = {"$defs": {"n": {"$ref": "#/$defs/m"}, "m": {"type": "integer", "minimum": 5}}}
    docs = {"https://example.com/a/first.json": first, "https://example.com/b/second.json": second}
    root = {"$id": "https://example.com/a/root.json", "type": "array", "items": {"$ref": "first.json"}}
    assert writes(root, [5, 6], documents=docs)
    assert not writes(root, [4], documents=docs)


@pytest.mark.parametrize("schema, good, bad", [
    # an embedded resource: its own $id is the base of the references inside it
    ({"$id": "https://example.com/root", "$ref": "item",
      "$defs": {"item": {"$id": "item", "$ref": "#/$defs/leaf", "$defs": {"leaf": {"type": "boolean"}}},
                "leaf": {"type": "null"}}},
     [True], [None]),
    # a resource with a urn: base (urljoin would drop the base of its "#/..." reference)
    ({"$ref": "urn:uuid:deadbeef-1234", "$defs": {"m": {"type": "string"}, "inner": {
        "$id": "urn:uuid:deadbeef-1234", "$ref": "#/$defs/m", "$defs": {"m": {"type": "integer"}}}}},
     [3], ["x"]),
    # draft-07's plain-name $id is an anchor
    ({"$ref": "#pos", "definitions": {"p": {"$id": "#pos", "type": "integer", "minimum": 1}}}, [1], [0]),
    # a reference to this document by its own file name, relative to its $id
    ({"$id": "https://example.com/x/self.json", "type": "array", "items": {"$ref": "self.json#/$defs/s"},
      "$defs": {"s": {"type": "string"}}},
     [["a"]], [[1]]),
])
def test_references_within_one_document_with_base_uris(schema, good, bad):
    for value in good:
        assert writes(schema, value), value
    for value in bad:
        assert not writes(schema, value), value
