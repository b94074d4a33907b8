"""allOf arithmetic on JSON schemas: merging two schemas into one, and telling oneOf branches apart.

`SchemaMerger.merge(a, b)` writes one schema that accepts exactly what both accept (types intersect,
bounds tighten, properties merge with each side's additionalProperties applied to the other's
names, arrays merge position by position), raising `GrammarError` where that cannot be written.
`disjoint(branches)` is a sound (not complete) test that no instance matches two oneOf branches
(distinct types or values, listed values that each fail the other branch, discriminators).
The converter (schema/json_schema.py) inherits these; it supplies `resolve` for `$ref` and
`string_language` (a string schema's language, for telling string branches apart exactly).
"""

from __future__ import annotations

from agentkv.errors import GrammarError
from agentkv.grammar.automata.dfa import is_empty, language_matches
from agentkv.grammar.automata.expr import Intersect
from agentkv.grammar.automata.regex import search_expr

ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples", "example",
               "deprecated", "readOnly", "writeOnly", "$anchor", "$dynamicAnchor", "$defs", "definitions",
               "contentEncoding", "contentMediaType", "contentSchema", "$vocabulary", "discriminator"}
# Keywords no grammar enforces exactly (relaxed: dropped and validated after; schema/json_schema.py), and
# `not` where schema/conditionals.py cannot rewrite it.
UNSUPPORTED = {"not", "contains", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
               "uniqueItems"}
# Keywords that only mean something next to another one (minContains without contains is ignored;
# then/else without if likewise, and with it they are schema/conditionals.py's).
DEPENDENT = {"minContains": "contains", "maxContains": "contains"}
OBJECT_KEYS = {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
               "patternProperties", "propertyNames"}
ARRAY_KEYS = {"items", "prefixItems", "additionalItems", "minItems", "maxItems"}
STRING_KEYS = {"minLength", "maxLength", "pattern", "format"}
NUMBER_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
MAX_BRANCHES = 256
MAX_MERGE_DEPTH = 64


class SchemaMerger:
    """Mixed into the converter, which provides `resolve(ref, where) -> (schema, pointer)` and
    `string_language(schema, where)`."""

    def inline_ref(self, schema, ptr: str, depth: int = 0):
        """`schema` with a top-level $ref replaced by its target merged with the siblings (for allOf/anyOf merges)."""
        while isinstance(schema, dict) and "$ref" in schema:
            if depth > 32:
                raise GrammarError("$ref chain too deep or circular inside allOf/anyOf", ptr)
            target, _ = self.resolve(schema["$ref"], f"{ptr}/$ref")
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = self.merge(self.inline_ref(target, ptr, depth + 1), rest, ptr) if rest else target
            depth += 1
        return schema

    def merge(self, a, b, ptr: str):
        """One schema accepting exactly what both accept (what cannot be written is relaxed: the
        result then accepts more, and the relaxation is recorded)."""
        depth = getattr(self, "_merge_depth", 0)
        if depth > MAX_MERGE_DEPTH:  # allOf parts whose $refs lead back to themselves
            raise GrammarError("allOf nested too deeply, or circular through $ref; merge the parts by hand", ptr)
        self._merge_depth = depth + 1
        try:
            return self._merge(a, b, ptr)
        finally:
            self._merge_depth = depth

    def _merge(self, a, b, ptr: str):
        a, b = self.inline_ref(a, ptr), self.inline_ref(b, ptr)  # (a $ref may lead to true or false)
        if a is True or (isinstance(a, dict) and not validating(a)):
            return b if b is not True else {}
        if b is True or (isinstance(b, dict) and not validating(b)):
            return a
        if a is False or b is False:
            return False
        if "allOf" in a or "allOf" in b:
            out = {k: v for k, v in a.items() if k != "allOf"}
            for part in [*a.get("allOf", []), {k: v for k, v in b.items() if k != "allOf"}, *b.get("allOf", [])]:
                out = self.merge(out, self.inline_ref(part, ptr), ptr)
            return out
        out = dict(a)
        for k, v in b.items():
            if k in ANNOTATIONS or k not in out:
                out[k] = v
                continue
            u = out[k]
            if u == v:
                continue
            if k == "type":
                ta = {u} if isinstance(u, str) else set(u)
                tb = {v} if isinstance(v, str) else set(v)
                both = (ta & tb) | ({"integer"} if ("integer" in ta and "number" in tb) or
                                    ("number" in ta and "integer" in tb) else set())
                out[k] = sorted(both)
            elif k in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"):
                out[k] = max(u, v)
            elif k in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"):
                out[k] = min(u, v)
            elif k == "required":
                out[k] = list(dict.fromkeys([*u, *v]))
            elif k == "enum":
                out[k] = [x for x in u if any(json_equal(x, y) for y in v)]
            elif k == "const":
                out["enum"] = [u] if json_equal(u, v) else []
                del out["const"]
            elif k == "properties":
                continue  # below, with additionalProperties
            elif k in ("items", "prefixItems", "additionalItems"):
                continue  # below, position by position
            elif k == "additionalProperties":
                out[k] = {"allOf": [u, v]}
            elif k in ("anyOf", "oneOf"):
                if len(u) * len(v) > MAX_BRANCHES:  # one side's branches alone: a superset of the merge
                    self.relax(k, f"{ptr}/{k}", f"merging {k} lists gives {len(u) * len(v)} branches "
                               f"(limit {MAX_BRANCHES})")
                    continue
                if k == "oneOf" and not (self.disjoint(u) and self.disjoint(v)):
                    self.relax("oneOf", f"{ptr}/oneOf", "oneOf branches that may overlap cannot be enforced as "
                               "'exactly one' (the grammar takes them as anyOf)")
                out["anyOf"] = [{"allOf": [x, y]} for x in u for y in v]
                out.pop("oneOf", None)
            elif k == "pattern":
                out["allOf"] = [*out.get("allOf", []), {"pattern": v}]
            elif k == "not" and excluded_strings(u) is not None and excluded_strings(v) is not None:
                first = excluded_strings(u)
                out[k] = {"enum": first + [x for x in excluded_strings(v) if x not in first]}
            elif k == "not":  # neither A nor B: not (A or B)
                out[k] = {"anyOf": [u, v]}
            elif k == "multipleOf" and _number(u) and _number(v):
                out[k] = _common_multiple(u, v)
            else:  # one side's value alone: a superset of the merge
                self.relax(k, f"{ptr}/{k}", f"allOf: the two values of '{k}' ({u!r} and {v!r}) cannot be merged "
                           "into one")
        if "properties" in a or "properties" in b or "additionalProperties" in a or "additionalProperties" in b:
            pa, pb = a.get("properties", {}), b.get("properties", {})
            xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
            props = {}
            for name in dict.fromkeys([*pa, *pb]):
                sa = pa.get(name, xa)
                sb = pb.get(name, xb)
                props[name] = sa if sb is True else sb if sa is True else {"allOf": [sa, sb]}
            if props:
                out["properties"] = props
            if xa is not True or xb is not True:
                out["additionalProperties"] = xa if xb is True else xb if xa is True else {"allOf": [xa, xb]}
        if any(k in a or k in b for k in ("items", "prefixItems", "additionalItems")):
            _merge_arrays(a, b, out)
        if "allOf" in out:
            parts = out.pop("allOf")
            for p in parts:
                out = self.merge(out, p, ptr) if "pattern" not in p else _add_pattern(out, p["pattern"])
        return out

    def disjoint(self, branches) -> bool:
        """Can no instance match two branches? (sound, not complete: distinct types or distinct constants).
        A probe: what it would have to relax makes it judge the branches as written."""
        with self.probing():
            return self._disjoint(branches)

    def _disjoint(self, branches) -> bool:
        kinds = []
        for b in branches:
            try:
                b = self.inline_ref(b, "#")
            except GrammarError:  # its target merges only by relaxing: nothing proves it apart
                return False
            if isinstance(b, dict) and "allOf" in b:
                try:  # a branch built with allOf is told apart by what its parts say together
                    merged = {k: v for k, v in b.items() if k != "allOf"}
                    for part in b["allOf"]:
                        merged = self.merge(merged, self.inline_ref(part, "#"), "#")
                    b = merged
                except GrammarError:
                    pass  # not mergeable here: judged as written (and refused below if in doubt)
            if not isinstance(b, dict):
                return False
            kinds.append(b)
        for i in range(len(kinds)):
            for j in range(i + 1, len(kinds)):
                if not _exclusive(kinds[i], kinds[j], self.deadline) and not self._strings_apart(kinds[i], kinds[j]):
                    return False
        return True

    def _strings_apart(self, a: dict, b: dict) -> bool:
        """Two string schemas (pattern, lengths, format) whose languages share no string: decided
        exactly, by the emptiness of the intersection of their automata."""
        if any(value_types(s) != {"string"} or any(k not in STRING_KEYS | {"type"} and validating({k: s[k]})
                                                   for k in s) for s in (a, b)):
            return False
        try:
            la, lb = self.string_language(a, "#"), self.string_language(b, "#")
            return la is not None and lb is not None and is_empty(Intersect(la, lb), self.deadline)
        except GrammarError:
            return False  # a keyword out of scope: refused where the branch itself is compiled


def _add_pattern(schema: dict, pattern: str) -> dict:
    out = dict(schema)
    cur = out.get("pattern")
    out["pattern"] = [pattern] if cur is None else ([cur] if isinstance(cur, str) else list(cur)) + [pattern]
    return out


def _array_parts(s: dict) -> tuple[list, object]:
    """(prefix schemas, schema of the items after them) in either draft's spelling."""
    items = s.get("items", True)
    if isinstance(items, list):
        return list(items), s.get("additionalItems", True)
    return list(s.get("prefixItems", [])), items


def _merge_arrays(a: dict, b: dict, out: dict) -> None:
    """Position-wise allOf of two array schemas: position i must satisfy both sides' schema for i."""
    pa, ia = _array_parts(a)
    pb, ib = _array_parts(b)
    for k in ("items", "prefixItems", "additionalItems"):
        out.pop(k, None)
    n = max(len(pa), len(pb))
    both = lambda x, y: x if y is True else y if x is True else {"allOf": [x, y]}
    prefix = [both(pa[i] if i < len(pa) else ia, pb[i] if i < len(pb) else ib) for i in range(n)]
    if prefix:
        out["prefixItems"] = prefix
    if ia is not True or ib is not True:
        out["items"] = both(ia, ib)


def validating(schema: dict) -> bool:
    """Does the schema constrain anything (beyond annotations and unknown keywords)?"""
    known = OBJECT_KEYS | ARRAY_KEYS | STRING_KEYS | NUMBER_KEYS | UNSUPPORTED | {
        "type", "enum", "const", "allOf", "anyOf", "oneOf", "$ref", "nullable", "if",
        "dependencies", "dependentRequired", "dependentSchemas"}
    return any(k in known for k in schema)


def type_of(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def json_equal(a, b) -> bool:
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b or (type_of(a) in ("integer", "number") and
                                             type_of(b) in ("integer", "number") and a == b)


def value_types(s: dict) -> set[str] | None:
    """The JSON types a schema's instances can have (None: any), from const/enum or type."""
    if "const" in s:
        return {type_of(s["const"])}
    if "enum" in s:
        return {type_of(v) for v in s["enum"]}
    t = s.get("type")
    if t is None:
        return None
    out = {t} if isinstance(t, str) else set(t)
    if "number" in out:
        out.add("integer")
    if s.get("nullable") is True:
        out.add("null")
    return out


def _exclusive(a: dict, b: dict, deadline: float) -> bool:
    ta, tb = value_types(a), value_types(b)
    if ta is not None and tb is not None and not (ta & tb):
        return True
    va = [a["const"]] if "const" in a else a.get("enum")
    vb = [b["const"]] if "const" in b else b.get("enum")
    if va is not None and vb is not None:
        return not any(json_equal(x, y) for x in va for y in vb)
    # A list of values against a schema: apart if each value fails one of the schema's keywords.
    if va is not None and isinstance(va, list) and all(_fails(v, b, deadline) for v in va):
        return True
    if vb is not None and isinstance(vb, list) and all(_fails(v, a, deadline) for v in vb):
        return True
    # The tests below tell objects apart; they prove the branches disjoint only where one of them
    # admits objects alone (without a `type`, both admit every string, number, ... alike).
    if ta != {"object"} and tb != {"object"}:
        return False
    # Objects told apart by a required property whose constant values differ (a discriminator).
    pa, pb = a.get("properties", {}), b.get("properties", {})
    for name in set(a.get("required", [])) & set(b.get("required", [])):
        if isinstance(pa.get(name), dict) and isinstance(pb.get(name), dict):
            if _exclusive(pa[name], pb[name], deadline):
                return True
    # A required property of one that the other forbids.
    for x, y in ((a, b), (b, a)):
        for name in x.get("required", []):
            if y.get("additionalProperties") is False and name not in y.get("properties", {}):
                return True
            if y.get("properties", {}).get(name) is False:
                return True
    return False


def excluded_strings(schema) -> list[str] | None:
    """The strings a `not` schema excludes, where it is `{"const": s}` or `{"enum": [s, ...]}` of
    strings (the only `not` agentkv enforces: the string language minus those strings); else None."""
    if not isinstance(schema, dict) or len(set(schema) & {"const", "enum"}) != 1 or \
            set(schema) - {"const", "enum"} - ANNOTATIONS:
        return None
    values = [schema["const"]] if "const" in schema else schema["enum"]
    return list(values) if isinstance(values, list) and all(isinstance(x, str) for x in values) else None


def _fails(value, s: dict, deadline: float) -> bool:
    """Does `value` certainly fail schema `s`? Sound, not complete: looks at the type, the listed
    values, a string's patterns and lengths and a number's bounds; anything else (and any keyword
    with a malformed value, left for the compiler to report where it is) counts as a match."""
    types = value_types(s)
    if types is not None and type_of(value) not in types:
        return True
    listed = [s["const"]] if "const" in s else s.get("enum")
    if isinstance(listed, list) and not any(json_equal(value, x) for x in listed):
        return True
    if isinstance(value, str):
        if value in (excluded_strings(s.get("not")) or ()):
            return True
        low, high = s.get("minLength"), s.get("maxLength")
        if (_number(low) and len(value) < low) or (_number(high) and len(value) > high):
            return True
        patterns = s.get("pattern", [])
        for p in [patterns] if isinstance(patterns, str) else patterns if isinstance(patterns, list) else []:
            try:
                if isinstance(p, str) and not language_matches(search_expr(p, "#/pattern"), value, deadline):
                    return True
            except GrammarError:
                continue  # a pattern out of scope: the compiler refuses it at its own pointer
    if _number(value):
        low, high = s.get("minimum"), s.get("maximum")
        xlow, xhigh = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")  # draft-04's booleans: skipped
        if (_number(low) and value < low) or (_number(high) and value > high):
            return True
        if (_number(xlow) and value <= xlow) or (_number(xhigh) and value >= xhigh):
            return True
    return False


def _common_multiple(a, b):
    """The least common multiple of two decimal steps (multiples of both are multiples of it)."""
    from decimal import Decimal
    from math import lcm

    da, db = (Decimal(repr(x)) if isinstance(x, float) else Decimal(x) for x in (a, b))
    scale = max(0, -da.normalize().as_tuple().exponent, -db.normalize().as_tuple().exponent)
    m = lcm(int(da.scaleb(scale)), int(db.scaleb(scale)))
    out = Decimal(m).scaleb(-scale)
    return int(out) if out == int(out) else float(out)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
