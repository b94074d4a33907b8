"""Grammar fuzzing: instances that hypothesis-jsonschema generates from SchemaStore schemas, and
mutations of them, against the compiled grammar; and random schemas against the compiler.

The reference for "valid" is `jsonschema` with the formats it can check (what the grammar asserts)
and agentkv's check after generation (`SchemaCheck`: ECMA patterns, decimal multipleOf). A valid
instance must be written by the grammar (the text `find_serialization` finds) and accepted token by
token by the embedded model's tokenizer; an invalid one must be refused by the grammar, or, where
the grammar relaxed a keyword, by the check after generation.
"""

from __future__ import annotations

import json
import signal
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarError, Matcher
from agentkv.grammar.schema.validation import SchemaCheck, validator_class
from agentkv.grammar.schema.walk import SearchBudgetExceeded, find_serialization
from tests.conftest import shared_data
from tests.grammar.test_schemastore import schemastore_documents
from tests.grammar_helpers import BYTE_COMPILER

hypothesis_jsonschema = pytest.importorskip("hypothesis_jsonschema")

SCHEMAS = 100  # SchemaStore schemas to fuzz: the smallest that compile and that the generator reads
EXAMPLES = 4  # generated instances per schema
SECONDS_PER_SCHEMA = 8  # the generator is slow on some schemas (minutes): those are passed over


class _Slow(BaseException):  # not an Exception: hypothesis must not take it for a failing example
    pass


class _Ours(BaseException):
    """An error in judging an instance (agentkv's code or the test's), as opposed to the generator's."""


def _alarm(*_):
    raise _Slow


def reference(schema):
    import jsonschema

    formats = validator_class(schema)(schema, format_checker=jsonschema.FormatChecker())
    check = SchemaCheck(schema)
    return lambda v: formats.is_valid(v) and check.error(v) is None


def mutations(value) -> list:
    """Values near `value` that a schema is likely to refuse: a member dropped, one added, one of
    another type, an item of another type."""
    out: list = [[value], None if value is not None else 0]
    if isinstance(value, dict):
        for k in list(value)[:2]:
            out.append({n: v for n, v in value.items() if n != k})
            out.append({**value, k: [value[k]] if not isinstance(value[k], list) else "x"})
        out.append({**value, "\u0000agentkv": 1})
    elif isinstance(value, list) and value:
        out.append([*value[:-1], {"x": value[-1]}])
    elif isinstance(value, str):
        out.append(value + "\u0000")
    return out


def test_schemastore_generated_instances(smollm_info, smollm_compiler):
    root = shared_data("schemastore")
    documents = schemastore_documents(root)
    paths = sorted(root.glob("*.json"), key=lambda p: (p.stat().st_size, p.name))
    encode = smollm_info.encode_bytes
    bitmask = np.zeros((1, smollm_info.words), dtype=np.int32)
    fuzzed, passed_over, counts = [], [], {"valid": 0, "invalid": 0, "untokenizable": 0}
    good_refused, bad_accepted = [], []

    def judge(name, g, valid, check, v) -> None:
        try:
            text = find_serialization(g, v, budget=200_000)
        except SearchBudgetExceeded:
            return
        if valid(v):
            counts["valid"] += 1
            if text is None:
                good_refused.append(f"{name}: {json.dumps(v)[:200]}")
                return
            ids = encode(text.encode())
            if smollm_info.decode(ids) != text.encode():  # a character the tokenizer cannot write (U+40000)
                counts["untokenizable"] += 1
                return
            m = Matcher(g)
            for i, tok in enumerate(ids):
                if i < 8:
                    m.fill_next_token_bitmask(bitmask)
                    assert (bitmask[0, tok >> 5] >> (tok & 31)) & 1, (name, text, i)
                if not m.accept_token(tok):
                    good_refused.append(f"{name} at token {i}: {text[:200]}")
                    return
            if not m.can_terminate():
                good_refused.append(f"{name} (cannot end): {text[:200]}")
        else:
            counts["invalid"] += 1
            if text is not None and (not g.needs_validation or check.error(v) is None):
                bad_accepted.append(f"{name}: {json.dumps(v)[:200]}")

    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for path in paths:
            if len(fuzzed) >= SCHEMAS:
                break
            schema = json.loads(path.read_text())["schema"]
            try:
                g = smollm_compiler.compile_json_schema(schema, documents=documents)
            except GrammarError:
                continue
            valid, check = reference(schema), SchemaCheck(schema, documents)

            @given(v=hypothesis_jsonschema.from_schema(schema))
            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(v):
                try:
                    judge(path.stem, g, valid, check, v)
                    if valid(v):
                        for bad in mutations(v):
                            judge(path.stem, g, valid, check, bad)
                except Exception as e:
                    raise _Ours from e

            signal.alarm(SECONDS_PER_SCHEMA)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run()
                fuzzed.append(path.stem)
            except _Ours as e:
                raise e.__cause__ from None
            except _Slow:
                passed_over.append(f"{path.stem} (slow)")
            except Exception as e:  # the generator cannot read it (recursive or remote $refs, ...)
                passed_over.append(f"{path.stem} ({type(e).__name__})")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    print(f"\nhypothesis-jsonschema: {len(fuzzed)} SchemaStore schemas fuzzed ({len(passed_over)} passed over), "
          f"{counts['valid']} valid and {counts['invalid']} invalid instances ({counts['untokenizable']} valid ones "
          "holding characters the tokenizer cannot write)")
    assert len(fuzzed) >= SCHEMAS, passed_over
    assert counts["valid"] >= 3 * SCHEMAS and counts["invalid"] >= 3 * SCHEMAS, counts
    assert not good_refused, f"valid instances refused: {good_refused[:5]}"
    assert not bad_accepted, f"invalid instances accepted: {bad_accepted[:5]}"


# ---- random schemas: compiled, or refused with a GrammarError, never a crash --------------------------

_LEAVES = st.sampled_from([
    {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
    {"type": "string", "maxLength": 3}, {"type": "string", "minLength": 300}, {"type": "string", "pattern": "^a+b?$"},
    {"type": "string", "pattern": "(?<=x)y"}, {"type": "string", "format": "date-time"},
    {"type": "string", "format": "color"}, {"type": "integer", "minimum": -3, "exclusiveMaximum": 1000},
    {"type": "number", "multipleOf": 0.25}, {"type": "number", "minimum": 0.5}, {"enum": ["a", 1, None]},
    {"const": {"k": [1]}}, {"$ref": "#/$defs/leaf"}, {"not": {"enum": ["x"]}}, True, False, {},
])


def _compose(children):
    return st.one_of(
        st.builds(lambda props, req, extra: {"type": "object", "properties": props,
                                             "required": [k for k in props if req], "additionalProperties": extra},
                  st.dictionaries(st.sampled_from(["a", "b", "c d", "é"]), children, max_size=3), st.booleans(),
                  st.one_of(st.booleans(), children)),
        st.builds(lambda items, lo, unique: {"type": "array", "items": items, "minItems": lo, "uniqueItems": unique},
                  children, st.integers(0, 3), st.booleans()),
        st.builds(lambda parts, key: {key: parts}, st.lists(children, min_size=1, max_size=3),
                  st.sampled_from(["anyOf", "oneOf", "allOf"])),
        st.builds(lambda a, b, c: {"if": a, "then": b, "else": c}, children, children, children),
        st.builds(lambda a: {"not": a}, children),
    )


SCHEMA = st.recursive(_LEAVES, _compose, max_leaves=8).map(
    lambda s: {"$defs": {"leaf": {"type": "string", "maxLength": 2}}, **s} if isinstance(s, dict) else s)


@given(schema=SCHEMA)
@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_random_schemas_compile_or_raise_a_grammar_error(schema):
    try:
        g = BYTE_COMPILER.compile_json_schema(schema)
    except GrammarError:
        return
    assert g.num_states > 0
