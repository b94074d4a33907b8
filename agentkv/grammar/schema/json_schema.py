"""JSON Schema (draft 2020-12 and draft-07) -> grammar rules, exactly or not at all.

Output is one canonical style of JSON: compact by default, or spaced (`, ` and `: `, as `json.dumps`
writes it; schema/style.py has the model's choice between the two); flexible whitespace, capped per
run, as an option. Object
properties come in schema order (`properties`), each optional one skippable, then additional
properties (keys other than the declared ones) where `additionalProperties` allows them (it defaults
to true, as the spec says; `close_objects=True` makes it false). `$ref` targets become rules, so
recursion is exact; `allOf` is merged keyword by keyword (schema/merge.py); `anyOf` becomes
alternation; `oneOf` too where its branches provably exclude each other; objects are in
schema/objects.py. A validation keyword this compiler cannot enforce exactly is relaxed: dropped from
the grammar and recorded with its JSON pointer (schema/relaxed.py), or with `strict=True` a `GrammarError`.
Keywords outside the JSON Schema vocabularies are annotations (the spec says to ignore them).
"""

from __future__ import annotations

import json
import math
import time

from agentkv.errors import GrammarError
from agentkv.grammar.automata.dfa import language_matches
from agentkv.grammar.automata.expr import (
    EMPTY,
    NOTHING,
    Intersect,
    Ref,
    Repeat,
    alt,
    chars,
    lit,
    opt,
    seq,
    star,
)
from agentkv.grammar.schema.conditionals import DEPENDENCY_KEYS, ConditionalRules
from agentkv.grammar.schema.merge import (
    DEPENDENT,
    UNSUPPORTED,
    SchemaMerger,
    excluded_strings,
    json_equal,
    type_of,
    validating,
)
from agentkv.grammar.schema.numbers import (
    NUMBER,
    decimal,
    held_to_digits,
    integer_range,
    multiple_of,
    number_range,
)
from agentkv.grammar.schema.objects import (
    ObjectRules,
    dumps,
    python_dumps,
    schema_count,
)
from agentkv.grammar.schema.refs import SchemaResources
from agentkv.grammar.schema.relaxed import Relaxations
from agentkv.grammar.schema.strings import StringRules
from agentkv.grammar.schema.style import SEPARATORS
from agentkv.grammar.schema.validation import metaschema_error
from agentkv.grammar.schema.values import string_body

ALL_TYPES = ("object", "array", "string", "number", "boolean", "null")
# Keywords next to enum/const that are checked on each listed value (the others are refused there).
LISTED_VALUE_CHECKS = {"minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                       "exclusiveMaximum"}
MAX_INLINE_DEPTH = 60
MAX_COUNTED_ITEMS = 1000  # minItems / maxItems above this are relaxed (a state per item)


class JsonSchemaConverter(ObjectRules, ConditionalRules, SchemaMerger, StringRules, Relaxations):
    def __init__(self, schema, *, close_objects: bool = False, strict: bool = False, whitespace: bool = False,
                 max_whitespace: int = 16, deadline: float | None = None, prefix: str = "",
                 refs: SchemaResources | None = None, python_literals: bool = False, number_digits: int | None = None,
                 style: str = "compact"):
        """`close_objects`: `additionalProperties` false where it is not given. `strict`: refuse what
        the grammar cannot enforce exactly instead of relaxing it (schema/relaxed.py). `python_literals`:
        true, false and null written True, False and None (values of a pythonic tool call).
        `number_digits`: numbers have at most this many integer, fraction and exponent digits, beyond
        what the schema's own bounds need (a generation policy: a model cannot run a number on); None
        is exact to the spec. `style`: "compact" or "spaced", the separators written (schema/style.py;
        flexible `whitespace` takes either and more)."""
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object or a boolean, not {type(schema).__name__}")
        invalid = metaschema_error(schema)  # first: the rules below read keywords as the spec types them
        if invalid is not None:
            raise GrammarError(f"the schema is not valid JSON Schema: {invalid[0]}", invalid[1])
        self.refs = refs or SchemaResources(schema)  # `refs`: read with the documents a caller supplied
        self.root = self.refs.root  # its $refs rewritten to one absolute form (schema/refs.py)
        self.close_objects = close_objects
        self.python_literals = python_literals
        if number_digits is not None and (isinstance(number_digits, bool) or not isinstance(number_digits, int)
                                          or number_digits < 1):
            raise GrammarError(f"number_digits must be a positive integer or None, not {number_digits!r}")
        self.number_digits = number_digits
        self._init_relaxations(strict)
        self.ws = Repeat(chars(" ", "\t", "\n", "\r"), 0, max_whitespace) if whitespace else EMPTY
        if style not in SEPARATORS:
            raise GrammarError(f"a converter writes one style, 'compact' or 'spaced', not {style!r}")
        self.separators = SEPARATORS[style]
        self.separated = False  # whether a separator was written (schema/style.py keeps one copy if not)
        self.rules: dict[str, object] = {}
        self.depth = 0
        self._by_content: dict[str, str] = {}
        self.prefix = prefix  # rule names are prefixed (a Lark grammar may hold several schemas)
        self.deadline = deadline if deadline is not None else time.monotonic() + 10.0

    # -- entry ------------------------------------------------------------------------------------

    def convert(self) -> dict[str, object]:
        self.rules[self.prefix + "root"] = seq(self.ws, self.value(self.root, "#"), self.ws) \
            if self.ws != EMPTY else self.value(self.root, "#")
        return self.rules

    def punct(self, text: str):
        if self.ws != EMPTY:
            return seq(self.ws, lit(text), self.ws)
        if text in ",:":
            self.separated = True
            text = self.separators[text == ":"]
        return lit(text)

    # -- references -------------------------------------------------------------------------------

    def resolve(self, ref: str, where: str) -> tuple[object, str]:
        # A document not given is a GrammarError even when relaxing: nothing could check a value
        # there either, and SchemaStore shows both ways of pretending cost real instances.
        return self.refs.resolve(ref, where)  # schema/refs.py

    def ref_rule(self, ref: str, where: str) -> Ref:
        target, ptr = self.resolve(ref, where)
        name = f"{self.prefix}ref:{ptr}"
        if name not in self.rules:
            self.rules[name] = NOTHING  # placeholder: recursion reaches the name, not the body
            self.rules[name] = self.value(target, ptr)
        return Ref(name)

    # -- schemas ----------------------------------------------------------------------------------

    def value(self, schema, ptr: str):
        self.depth += 1
        try:
            if self.depth > MAX_INLINE_DEPTH:
                raise GrammarError("schema nesting too deep: a recursive $ref is merged with sibling keywords "
                                   "(allOf/anyOf), which would have to be inlined forever; move the siblings "
                                   "into the referenced definition", ptr)
            return self._value(schema, ptr)
        finally:
            self.depth -= 1

    def _value(self, schema, ptr: str):
        if schema is True:
            return self.any_value()
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise GrammarError(f"a schema must be an object or a boolean, not {type(schema).__name__}", ptr)
        folded = self.without_not(schema, ptr)  # schema/conditionals.py
        if folded is not None:
            return self.value(folded, ptr)
        schema = self._enforceable(schema, ptr)
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            if not validating(rest):
                return self.ref_rule(schema["$ref"], f"{ptr}/$ref")
            target, _ = self.resolve(schema["$ref"], f"{ptr}/$ref")
            return self.value(self.merge(target, rest, ptr), ptr)
        if any(k in schema for k in DEPENDENCY_KEYS):
            return self.value(self.dependency_cases(schema, ptr), ptr)  # schema/conditionals.py
        parts = schema.get("allOf")
        if "if" in schema or isinstance(parts, list) and any(
                isinstance(p, dict) and "if" in _as_dict(self.inline_ref(p, f"{ptr}/allOf/{i}"))
                for i, p in enumerate(parts)):
            return self.value(self.conditional_cases(schema, ptr), ptr)  # schema/conditionals.py
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for i, part in enumerate(_list(schema["allOf"], f"{ptr}/allOf")):
                merged = self.merge(merged, self.inline_ref(part, f"{ptr}/allOf/{i}"), f"{ptr}/allOf/{i}")
            return self.value(merged, ptr)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                branches = written = _list(schema[key], f"{ptr}/{key}")
                if validating(rest):  # siblings apply to every branch (and may make them exclusive)
                    branches = [self.merge(rest, self.inline_ref(b, f"{ptr}/{key}/{i}"), f"{ptr}/{key}/{i}")
                                for i, b in enumerate(branches)]
                    if "type" in rest:  # the sibling type alone, which leaves the branches' keywords as written
                        written = [self.merge({"type": rest["type"]}, self.inline_ref(b, f"{ptr}/{key}/{i}"),
                                              f"{ptr}/{key}/{i}") for i, b in enumerate(written)]
                # Branches apart with only part of the siblings merged in stay apart with all of them (each
                # only narrows); the full merge can hide what told them apart (a const inside an allOf).
                if (
                    key == "oneOf"
                    and not self.disjoint(branches)
                    and not (branches is not written and self.disjoint(written))
                ):
                    cases = self.one_of_cases(rest, schema[key], f"{ptr}/oneOf")  # schema/conditionals.py
                    if cases is not None:
                        return self.value(cases, ptr)
                    self.relax("oneOf", f"{ptr}/oneOf", "oneOf branches that may overlap cannot be enforced as "
                               "'exactly one' (the grammar takes them as anyOf); make them exclusive (distinct "
                               "types or const/enum values) or use anyOf")
                return alt(*[self.value(b, f"{ptr}/{key}/{i}") for i, b in enumerate(branches)])
        if "const" in schema or "enum" in schema:
            return self.enum(schema, ptr)
        types = schema.get("type", list(ALL_TYPES))
        types = [types] if isinstance(types, str) else list(types)
        if schema.get("nullable") is True and "null" not in types:
            types.append("null")
        for t in types:
            if t not in ALL_TYPES + ("integer",):
                raise GrammarError(f"unknown type '{t}'", f"{ptr}/type")
        parts = []
        if "number" in types:
            types = [t for t in types if t != "integer"]
        for t in types:
            parts.append(getattr(self, f"t_{t}")(schema, ptr))
        return alt(*parts)

    def _enforceable(self, schema: dict, ptr: str) -> dict:
        """`schema` without the keywords no grammar enforces exactly (each relaxed)."""
        dropped = []
        for k, v in schema.items():
            if k in UNSUPPORTED:
                if k == "uniqueItems" and v is False or k == "not" and excluded_strings(v) is not None:
                    continue
                self.relax(k, f"{ptr}/{k}", f"keyword '{k}' is not supported: a grammar cannot enforce it exactly")
                dropped.append(k)
            elif k in DEPENDENT and DEPENDENT[k] in schema:
                dropped.append(k)  # with the keyword it depends on, relaxed above
        return {k: v for k, v in schema.items() if k not in dropped} if dropped else schema

    # -- values -------------------------------------------------------------------------------------

    def any_value(self):
        name = self.prefix + "json:any"
        if name not in self.rules:
            self.rules[name] = NOTHING
            ANY = Ref(name)  # noqa: N806
            kv = seq(self.string_expr(string_body()), self.punct(":"), ANY)
            obj = seq(self.punct("{"), opt(seq(kv, star(seq(self.punct(","), kv)))), self.punct("}"))
            arr = seq(self.punct("["), opt(seq(ANY, star(seq(self.punct(","), ANY)))), self.punct("]"))
            self.rules[name] = alt(obj, arr, self.string_expr(string_body()), self._digits(NUMBER, {}, False, None),
                                   lit(self.literal(True)), lit(self.literal(False)), lit(self.literal(None)))
        return Ref(name)

    def string_expr(self, body):
        return seq(lit('"'), body, lit('"'))

    def enum(self, schema: dict, ptr: str):
        values = [schema["const"]] if "const" in schema else _list(schema["enum"], f"{ptr}/enum")
        if "const" in schema and "enum" in schema:
            values = [v for v in values if any(json_equal(v, e) for e in schema["enum"])]
        excluded = excluded_strings(schema.get("not")) or []
        values = [v for v in values if not (isinstance(v, str) and v in excluded)]
        extra = [k for k in schema if validating({k: schema[k]}) and k not in ("enum", "const", "type", "nullable")
                 and not (k == "not" and excluded_strings(schema[k]) is not None)]
        for k in extra:
            if k not in LISTED_VALUE_CHECKS:
                self.relax(k, f"{ptr}/{k}", f"enum/const together with '{k}' is not supported (the listed "
                           "values are not checked against it); list only the allowed values")
        extra = [k for k in extra if k in LISTED_VALUE_CHECKS]
        if extra:  # string and number keywords next to the list: keep the values that meet them
            lang = self.string_language(schema, ptr)
            lo, lo_x, hi, hi_x = self._bounds(schema, ptr)
            values = [v for v in values if _meets(v, lang, lo, lo_x, hi, hi_x, self.deadline)]
        types = schema.get("type")
        if types is not None:
            types = {types} if isinstance(types, str) else set(types)
            if schema.get("nullable") is True:
                types.add("null")
            values = [v for v in values if type_of(v) in types or (type_of(v) == "integer" and "number" in types)]
        return alt(*[lit(self.literal(v)) for v in values])

    def literal(self, value) -> str:
        """A listed value as the grammar writes it: JSON in the grammar's style, or with Python's literals."""
        if isinstance(value, (dict, list)) and value:
            self.separated = True
        return python_dumps(value, self.separators) if self.python_literals else dumps(value, self.separators)

    def t_null(self, schema, ptr):
        return lit(self.literal(None))

    def t_boolean(self, schema, ptr):
        return alt(lit(self.literal(True)), lit(self.literal(False)))

    def _bounds(self, schema, ptr):
        lo, lo_x = schema.get("minimum"), False
        hi, hi_x = schema.get("maximum"), False
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            v = schema.get(key)
            if isinstance(v, bool):  # draft-04 form: a flag on minimum/maximum
                if key == "exclusiveMinimum":
                    lo_x = v
                else:
                    hi_x = v
            elif v is not None:
                if not isinstance(v, (int, float)):
                    raise GrammarError(f"{key} must be a number", f"{ptr}/{key}")
                if key == "exclusiveMinimum" and (lo is None or v >= lo):
                    lo, lo_x = v, True
                if key == "exclusiveMaximum" and (hi is None or v <= hi):
                    hi, hi_x = v, True
        for name, v in (("minimum", lo), ("maximum", hi)):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
                raise GrammarError(f"{name} must be a finite number", f"{ptr}/{name}")
        return lo, lo_x, hi, hi_x

    def t_integer(self, schema, ptr):
        lo, lo_x, hi, hi_x = self._bounds(schema, ptr)
        ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
        ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
        numbers = self._multiples(integer_range(ilo, ihi), schema, True, ptr)
        return numbers if ilo is not None and ihi is not None else self._digits(numbers, schema, True, ptr, ilo, ihi)

    def t_number(self, schema, ptr):
        lo, lo_x, hi, hi_x = self._bounds(schema, ptr)
        numbers = self._multiples(number_range(lo, lo_x, hi, hi_x, ptr), schema, False, ptr)
        return self._digits(numbers, schema, False, ptr, lo, hi)

    def _digits(self, numbers, schema: dict, integer: bool, ptr: str | None, *bounds):
        """`numbers` held to `number_digits` digits (schema/numbers.py), the caps grown to hold the
        schema's own bounds and multipleOf step."""
        if self.number_digits is None:
            return numbers
        given = (*bounds, schema.get("multipleOf"))
        exact = [decimal(v, ptr) for v in given if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return held_to_digits(numbers, self.number_digits, integer, exact)

    def _multiples(self, numbers, schema: dict, integer: bool, ptr: str):
        """`numbers` less those that are not multiples of the schema's `multipleOf` (schema/numbers.py)."""
        step = schema.get("multipleOf")
        if step is None:
            return numbers
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise GrammarError("multipleOf must be a number", f"{ptr}/multipleOf")
        machine = multiple_of(step, integer, f"{ptr}/multipleOf")
        if machine is None:
            self.relax(
                "multipleOf", f"{ptr}/multipleOf", f"multipleOf {step} needs too many remainders to track in a grammar")
            return numbers
        return Intersect(numbers, machine)

    def t_array(self, schema, ptr):
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if isinstance(items, list):  # draft-07 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix = prefix or []
        lo = schema_count(schema, "minItems", ptr) or 0
        hi = schema_count(schema, "maxItems", ptr)
        if items is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and hi < lo:
            return NOTHING
        for key, bound in (("minItems", lo), ("maxItems", hi)):
            if bound is not None and bound > MAX_COUNTED_ITEMS:
                self.relax(key, f"{ptr}/{key}",
                           f"{key} {bound} is above the {MAX_COUNTED_ITEMS} items a grammar counts exactly")
                lo, hi = (0, hi) if key == "minItems" else (lo, None)
        elems = [self.rule_for(p, f"{ptr}/prefixItems/{i}") for i, p in enumerate(prefix)]
        item = self.rule_for(items, f"{ptr}/items") if items is not False else NOTHING
        comma = self.punct(",")

        def tail(i: int):
            if i >= len(elems):
                need = max(lo - i, 0)
                more = None if hi is None else hi - i
                if more is not None and more <= 0:
                    return EMPTY
                if i == 0:
                    first = seq(item, Repeat(seq(comma, item), max(need - 1, 0), None if more is None else more - 1))
                    return first if need else opt(first)
                return Repeat(seq(comma, item), need, more)
            if hi is not None and i >= hi:
                return EMPTY
            head = seq(comma if i else EMPTY, elems[i], tail(i + 1))
            return head if i < lo else opt(head)

        out = seq(self.punct("["), tail(0), self.punct("]"))
        tail = None  # (a recursive closure is a reference cycle: emptied, its scope is freed now, not by the collector)
        return out

    def rule_for(self, schema, ptr: str):
        """A sub-schema as a rule of its own (a call), so repeated or shared use does not copy it."""
        if isinstance(schema, dict) and set(schema) == {"$ref"}:
            return self.ref_rule(schema["$ref"], f"{ptr}/$ref")
        if schema is True or (isinstance(schema, dict) and not validating(schema)):
            return self.any_value()
        # Equal sub-schemas (config files repeat one shape under many names) share one rule:
        # $refs are in one absolute form (schema/refs.py), so equal text means an equal language.
        # Keys unsorted: members are written in their declared order, which the text keeps.
        key = json.dumps(schema)
        name = self._by_content.get(key)
        if name is None:
            name = self._by_content[key] = f"{self.prefix}at:{ptr}"
            self.rules[name] = NOTHING
            self.rules[name] = self.value(schema, ptr)
        return Ref(name)


def _meets(value, lang, lo, lo_x: bool, hi, hi_x: bool, deadline: float) -> bool:
    """Does a listed value meet a string language (None: any string) and numeric bounds?"""
    if isinstance(value, str):
        return lang is None or language_matches(lang, value, deadline)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return not (lo is not None and (value < lo or lo_x and value == lo)
                    or hi is not None and (value > hi or hi_x and value == hi))
    return True  # string and number keywords do not apply to other types


def _as_dict(schema) -> dict:
    return schema if isinstance(schema, dict) else {}


def _list(v, ptr: str) -> list:
    if not isinstance(v, list) or not v and "enum" not in ptr:
        raise GrammarError("expected a non-empty array", ptr)
    return v
