r"""The check after generation: a value against its whole JSON schema, with `jsonschema`.

A grammar enforces what it can and relaxes the rest (schema/relaxed.py); this check covers the rest. It
reads `$ref`s into the documents given with the schema and the JSON Schema metaschemas, and nowhere
else (nothing is fetched): a value that reaches a reference to a document not given fails.
The grammar enforces the formats it knows; of the others, those a grammar cannot hold but a check
can (`regex`, `hostname`: CHECKED_FORMATS) are checked here, and the rest are annotations, as in
JSON Schema 2020-12's default vocabulary. Patterns are searched with the `regex` module, which reads
the ECMA syntax schemas use (`\p{L}`) where Python's `re` does not.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from agentkv.grammar.automata.regex import DOT, SPACE
from agentkv.grammar.schema.objects import pointer_escape
from agentkv.grammar.schema.refs import SchemaResources

# Formats no grammar here enforces that this check does (schema/relaxed.py lists them as checked).
CHECKED_FORMATS = frozenset({"regex", "hostname", "idn-hostname", "idn-email"})
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


@dataclass(frozen=True)
class Failure:
    """Why a value failed its schema: the keyword (`uniqueItems`), its JSON pointer in the schema
    (`#/properties/tags/uniqueItems`) and the message."""

    keyword: str | None
    pointer: str | None
    message: str


class SchemaCheck:
    """Validates values against one schema (a dict or boolean) and the `documents` its `$ref`s reach."""

    def __init__(self, schema, documents: dict | None = None):
        import jsonschema
        from jsonschema_specifications import REGISTRY
        from referencing import Resource
        from referencing.jsonschema import DRAFT202012

        def resource(doc):
            return Resource.from_contents(doc, default_specification=DRAFT202012)

        # The schema and the documents it reaches as the grammar read them: every $ref rewritten to
        # one absolute form (schema/refs.py), so a reference resolves here where it did there (a draft-07
        # root whose $ref ignores its sibling $id included), and only the documents reached are held.
        if isinstance(schema, dict):
            refs = SchemaResources(schema, documents)
            schema, held = refs.root, [(uri, node) for uri, (node, _) in refs.resources.items() if uri]
        else:
            held = []
        registry = REGISTRY.with_resources((uri, resource(node)) for uri, node in held)
        cls = jsonschema.validators.extend(validator_class(schema), {
            "pattern": _pattern, "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties, "multipleOf": _multiple_of})
        self._validator = cls(schema, registry=registry, format_checker=_format_checker())

    def error(self, value) -> str | None:
        """Why `value` is not valid (the most relevant failure, with its path), or None where it is."""
        failure = self.failure(value)
        return None if failure is None else failure.message

    def failure(self, value) -> Failure | None:
        """The most relevant failure of `value`: the keyword, its pointer in the schema, and why."""
        from referencing.exceptions import Unresolvable

        try:
            err = next(iter(self._validator.iter_errors(value)), None)
        except Unresolvable as e:
            return Failure("$ref", None, f"a $ref the value reaches cannot be resolved ({e}); pass that document "
                                         "with the schema")
        except Exception as e:  # noqa: BLE001 - a schema jsonschema cannot read: the value is not vouched for
            return Failure(None, None, f"the schema could not be checked ({type(e).__name__}: {e})")
        if err is None:
            return None
        import jsonschema

        err = jsonschema.exceptions.best_match([err]) or err
        where = "".join(f"[{p!r}]" for p in err.absolute_path)
        pointer = "#" + "".join("/" + pointer_escape(str(p)) for p in err.absolute_schema_path)
        return Failure(err.validator, pointer, f"{err.message}" + (f" (at value{where})" if where else ""))


def validator_class(schema):
    """jsonschema's validator for the draft `schema` declares (2020-12 without one), reading the
    keywords later drafts added as the grammar does: a draft-04 schema's `const` is a constant (its
    authors mean one; to draft-04 it is an unknown word, and a oneOf of two consts would match
    nothing), likewise `contains`, `propertyNames` and `if`/`then`/`else`."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    later = {k: v for k, v in jsonschema.Draft7Validator.VALIDATORS.items()
             if k in ("const", "contains", "propertyNames", "if") and k not in cls.VALIDATORS}
    return jsonschema.validators.extend(cls, later) if later else cls


def metaschema_error(schema) -> tuple[str, str] | None:
    """(what is wrong, its JSON pointer in `schema`) where `schema` is not valid against its
    metaschema, or None. Without `$schema`, any draft's metaschema will do (a tuple `items: [...]`
    is draft-07's, `exclusiveMinimum: true` draft-04's, and the grammar reads both)."""
    if not isinstance(schema, dict):
        return None if isinstance(schema, bool) else ("a JSON schema is an object or a boolean", "#")
    # by its text: the server checks a request's schemas on every request (tools come with each), and
    # the compiler again where its cache misses
    return _metaschema_error(json.dumps(schema, sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _metaschema_error(text: str) -> tuple[str, str] | None:
    import jsonschema

    schema = json.loads(text)
    if _rust_says_valid(schema):
        return None
    named = jsonschema.validators.validator_for(schema, default=None)
    drafts = [named] if named is not None else [jsonschema.Draft202012Validator, jsonschema.Draft201909Validator,
                                                jsonschema.Draft7Validator, jsonschema.Draft4Validator]
    errors = []
    for cls in drafts:
        err = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
        if err is None:
            return None
        errors.append(err)
    err = max(errors, key=lambda e: len(e.absolute_path))  # the draft that read furthest says most
    return err.message, "#" + "".join("/" + pointer_escape(str(p)) for p in err.absolute_path)


def _rust_says_valid(schema: dict) -> bool:
    """Whether jsonschema-rs finds `schema` valid against its metaschema (its `$schema`'s draft, else
    2020-12's): 300x faster than `jsonschema` (3 ms a tool's schema here, 0.5 s a compile of 128 tools
    before). Only its yes is taken; a no, an error or its absence leaves the answer, and the message
    and pointer, to `jsonschema` (tests/grammar/test_schema_errors.py checks the two agree)."""
    try:
        import jsonschema_rs
    except ImportError:  # (a platform without its wheel: the pure-Python check alone)
        return False
    try:
        return bool(jsonschema_rs.meta.is_valid(schema))
    except Exception:  # noqa: BLE001  (an unknown $schema, a remote $ref: the slow path decides)
        return False


def _format_checker():
    from jsonschema import FormatChecker

    checker = FormatChecker([f for f in ("idn-hostname", "idn-email") if f in FormatChecker.checkers])
    checker.checks("regex", raises=Exception)(_is_regex)
    checker.checks("hostname")(_is_hostname)
    return checker


def _is_regex(value) -> bool:
    import regex

    if isinstance(value, str):
        regex.compile(value)  # ECMA syntax as `regex` reads it; an error fails the format
    return True


def _is_hostname(value) -> bool:
    """RFC 1123: dot-separated labels of letters, digits and inner hyphens, at most 253 characters."""
    if not isinstance(value, str):
        return True
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def _search(pattern: str, text: str) -> bool:
    import regex

    try:
        return regex.search(_ecma(pattern), text) is not None  # (the module caches compiled patterns)
    except regex.error:
        return False  # a pattern no engine reads: the value fails rather than passing unchecked


@functools.lru_cache(maxsize=1024)
def _ecma(pattern: str) -> str:
    """`pattern` with ECMA-262's classes, as the grammar reads them (automata/regex.py): `\\d` and `\\w` are
    ASCII (`regex` would take any Unicode digit: Devanagari digits in a version number), `\\s` is
    ECMA's whitespace and line terminators, `.` stops at any line terminator."""
    def ranges(rs) -> str:
        return "".join(f"\\U{lo:08x}" + (f"-\\U{hi:08x}" if hi > lo else "") for lo, hi in rs)

    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            sub = {"d": "0-9", "w": "A-Za-z0-9_", "s": ranges(SPACE)}.get(e)
            if sub is not None:
                out.append(sub if in_class else f"[{sub}]")
            elif e in "DWS" and not in_class:
                out.append(f"[^{ {'D': '0-9', 'W': 'A-Za-z0-9_', 'S': ranges(SPACE)}[e] }]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            negated = pattern[i + 1:i + 2] == "^"
            if pattern[i + 1 + negated:i + 2 + negated] == "]":  # ECMA's empty class (Python's literal `]`)
                out.append("[\\U00000000-\\U0010ffff]" if negated else "(?!)")
                i += 2 + negated
                continue
            in_class = True
            out.append("[^" if negated else "[")
            i += negated
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        elif c == "." and not in_class:
            out.append(f"[{ranges(DOT)}]")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _multiple_of(validator, step, instance, schema):
    """In decimal, as the grammar counts (jsonschema divides floats: 0.07 / 0.01 is 7.000000000000001)."""
    from decimal import InvalidOperation

    from jsonschema import ValidationError

    if not validator.is_type(instance, "number"):
        return
    try:
        ok = (_decimal(instance) % _decimal(step)) == 0
    except (InvalidOperation, ValueError, ZeroDivisionError):
        ok = False
    if not ok:
        yield ValidationError(f"{instance!r} is not a multiple of {step!r}")


def _decimal(x):
    from decimal import Decimal

    return Decimal(repr(x)) if isinstance(x, float) else Decimal(x)


def _pattern(validator, pattern, instance, schema):
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns, instance, schema):
    if validator.is_type(instance, "object"):
        for pattern, sub in patterns.items():
            for k, v in instance.items():
                if _search(pattern, k):
                    yield from validator.descend(v, sub, path=k, schema_path=pattern)


def _additional_properties(validator, extra, instance, schema):
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    declared, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    others = [k for k in instance if k not in declared and not any(_search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for k in others:
            yield from validator.descend(instance[k], extra, path=k)
    elif extra is False and others:
        yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, sorted(others)))})")


_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()
MAX_CACHED = 128


def schema_check(schema, documents: dict | None = None) -> SchemaCheck:
    """The SchemaCheck of a schema, kept for the next output of the same schema."""
    key = json.dumps([schema, documents], sort_keys=True, default=str)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    check = SchemaCheck(schema, documents)
    with _LOCK:
        _CACHE[key] = check
        if len(_CACHE) > MAX_CACHED:
            _CACHE.popitem(last=False)
    return check
