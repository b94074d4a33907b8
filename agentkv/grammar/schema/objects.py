"""JSON Schema objects -> grammar rules: members in schema order, then pattern and additional members.

Declared properties come in `properties` order (then required names not listed there), each
optional one skippable; after them, members whose names match a `patternProperties` pattern (with
that schema) and, where `additionalProperties` allows, any other name. Declared names never
reappear as additional ones. `propertyNames` restricts every name. The member list is factored so
the expression stays linear in the number of properties.
"""

from __future__ import annotations

import json

from agentkv.errors import GrammarError
from agentkv.grammar.automata.dfa import is_empty, language_matches
from agentkv.grammar.automata.expr import (
    EMPTY,
    NOTHING,
    Chars,
    Diff,
    Intersect,
    Ref,
    Repeat,
    alt,
    complement,
    lit,
    opt,
    seq,
)
from agentkv.grammar.automata.regex import search_expr
from agentkv.grammar.schema.merge import excluded_strings, validating
from agentkv.grammar.schema.values import escaped

SHARED_TAIL_AFTER = 4  # objects with more properties than this share their member tails as rules
MAX_COUNTED_PROPERTIES = 64  # min/maxProperties bounds enforced by counting members


def dumps(value, separators: tuple[str, str] = (",", ":")) -> str:
    """The serialization the grammar generates (and tests compare against): compact, or with the
    given separators (schema/style.py)."""
    return json.dumps(value, separators=separators, ensure_ascii=False, allow_nan=False)


def python_dumps(value, separators: tuple[str, str] = (",", ":")) -> str:
    """`dumps` with Python's True, False and None (a JSON string is also a Python string literal)."""
    if value is True or value is False or value is None:
        return repr(value)
    comma, colon = separators
    if isinstance(value, dict):
        return "{" + comma.join(f"{dumps(k)}{colon}{python_dumps(v, separators)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + comma.join(python_dumps(v, separators) for v in value) + "]"
    return dumps(value)


class ObjectRules:
    """The object part of JsonSchemaConverter (schema/json_schema.py), which supplies rules, punct,
    rule_for, string_expr, string_language, inline_ref, relax, close_objects, prefix and deadline."""

    def property_names(self, schema, ptr: str):
        """`propertyNames` as a character-level language (None: any name)."""
        if schema is None or schema is True or (isinstance(schema, dict) and not validating(schema)):
            return None
        if schema is False:
            return NOTHING
        schema = self.inline_ref(schema, ptr)
        if isinstance(schema, bool):  # a $ref to true or false
            return self.property_names(schema, ptr)
        folded = self.without_not(schema, ptr)  # schema/conditionals.py
        if folded is not None:
            return self.property_names(folded, ptr)
        other_not = isinstance(schema, dict) and "not" in schema and excluded_strings(schema["not"]) is None
        allowed = {"type", "pattern", "minLength", "maxLength", "format", "enum", "const", "anyOf", "not"}
        bad = [k for k in schema if validating({k: schema[k]}) and k not in allowed] + (["not"] if other_not else [])
        if bad or schema.get("type", "string") not in ("string", ["string"]):
            self.relax("propertyNames", ptr, f"propertyNames with '{(bad or ['type'])[0]}' is not enforced (names "
                       "are strings: use pattern, minLength, maxLength, format, enum, const or anyOf of those)")
            return None
        lang = self.string_language({k: v for k, v in schema.items() if k not in ("enum", "const", "anyOf")}, ptr)
        if "enum" in schema or "const" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            lang = alt(*[lit(v) for v in values if isinstance(v, str)
                         and (lang is None or language_matches(lang, v, self.deadline))])
        if "anyOf" in schema:
            branches = schema["anyOf"]
            if not isinstance(branches, list) or not branches:
                raise GrammarError("anyOf must be a non-empty array", f"{ptr}/anyOf")
            parts = [self.property_names(b, f"{ptr}/anyOf/{i}") for i, b in enumerate(branches)]
            union = None if any(p is None for p in parts) else alt(*parts)
            lang = union if lang is None else lang if union is None else Intersect(lang, union)
        return lang

    def t_object(self, schema, ptr):
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict):
            raise GrammarError("properties must be an object", f"{ptr}/properties")
        props = dict(props)
        extra = schema.get("additionalProperties", not self.close_objects)
        names = self.property_names(schema.get("propertyNames"), f"{ptr}/propertyNames")
        patterns = schema.get("patternProperties", {})
        pats = []
        for p, sub in patterns.items():
            where = f"{ptr}/patternProperties/{pointer_escape(p)}"
            try:
                pats.append((search_expr(p, where), sub, where))
            except GrammarError as e:  # a pattern no grammar reads: any other name, with any value
                self.relax("patternProperties", where, str(e).rsplit(" (at ", 1)[0])
                extra = True
        for i in range(len(pats)):
            for j in range(i + 1, len(pats)):
                if not is_empty(Intersect(pats[i][0], pats[j][0]), self.deadline):
                    # A declared name takes every pattern's schema it matches; another name matching
                    # two patterns takes either schema in the grammar (both: validated after).
                    self.relax("patternProperties", f"{ptr}/patternProperties", "an undeclared name that two "
                               "patternProperties match is held to one of their schemas in the grammar; make the "
                               "patterns exclusive")

        def schema_for(name: str, declared):
            """Everything a member called `name` must satisfy: its property, the patterns it matches."""
            subs = [] if declared is None else [declared]
            subs += [sub for lang, sub, _ in pats if language_matches(lang, name, self.deadline)]
            if declared is None and not subs:
                subs = [extra]
            if names is not None and not language_matches(names, name, self.deadline):
                return False
            if any(x is False for x in subs):
                return False
            subs = [x for x in subs if x is not True]
            return True if not subs else subs[0] if len(subs) == 1 else {"allOf": subs}

        members = {n: schema_for(n, sub) for n, sub in props.items()}
        # (closed by policy, not by the schema: a name it requires is declared, with any value)
        declared = True if self.close_objects and "additionalProperties" not in schema else None
        for n in required:
            if n not in members:
                members[n] = schema_for(n, declared)
        entries = []
        for name, sub in members.items():
            if sub is False:
                if name in required:
                    return NOTHING
                continue
            kv = seq(lit(dumps(name)), self.punct(":"), self.rule_for(sub, f"{ptr}/properties/{pointer_escape(name)}"))
            entries.append((kv, name in required))
        # Members after the declared ones: names matching a pattern, then any other name if allowed.
        declared = alt(*[lit(n) for n in members]) if members else None
        any_name = Repeat(Chars(complement([])), 0, None)
        others = []
        for lang, sub, where in pats:
            key = _restrict(lang, names, declared)
            if sub is not False and not is_empty(key, self.deadline):
                others.append(seq(self.string_expr(escape_all(key)), self.punct(":"), self.rule_for(sub, where)))
        if extra is not False:
            key = _restrict(any_name, names, alt(*([declared] if declared else []), *[lang for lang, _, _ in pats]))
            if not is_empty(key, self.deadline):
                others.append(seq(self.string_expr(escape_all(key)), self.punct(":"),
                                  self.rule_for(extra, f"{ptr}/additionalProperties")))
        extra_kv = None
        if others:
            name = f"{self.prefix}extra:{ptr}"  # a rule: referenced from every way the object can end
            self.rules[name] = alt(*others)
            extra_kv = Ref(name)
        lo = schema_count(schema, "minProperties", ptr) or 0
        hi = schema_count(schema, "maxProperties", ptr)
        n_req = sum(1 for _, r in entries if r)
        if lo <= n_req and (hi is None or (extra_kv is None and hi >= len(entries))):
            lo, hi = 0, None  # the required and declared members already keep the count in bounds
        # Members are counted up to `cap` (past it, counts behave alike): the bounds make the member
        # list a counter, so its expression grows with cap x properties.
        cap = max(lo, hi or 0)
        if cap > MAX_COUNTED_PROPERTIES:
            key = "minProperties" if lo > MAX_COUNTED_PROPERTIES else "maxProperties"
            self.relax(key, f"{ptr}/{key}", f"minProperties/maxProperties {cap} is above the "
                       f"{MAX_COUNTED_PROPERTIES} members a grammar counts exactly")
            lo, hi, cap = 0, None, 0
        comma = self.punct(",")
        memo: dict = {}

        def extras(c: int, any_before: bool):
            """Other members after the declared ones, with `c` members so far."""
            need, room = max(lo - c, 0), None if hi is None else hi - c
            if room is not None and need > room:
                return NOTHING  # minProperties above maxProperties
            if extra_kv is None or room == 0:
                return EMPTY if need == 0 else NOTHING
            more = Repeat(seq(comma, extra_kv), max(need - 1, 0) if not any_before else need,
                          None if room is None else room - (0 if any_before else 1))
            if any_before:
                return more
            first = seq(extra_kv, more)
            return alt(EMPTY, first) if need == 0 else first

        def rest(i: int, c: int, any_before: bool):
            key = (i, c, any_before)
            if key in memo:
                return memo[key]
            if i == len(entries):
                out = extras(c, any_before)
            else:
                kv, req = entries[i]
                member = seq(comma, kv) if any_before else kv
                taken, fits = min(c + 1, cap), hi is None or c < hi
                if any_before and taken == c and fits:  # the count no longer matters: factored
                    out = seq(member if req else opt(member), rest(i + 1, c, True))
                else:
                    with_it = seq(member, rest(i + 1, taken, True)) if fits else NOTHING
                    out = with_it if req else alt(with_it, rest(i + 1, c, any_before))
                if any_before and len(entries) - i > 1 and len(entries) > SHARED_TAIL_AFTER:
                    # Each way to reach member i continues with this tail: one rule, not copies (so
                    # the expression stays linear in the number of properties, times the counts).
                    name = f"{self.prefix}tail:{ptr}:{i}:{c}"
                    self.rules[name] = out
                    out = Ref(name)
            memo[key] = out
            return out

        out = seq(self.punct("{"), rest(0, 0, False), self.punct("}"))
        rest = None  # (a recursive closure is a reference cycle: emptied, its scope is freed now, not by the collector)
        return out


def escape_all(e):
    """JSON-escape a character-level language (escaping is a per-character bijection, so it distributes)."""
    if isinstance(e, (Intersect, Diff)):
        return type(e)(escape_all(e.left), escape_all(e.right))
    return escaped(e)


def _restrict(lang, names, excluded):
    """Names in `lang`, allowed by propertyNames (`names`), and not in `excluded`."""
    if names is not None:
        lang = Intersect(lang, names)
    return Diff(lang, excluded) if excluded is not None else lang


def schema_count(schema: dict, key: str, ptr: str) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or float(v) != int(v):
        raise GrammarError(f"{key} must be a non-negative integer, not {v!r}", f"{ptr}/{key}")
    return int(v)



def pointer_escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
