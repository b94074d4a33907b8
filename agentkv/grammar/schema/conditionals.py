"""Conditionals, dependencies, `oneOf` apart by required names, and `not`, rewritten exactly as unions of cases.

The form real schemas use (SchemaStore's Minecraft, Cloudify, ...) is a list of conditionals that
each test one property against listed values, directly or inside `allOf`:

    "allOf": [{"if": {"properties": {"type": {"const": "a"}}}, "then": {...}},
              {"if": {"properties": {"type": {"const": "b"}}, "required": ["type"]}, "then": {...}, "else": {...}}]

An `if` like that holds for an object whose property `k` has one of the values, for an object without
`k` unless the `if` requires it, and for every non-object. So the instances split into cases, in each
of which every `if` is decided: `k` equal to one listed value (for each value), `k` with a value no
conditional lists (the schema's own values for `k` less the listed ones, or, where the listed values
are strings, any value but those: a `not` of strings, which agentkv enforces), `k` absent, and
non-objects.
Each case is the rest of the schema merged with the `then` or `else` of every conditional (allOf
arithmetic, schema/merge.py), and the schema is their union. Any other `if` is a `GrammarError`.

Dependencies (`dependentRequired`, `dependentSchemas`, draft-07 `dependencies`) split the same way,
by which of the named properties are present (2^n cases, so at most MAX_PRESENCE_NAMES of them), and
so does a `oneOf` whose object branches differ only in `required`. A `not` of a type or of a test of
required and typed properties is rewritten as the schema for what that test refuses.
"""

from __future__ import annotations

from agentkv.errors import GrammarError
from agentkv.grammar.schema.merge import (
    excluded_strings,
    json_equal,
    validating,
    value_types,
)
from agentkv.grammar.schema.objects import pointer_escape

CONDITIONAL_KEYS = ("if", "then", "else")
DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
MAX_PRESENCE_NAMES = 4  # properties with dependencies, or telling oneOf branches apart: 2^n cases
NON_OBJECT = ["array", "string", "number", "boolean", "null"]
MAX_NEGATION_DEPTH = 16


class ConditionalRules:
    """Mixed into the converter (schema/json_schema.py), which supplies merge, inline_ref and value."""

    def dependency_cases(self, schema: dict, ptr: str) -> object:
        """`dependentRequired` / `dependentSchemas` (and draft-07 `dependencies`, either form) as the
        union of cases by which of the named properties are present: in each, the present ones are
        required and bring their dependencies, the others are absent; non-objects are unaffected."""
        deps: dict[str, list] = {}
        for key in DEPENDENCY_KEYS:
            spec = schema.get(key)
            if spec is None:
                continue
            if not isinstance(spec, dict):
                raise GrammarError(f"{key} must be an object", f"{ptr}/{key}")
            for name, need in spec.items():
                where = f"{ptr}/{key}/{pointer_escape(name)}"
                if isinstance(need, list) and key != "dependentSchemas":
                    if not all(isinstance(n, str) for n in need):
                        raise GrammarError("a dependency lists property names (strings)", where)
                    deps.setdefault(name, []).append({"required": need} if need else True)
                elif key == "dependentRequired":
                    raise GrammarError("dependentRequired maps a name to an array of names", where)
                else:
                    deps.setdefault(name, []).append(self.inline_ref(need, where))
        rest = {k: v for k, v in schema.items() if k not in DEPENDENCY_KEYS}
        if len(deps) > MAX_PRESENCE_NAMES:
            key = next(k for k in DEPENDENCY_KEYS if k in schema)
            self.relax(key, f"{ptr}/{key}", f"dependencies on {len(deps)} properties of one object: a grammar "
                       f"enforces them on up to {MAX_PRESENCE_NAMES} (each presence combination is a case)")
            return rest
        names = list(deps)
        cases = []
        for bits in range(2 ** len(names)):
            present = [n for j, n in enumerate(names) if bits >> j & 1]
            merged = self.merge(rest, _presence(names, present), ptr)
            for name in present:
                for need in deps[name]:
                    merged = merged if merged is False else self.merge(merged, need, ptr)
            cases.append(merged)
        if _admits_non_objects(rest):
            cases.append(self.merge(rest, {"type": NON_OBJECT}, ptr))
        return _union(cases)

    def one_of_cases(self, rest: dict, branches: list, ptr: str) -> object | None:
        """A `oneOf` whose object branches differ only in `required` (as written; `rest`, the keywords
        beside the `oneOf`, applies to all), beside branches of other types told apart by the usual
        test, as the union of presence cases: an object matches exactly the branches whose required
        names it has, so for each combination of the names that tell the branches apart the object is
        valid where exactly one branch matches. None where the branches are not of that form."""
        raw = [self.inline_ref(b, f"{ptr}/{i}") for i, b in enumerate(branches)]
        merged = [self.merge(rest, b, f"{ptr}/{i}") for i, b in enumerate(raw)]
        objects = [i for i, m in enumerate(merged) if isinstance(m, dict) and value_types(m) == {"object"}]
        others = [m for i, m in enumerate(merged) if i not in objects]
        if len(objects) < 2 or any(not isinstance(raw[i], dict) for i in objects) or any(
                not isinstance(m, dict) or "object" in (value_types(m) or {"object"}) for m in others):
            return None
        if len(others) > 1 and not self.disjoint(others):
            return None
        required = [raw[i].get("required", []) for i in objects]
        if not all(isinstance(r, list) and all(isinstance(n, str) for n in r) for r in required):
            return None
        shared = [{k: v for k, v in raw[i].items() if k != "required" and validating({k: v})} for i in objects]
        if not all(json_equal(s, shared[0]) for s in shared[1:]):
            return None
        base = self.merge(rest, shared[0], ptr)
        common = [n for n in required[0] if all(n in r for r in required[1:])]
        names = list(dict.fromkeys(n for r in required for n in r if n not in common))
        if len(names) > MAX_PRESENCE_NAMES:
            return None
        cases = []
        for bits in range(2 ** len(names)):
            present = {n for j, n in enumerate(names) if bits >> j & 1}
            if sum(set(r) - set(common) <= present for r in required) == 1:
                cases.append(self.merge(base, _presence(names, common + sorted(present)), ptr))
        return _union(cases + others)

    def without_not(self, schema, ptr: str) -> object | None:
        """`schema` with its `not` (of anything but listed strings, which string rules subtract
        themselves) replaced by the schema for what that `not` refuses, merged in; None where there
        is no such `not` or it cannot be negated (the caller refuses it)."""
        if not isinstance(schema, dict) or "not" not in schema or excluded_strings(schema["not"]) is not None:
            return None
        neg = self.negation(schema["not"], f"{ptr}/not")
        return None if neg is None else self.merge({k: v for k, v in schema.items() if k != "not"}, neg, ptr)

    def negation(self, schema, ptr: str, depth: int = 0) -> object | None:
        """A schema for exactly the values `schema` refuses, where `schema` is a `type`, a test of
        required or typed properties (`{"required": [...], "properties": {...}}`), `anyOf` of such
        (each negated, all merged), true or false; None for any other form (the caller refuses it),
        and for tests nested deeper than MAX_NEGATION_DEPTH (a `$ref` cycle through `properties`)."""
        if depth > MAX_NEGATION_DEPTH:
            return None
        schema = self.inline_ref(schema, ptr)
        if schema is True or isinstance(schema, dict) and not validating(schema):
            return False
        if schema is False:
            return {}
        if not isinstance(schema, dict):
            return None
        keys = {k for k in schema if validating({k: schema[k]})}
        if keys == {"anyOf"} and isinstance(schema["anyOf"], list):
            out = {}
            for i, part in enumerate(schema["anyOf"]):
                neg = self.negation(part, f"{ptr}/anyOf/{i}", depth + 1)
                if neg is None:
                    return None
                out = self.merge(out, neg, ptr)
            return out
        types = value_types(schema) if "type" in keys else None
        if keys == {"type"}:
            if "integer" in types and "number" not in types:
                return None  # "not an integer" includes 1.5: no type names that
            rest = [t for t in NON_OBJECT + ["object"] if t not in types]
            return {"type": rest} if rest else False
        required, props = schema.get("required", []), schema.get("properties", {})
        if not keys <= {"type", "required", "properties"} or types not in (None, {"object"}) or \
                not isinstance(required, list) or not isinstance(props, dict):
            return None
        # An object fails the test where a required name is missing or a present property fails its
        # schema; a non-object fails it only where the test says "type": "object".
        cases = [{"type": "object", "properties": {n: False}} for n in required if isinstance(n, str)]
        for name, sub in props.items():
            neg = self.negation(sub, f"{ptr}/properties/{pointer_escape(name)}", depth + 1)
            if neg is None:
                return None
            if neg is not False:
                cases.append({"type": "object", "required": [name], "properties": {name: neg}})
        if types is not None:
            cases.append({"type": NON_OBJECT})
        return _union(cases)

    def split_conditionals(self, schema: dict, ptr: str) -> tuple[dict, list[tuple[dict, object, object, str]]]:
        """(the schema without its conditionals, its `allOf` merged in; the conditionals as (if, then,
        else, pointer)), from its own `if` and from its `allOf` parts (a part's other keywords stay)."""
        rest = {k: v for k, v in schema.items() if k not in CONDITIONAL_KEYS and k != "allOf"}
        found = []
        if "if" in schema:
            found.append((schema["if"], schema.get("then", True), schema.get("else", True), ptr))
        parts = schema.get("allOf", [])
        if not isinstance(parts, list):
            raise GrammarError("allOf must be an array of schemas", f"{ptr}/allOf")
        for i, part in enumerate(parts):
            where = f"{ptr}/allOf/{i}"
            part = self.inline_ref(part, where)
            if isinstance(part, dict) and "if" in part:
                found.append((part["if"], part.get("then", True), part.get("else", True), where))
                part = {k: v for k, v in part.items() if k not in CONDITIONAL_KEYS}
            rest = self.merge(rest, part, where)
        return rest, found

    def conditional_cases(self, schema: dict, ptr: str) -> object:
        """The schema as `anyOf` of cases in which every conditional is decided (module docstring);
        where the conditionals are not of that form, the schema without them (they are relaxed)."""
        rest, conds = self.split_conditionals(schema, ptr)
        if rest is False:
            return False
        try:
            return self._decided_cases(rest, conds, ptr)
        except GrammarError as e:
            if self.strict or self._probing:
                raise
            self.relax("if", e.pointer or ptr, str(e).rsplit(" (at ", 1)[0])
            return rest

    def _decided_cases(self, rest: dict, conds: list, ptr: str) -> object:
        tests = [_discriminator(c[0], f"{c[3]}/if") for c in conds]
        names = {name for name, _, _ in tests}
        if len(names) != 1:
            raise GrammarError("if/then/else is enforced where every `if` tests the same property against "
                               f"listed values (here: {', '.join(sorted(names))}); merge them into one", ptr)
        name = names.pop()
        listed = []
        for _, values, _ in tests:
            listed += [v for v in values if not any(json_equal(v, w) for w in listed)]

        def case(extra: dict, holds) -> object:
            merged = self.merge(rest, extra, ptr)
            for (_, then, other, where), ok in zip(conds, holds):
                branch = then if ok else other
                if branch is False or merged is False:
                    return False
                if branch is not True:
                    merged = self.merge(merged, self.inline_ref(branch, where), where)
            return merged

        # Objects (each case says so: the cases must not also admit other values) with `name` present
        # and a value some `if` lists: the `if`s listing that value hold.
        cases = [case({"type": "object", "properties": {name: {"const": v}}, "required": [name]},
                      [any(json_equal(v, w) for w in values) for _, values, _ in tests]) for v in listed]
        # `name` present with any other value: every `if` fails.
        props = rest.get("properties")
        own = self.inline_ref(props.get(name, True) if isinstance(props, dict) else True,
                              f"{ptr}/properties/{pointer_escape(name)}")
        if isinstance(own, dict) and ("const" in own or "enum" in own):
            others = [v for v in ([own["const"]] if "const" in own else own["enum"])
                      if not any(json_equal(v, w) for w in listed)]
            other = {"enum": others} if others else None
        elif all(isinstance(v, str) for v in listed):
            other = {"not": {"enum": listed}}  # any value but the listed strings (a `not` agentkv enforces)
        else:
            raise GrammarError(f"if/then/else on property '{name}' with values that are not all strings: list "
                               "the property's values (`enum`) in the schema, so the values no `if` names are known",
                               ptr)
        if other is not None:
            none_hold = [False] * len(conds)
            cases.append(case({"type": "object", "properties": {name: other}, "required": [name]}, none_hold))
        # `name` absent: the `if`s that do not require it hold.
        rest_required = rest.get("required")
        if not (isinstance(rest_required, list) and name in rest_required):
            unrequired = [not required for _, _, required in tests]
            cases.append(case({"type": "object", "properties": {name: False}}, unrequired))
        # Not an object: every `if` holds (its `properties` say nothing about other values).
        if _admits_non_objects(rest):
            cases.append(case({"type": NON_OBJECT}, [True] * len(conds)))
        return _union(cases)


def _presence(names: list[str], present: list[str]) -> dict:
    """Objects with the `present` names and none of the other `names`."""
    return {"type": "object", "required": present, "properties": {n: False for n in names if n not in present}}


def _admits_non_objects(schema: dict) -> bool:
    types = schema.get("type")
    return types is None or bool(set([types] if isinstance(types, str) else types) - {"object"})


def _union(cases: list) -> object:
    """`anyOf` of the cases that admit something (False where none does)."""
    kept = [c for c in cases if c is not False]
    return {"anyOf": kept} if kept else False


def _discriminator(cond, ptr: str) -> tuple[str, list, bool]:
    """(property, listed values, whether the `if` requires the property) of an `if` that tests one
    property against listed values: `{"properties": {k: {"const": v}}}` or `{"enum": [...]}`, with
    `"required": [k]` or not, or an `anyOf` of such tests on the same property."""
    if isinstance(cond, dict) and set(cond) <= {"anyOf"} | _annotations(cond) and isinstance(cond.get("anyOf"), list):
        parts = [_discriminator(c, f"{ptr}/anyOf/{i}") for i, c in enumerate(cond["anyOf"])]
        if parts and len({p[0] for p in parts}) == 1:
            return parts[0][0], [v for p in parts for v in p[1]], all(p[2] for p in parts)
    props = cond.get("properties") if isinstance(cond, dict) else None
    other = [k for k in cond if k not in ("properties", "required") and validating({k: cond[k]})] \
        if isinstance(cond, dict) else ["(not an object)"]
    if other or not isinstance(props, dict) or len(props) != 1:
        raise GrammarError("an `if` is enforced only when it tests one property against listed values "
                           '({"properties": {"k": {"const": ...}}}, optionally "required": ["k"])', ptr)
    (name, test), = props.items()
    if not isinstance(test, dict) or ("const" not in test and "enum" not in test) or \
            any(k not in ("const", "enum", "type") and validating({k: test[k]}) for k in test):
        raise GrammarError(f"the `if` on property '{name}' is enforced only with const or enum", f"{ptr}/properties")
    values = [test["const"]] if "const" in test else list(test["enum"])
    required = cond.get("required", [])
    if any(r != name for r in required):
        raise GrammarError("an `if` may require only the property it tests", f"{ptr}/required")
    return name, values, name in required


def _annotations(schema: dict) -> set:
    return {k for k in schema if not validating({k: schema[k]})}
