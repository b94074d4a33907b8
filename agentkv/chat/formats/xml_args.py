"""Calls whose arguments are written one per tag pair, a string raw and every other value as JSON
(Qwen3-Coder's `<parameter=city>`, GLM-4.5's `<arg_key>city</arg_key><arg_value>`): what such formats
share. A format says its markup (class constants); parameters are written in their schema's order,
the required ones always. A string argument is raw text (no quotes, no escapes, over any lines), as
the templates write it back, where raw text can hold its schema exactly (any text, its enum, or
fewer characters than the tag that ends it); a string under a pattern, a format or other lengths is
written as a JSON string instead, which the grammar enforces (and `strict` with it). Reading a value
back needs its schema, so the Turn binds the offered tools to the format (`bind`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from agentkv.chat.calls import CallProgress, ToolCall, compact, read_calls, read_progress, text_without
from agentkv.chat.formats.base import ToolFormat, arguments_schema, json_rule, lark_literal
from agentkv.errors import RequestError

PYTHON = {"True": True, "False": False, "None": None}  # a template's `| string` of these
RAW_KEYWORDS = {"type", "enum", "const", "maxLength", "description", "title", "default", "examples"}


@dataclass(frozen=True)
class XmlArgs(ToolFormat):
    # the offered tools' parameter schemas (Turn binds them: a string is read raw, the rest as JSON)
    schemas: tuple[tuple[str, Any], ...] = ()

    text_before_calls: ClassVar[bool] = True
    # a call: HEAD name NAME_END (KEY key KEY_END value VALUE_END)* TAIL; calls joined by BETWEEN
    HEAD: ClassVar[str]
    NAME_END: ClassVar[str]
    KEY: ClassVar[str]
    KEY_END: ClassVar[str]
    VALUE_END: ClassVar[str]
    TAIL: ClassVar[str]
    BETWEEN: ClassVar[str] = "\n"
    python_literals: ClassVar[bool] = False  # True / False / None, as `| string` writes them, read and written

    def bind(self, specs) -> XmlArgs:
        return replace(self, schemas=tuple((s.name, s.parameters) for s in specs))

    @property
    def _end_word(self) -> str:
        """What a raw value may not contain: the tag that ends it (less the newline after it)."""
        return self.VALUE_END.rstrip("\n")

    # ---- grammar ------------------------------------------------------------------------------------

    def calls_rules(self, parallel) -> str:
        more = f" ({lark_literal(self.BETWEEN)} call)*" if parallel else ""
        return f"calls: call{more}\n"

    def call_part(self, tool, close_objects) -> str:
        schema = arguments_schema(tool, close_objects)
        required = set(schema.get("required") or ())
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}  # what a parameter's $refs name
        rules, params = [f"XSTR: /{text_without(self._end_word)}/"], []
        for p, (name, sub) in enumerate((schema.get("properties") or {}).items()):
            if any(c in name for c in "<>\n"):
                raise RequestError(f"tool {tool.name!r}: the {self.name} format writes parameter names inside "
                                   f"tags, so a name may not hold '<', '>' or a newline ({name!r}); rename it")
            rules.append(f"p{p}: {lark_literal(self.KEY + name + self.KEY_END)} {self._value({**sub, **defs})} "
                         f"{lark_literal(self.VALUE_END)}")
            params.append(f"p{p}" if name in required else f"p{p}?")
        name = lark_literal(tool.name + self.NAME_END)
        return "\n".join([f"start: {name} {' '.join(params)} {lark_literal(self.TAIL)}", *rules]) + "\n"

    def _value(self, schema: dict) -> str:
        """The grammar of one argument's text: a string raw (its enum as literals), anything else
        JSON under its schema (true / false and null also in Python's spelling where the template
        writes them so)."""
        if isinstance(schema.get("const"), str):
            return lark_literal(schema["const"])
        if "enum" in schema and schema["enum"] and all(isinstance(v, str) for v in schema["enum"]):
            return "(" + " | ".join(lark_literal(v) for v in schema["enum"]) + ")"
        if self._raw(schema):
            n = schema.get("maxLength")
            return "XSTR" if n is None else f"/[\\s\\S]{{0,{n}}}/"
        kind = schema.get("type")
        if kind == "boolean" and self.python_literals:
            return '("true" | "false" | "True" | "False")'
        if kind == "null" and self.python_literals:
            return '("null" | "None")'
        return json_rule(schema, self.json_style)

    def _raw(self, schema: dict) -> bool:
        short = schema.get("maxLength") is None or schema["maxLength"] < len(self._end_word)
        return _is_string(schema) and short and set(schema) <= RAW_KEYWORDS

    # ---- reading ------------------------------------------------------------------------------------

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        return read_calls(self._call, text, start, self.BETWEEN)

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        return read_progress(self._call, text, start, self.BETWEEN)

    def _call(self, text: str, i: int) -> tuple[str, dict, bool, int] | None:
        """(name, the arguments complete so far, whether the call is complete, where it ends) of the
        call at `i`; None before its name is complete."""
        if not text.startswith(self.HEAD, i):
            return None
        k = text.find(self.NAME_END, i + len(self.HEAD))
        if k < 0:
            return None
        name, args, j = text[i + len(self.HEAD):k], {}, k + len(self.NAME_END)
        while text.startswith(self.KEY, j):
            k = text.find(self.KEY_END, j + len(self.KEY))
            v = text.find(self.VALUE_END, k + len(self.KEY_END)) if k >= 0 else -1
            if v < 0:
                return name, args, False, len(text)
            param = text[j + len(self.KEY):k]
            args[param] = self._read(name, param, text[k + len(self.KEY_END):v])
            j = v + len(self.VALUE_END)
        if text.startswith(self.TAIL, j):
            return name, args, True, j + len(self.TAIL)
        return name, args, False, len(text)

    def _read(self, tool: str, param: str, raw: str) -> Any:
        sub = ((dict(self.schemas).get(tool) or {}).get("properties") or {}).get(param) or {}
        kind = sub.get("type")
        if self.python_literals and raw == "None" and isinstance(kind, list) and "null" in kind:
            return None  # (a nullable string's None, as the template writes it)
        if self._raw(sub):
            return raw
        if self.python_literals and raw in PYTHON:
            return PYTHON[raw]
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw  # (the schema check names what is wrong with it)

    # ---- writing ------------------------------------------------------------------------------------

    def calls_text(self, calls: list[ToolCall]) -> str:
        """`calls` as the grammar writes them."""
        return self.BETWEEN.join(self.HEAD + c.name + self.NAME_END + "".join(
            f"{self.KEY}{k}{self.KEY_END}{self._text(c.name, k, v)}{self.VALUE_END}" for k, v in c.arguments.items())
            + self.TAIL for c in calls)

    def _text(self, tool: str, param: str, value: Any) -> str:
        """An argument as the grammar writes it: a raw string as it is, objects and arrays as compact
        JSON (the templates' `tojson` spaces them), a string that is not raw as a JSON string, other
        scalars as the template writes them."""
        sub = ((dict(self.schemas).get(tool) or {}).get("properties") or {}).get(param) or {}
        if isinstance(value, str):
            return value if self._raw(sub) or not _is_string(sub) else compact(value)
        if isinstance(value, (dict, list)) or not self.python_literals:
            return compact(value)
        return str(value)

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.native:
            return super().assistant_message(content, calls, text)
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in calls]}


def _is_string(schema: dict) -> bool:
    kind = schema.get("type")
    return kind == "string" or isinstance(kind, list) and "string" in kind or (
        "enum" in schema and all(isinstance(v, str) for v in schema["enum"])) or isinstance(schema.get("const"), str)
