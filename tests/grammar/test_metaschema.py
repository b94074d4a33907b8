"""The metaschema check (grammar/schema/validation.py) takes jsonschema-rs's yes and leaves every no
to `jsonschema`: the fast path must never pass a schema the slow one refuses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from agentkv.grammar.schema import validation

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def _slow_valid(schema) -> bool:
    named = jsonschema.validators.validator_for(schema, default=None)
    drafts = [named] if named is not None else [jsonschema.Draft202012Validator, jsonschema.Draft201909Validator,
                                                jsonschema.Draft7Validator, jsonschema.Draft4Validator]
    return any(jsonschema.exceptions.best_match(c(c.META_SCHEMA).iter_errors(schema)) is None for c in drafts)


def _shared_schemas() -> list[dict]:
    out = []
    for f in sorted((DATA / "schemastore").glob("*.json")):
        doc = json.loads(f.read_text())
        out.append(doc.get("schema", doc))
    for f in sorted((DATA / "json-schema-test-suite").rglob("*.json")):
        cases = json.loads(f.read_text())
        if isinstance(cases, list):
            out += [c["schema"] for c in cases if isinstance(c, dict) and "schema" in c]
    return [s for s in out if isinstance(s, dict)]


INVALID = [
    {"type": 7},
    {"properties": {"a": {"type": "strin"}}},
    {"required": "a"},
    {"minimum": "1"},
    {"anyOf": []},
    {"$schema": "http://json-schema.org/draft-07/schema#", "exclusiveMinimum": True},
    {"items": {"maxItems": -1}},
]


@pytest.mark.parametrize("schema", INVALID)
def test_invalid_schemas_are_named_with_their_pointer(schema):
    validation._metaschema_error.cache_clear()
    assert not validation._rust_says_valid(schema)
    got = validation.metaschema_error(schema)
    assert got is not None and got[1].startswith("#")


def test_the_fast_yes_never_passes_what_jsonschema_refuses():
    schemas = _shared_schemas()
    if len(schemas) < 100:
        pytest.skip("the shared SchemaStore and JSON-Schema-Test-Suite data are absent")
    yes = [s for s in schemas if validation._rust_says_valid(s)]
    assert len(yes) > 0.9 * len(schemas)  # (the fast path is the one taken)
    assert [json.dumps(s)[:120] for s in yes if not _slow_valid(s)] == []


def test_the_answer_is_the_same_without_jsonschema_rs(monkeypatch):
    """Where its wheel is missing, the pure-Python check alone gives the same answers."""
    schemas = [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}, *INVALID]
    validation._metaschema_error.cache_clear()
    fast = [validation.metaschema_error(s) for s in schemas]
    monkeypatch.setitem(sys.modules, "jsonschema_rs", None)  # (import raises ImportError)
    validation._metaschema_error.cache_clear()
    assert [validation.metaschema_error(s) for s in schemas] == fast
    validation._metaschema_error.cache_clear()
