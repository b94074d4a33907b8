"""Gemma's value notation (Gemma 4's calls; FunctionGemma writes the same with another quote): JSON's
shape without its quoting. Keys are written bare, a string is raw text between two quote tokens (no
escapes), numbers, true, false and null as JSON writes them:

    city:<|"|>Paris<|"|>,days:3,tags:[<|"|>a<|"|>],where:{lat:1.5,exact:true}

`Notation(quote)` gives the grammar of a value under a JSON Schema (Lark rules), reads a value back
and writes one. The grammar carries what a tool schema says in Gemma's own declarations and what
JSON Schema adds to it that the notation can hold (types, enum, const, properties, required, items,
their counts, numbers' bounds, strings' lengths, anyOf, local $refs); any other keyword is a
RequestError naming it, never a constraint dropped. A string with length bounds is written without
"|" (the quote token's character), so the quote cannot occur in it and its length is exact.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentkv.chat.calls import text_without
from agentkv.chat.formats.base import json_rule, lark_literal
from agentkv.errors import RequestError

KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")  # a key the notation writes bare
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
WORDS = {"true": True, "false": False, "null": None}
NOTES = {"description", "title", "default", "examples", "nullable", "$defs", "definitions", "$schema", "$id"}
NUMBER_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
CARRIED = {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems",
           "maxItems", "minLength", "maxLength", "anyOf", "$ref"} | NUMBER_KEYS | NOTES
MAX_DEPTH = 8  # $refs followed into one another before a schema counts as recursive


@dataclass
class _Rules:
    """The rules one call's grammar collects, each value's under a fresh name."""

    where: str  # "tool 'x'" for errors
    rules: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, body: str) -> str:
        name = f"v{self.count}"
        self.count += 1
        self.rules.append(f"{name}: {body}")
        return name


@dataclass(frozen=True)
class Notation:
    quote: str  # the token that opens and closes a string (Gemma 4's <|"|>, FunctionGemma's <escape>)

    # ---- grammar ------------------------------------------------------------------------------------

    def arguments(self, schema: dict, where: str) -> tuple[str, list[str]]:
        """(the expression of a call's arguments, `key:value` pairs without braces, and the rules it
        uses) under the object schema `schema`."""
        rules = _Rules(where)
        body = self._members(schema, schema, rules, "", 0)
        string = f"QSTR: /{text_without(self.quote)}/"
        return body, [string, *rules.rules]

    def _members(self, schema: dict, root: dict, rules: _Rules, ptr: str, depth: int) -> str:
        """`k:v` pairs joined by "," in the order of `properties`, the required ones always; an
        empty string where there are none."""
        extra = schema.get("additionalProperties")
        if extra not in (None, False):
            raise self._error(rules, ptr, "additionalProperties (keys the schema does not name)")
        props = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        if required - set(props):
            raise self._error(rules, ptr, f"required keys it does not describe ({sorted(required - set(props))})")
        items = []
        for k, sub in props.items():
            if not KEY.fullmatch(k):
                raise RequestError(f"{rules.where}: Gemma's calls write keys bare, so {k!r} (at {ptr or '/'}) cannot "
                                   "be one; rename it to letters, digits and _ . -")
            value = self._value(sub, root, rules, f"{ptr}/properties/{k}", depth)
            items.append((rules.add(f"{lark_literal(k + ':')} {value}"), k in required))
        if not items:
            return ""
        # m_i: the members from i on, the first without a comma (k_i with one); none may be left out
        # that is required, so a member after which only optional ones come is followed by `k?`
        need = [any(r for _, r in items[i:]) for i in range(len(items) + 1)]
        after = [""] * (len(items) + 1)
        for i in range(len(items) - 1, -1, -1):
            nxt = after[i + 1] and (f" {after[i + 1]}" if need[i + 1] else f" {after[i + 1]}?")
            alts = [f'"," {items[i][0]}{nxt}'] + ([after[i + 1]] if not items[i][1] and after[i + 1] else [])
            after[i] = rules.add(" | ".join(alts))
        first = [""] * (len(items) + 1)
        for i in range(len(items) - 1, -1, -1):
            nxt = after[i + 1] and (f" {after[i + 1]}" if need[i + 1] else f" {after[i + 1]}?")
            alts = [f"{items[i][0]}{nxt}"] + ([first[i + 1]] if not items[i][1] and first[i + 1] else [])
            first[i] = rules.add(" | ".join(alts))
        return first[0] if need[0] else f"{first[0]}?"

    def _value(self, schema: Any, root: dict, rules: _Rules, ptr: str, depth: int) -> str:
        if schema is True or schema == {}:
            raise self._error(rules, ptr, "any value (give it a type)")
        if not isinstance(schema, dict) or schema is False:
            raise self._error(rules, ptr, "a value no schema allows")
        unknown = sorted(set(schema) - CARRIED)
        if unknown:
            raise self._error(rules, ptr, ", ".join(unknown))
        if "$ref" in schema:
            if depth >= MAX_DEPTH:
                raise self._error(rules, ptr, "a recursive $ref")
            target = _resolve(root, schema["$ref"])
            if target is None:
                raise self._error(rules, ptr, f"$ref {schema['$ref']!r} (only this tool's own #/$defs)")
            rest = {k: v for k, v in schema.items() if k not in ("$ref", *NOTES)}
            if rest:
                raise self._error(rules, ptr, f"$ref beside {sorted(rest)}")
            return self._value(target, root, rules, ptr, depth + 1)
        if "const" in schema:
            return lark_literal(self.dumps(schema["const"]))
        if "enum" in schema:
            return "(" + " | ".join(lark_literal(self.dumps(v)) for v in schema["enum"]) + ")"
        if "anyOf" in schema:
            base = {k: v for k, v in schema.items() if k != "anyOf" and k not in NOTES}
            if base:
                raise self._error(rules, ptr, f"anyOf beside {sorted(base)}")
            return "(" + " | ".join(self._value(s, root, rules, f"{ptr}/anyOf/{i}", depth)
                                    for i, s in enumerate(schema["anyOf"])) + ")"
        kind = schema.get("type")
        if isinstance(kind, list):
            return "(" + " | ".join(self._value({**schema, "type": t}, root, rules, ptr, depth) for t in kind) + ")"
        q = lark_literal(self.quote)
        if kind == "string":
            lo, hi = schema.get("minLength", 0), schema.get("maxLength")
            if lo == 0 and hi is None:
                return f"{q} QSTR {q}"
            return f"{q} /[^|]{{{lo},{'' if hi is None else hi}}}/ {q}"
        if kind in ("integer", "number"):
            return json_rule({k: v for k, v in schema.items() if k in NUMBER_KEYS or k == "type"})
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "array":
            if "items" not in schema or not isinstance(schema["items"], dict):
                raise self._error(rules, ptr, "an array without one items schema")
            lo, hi = schema.get("minItems", 0), schema.get("maxItems")
            if hi == 0:
                return '"[]"'
            item = rules.add(self._value(schema["items"], root, rules, f"{ptr}/items", depth))
            # the first item, then the rest after commas: lo - 1 to hi - 1 of them
            rest = f'("," {item}){{{max(lo - 1, 0)},{"" if hi is None else hi - 1}}}'
            return f'"[" {item} {rest} "]"' if lo > 0 else f'"[" ({item} {rest})? "]"'
        if kind == "object":
            members = self._members(schema, root, rules, ptr, depth)
            return f'"{{" {members} "}}"' if members else '"{}"'
        raise self._error(rules, ptr, f"type {kind!r}" if kind else "a value without a type")

    def _error(self, rules: _Rules, ptr: str, what: str) -> RequestError:
        return RequestError(f"{rules.where}: Gemma's call notation cannot carry {what} (at {ptr or '/'} of its "
                            "parameters); simplify the schema or choose another tool_format")

    # ---- reading and writing ------------------------------------------------------------------------

    def dumps(self, value: Any) -> str:
        """A value as the notation writes it (keys bare, strings between quotes)."""
        if isinstance(value, str):
            return self.quote + value + self.quote
        if isinstance(value, dict):
            return "{" + self.members(value) + "}"
        if isinstance(value, list):
            return "[" + ",".join(self.dumps(v) for v in value) + "]"
        return json.dumps(value)

    def members(self, value: dict) -> str:
        return ",".join(f"{k}:{self.dumps(v)}" for k, v in value.items())

    def read(self, text: str, i: int) -> tuple[Any, int] | None:
        """(the value at `i`, where it ends), or None where it is cut short or not a value."""
        if text.startswith(self.quote, i):
            end = text.find(self.quote, i + len(self.quote))
            return None if end < 0 else (text[i + len(self.quote):end], end + len(self.quote))
        if text.startswith("{", i):
            got = self.read_members(text, i + 1, "}")
            return None if got is None or not got[2] else (got[0], got[1] + 1)
        if text.startswith("[", i):
            out, j = [], i + 1
            if text.startswith("]", j):
                return out, j + 1
            while (got := self.read(text, j)) is not None:
                out.append(got[0])
                j = got[1]
                if text.startswith("]", j):
                    return out, j + 1
                if not text.startswith(",", j):
                    return None
                j += 1
            return None
        for word, value in WORDS.items():
            if text.startswith(word, i):
                return value, i + len(word)
        m = NUMBER.match(text, i)
        if m is None or m.end() == len(text):  # (a number at the end may go on)
            return None
        return (float(m.group()) if m.group(1) or m.group(2) else int(m.group())), m.end()

    def read_members(self, text: str, i: int, close: str) -> tuple[dict, int, bool] | None:
        """(the `k:v` pairs complete from `i`, where they end, whether `close` follows them)."""
        out: dict = {}
        while True:
            if text.startswith(close, i):
                return out, i, True
            m = KEY.match(text, i)
            if m is None or not text.startswith(":", m.end()):
                return out, i, False
            got = self.read(text, m.end() + 1)
            if got is None:
                return out, i, False
            out[m.group()] = got[0]
            i = got[1]
            if text.startswith(",", i):
                i += 1
            elif not text.startswith(close, i):
                return out, i, False


def _resolve(root: dict, ref: str) -> Any:
    """A local `#/$defs/Name` (or `#/definitions/Name`) of the tool's parameters, or None."""
    m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref)
    return (root.get(m.group(1)) or {}).get(m.group(2)) if m else None
