"""Qwen3-Coder's and Qwen3.5's XML calls, one block per call:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

(a newline between blocks, a blank line after any text before them). A string argument is written
raw (no quotes, no escapes, over any lines), every other value as JSON, as the template writes
arguments back (`args_value | string`, `tojson` for objects and arrays); booleans and null are also
read in the template's Python spelling (True, False, None). The template renders the tools itself
and takes calls as structured `tool_calls` whose arguments are a mapping. Parameters are written in
their schema's order, the required ones always. A string whose schema raw text cannot hold exactly (a
pattern, a format, a minimum or a long maximum length) is written as a JSON string instead, which the
grammar enforces."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from agentkv.chat.calls import CallProgress, ToolCall, text_without
from agentkv.chat.formats.base import ToolFormat, arguments_schema, json_rule, lark_literal
from agentkv.errors import RequestError

OPEN, CLOSE, FUNCTION, END_FUNCTION = "<tool_call>", "</tool_call>", "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"
HEAD = OPEN + "\n" + FUNCTION
TAIL = END_FUNCTION + "\n" + CLOSE
VALUE_END = "\n" + END_PARAMETER + "\n"
PYTHON = {"True": True, "False": False, "None": None}  # the template's `| string` of these


@dataclass(frozen=True)
class QwenXml(ToolFormat):
    # the offered tools' parameter schemas (Turn binds them: a string is read raw, the rest as JSON)
    schemas: tuple[tuple[str, Any], ...] = ()

    name: ClassVar[str] = "qwen3_xml"
    opening: ClassVar[str] = HEAD
    text_before_calls: ClassVar[bool] = True
    between_text_and_calls: ClassVar[str] = "\n\n"
    words: ClassVar[tuple[str, ...]] = (OPEN, CLOSE, FUNCTION, END_FUNCTION, PARAMETER, END_PARAMETER,
                                        "<tool_response>", "</tool_response>")
    instruction: ClassVar[str] = (
        "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
        "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
        "</tool_call>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return FUNCTION in chat_template and PARAMETER in chat_template

    def bind(self, specs) -> QwenXml:
        return replace(self, schemas=tuple((s.name, s.parameters) for s in specs))

    # ---- grammar ------------------------------------------------------------------------------------

    def calls_grammar(self, tools, parallel, close_objects) -> str:
        rules, calls = [f"XSTR: /{text_without(VALUE_END.rstrip())}/"], []
        for t, tool in enumerate(tools):
            schema = arguments_schema(tool, close_objects)
            required = set(schema.get("required") or ())
            parts = []
            for p, (name, sub) in enumerate((schema.get("properties") or {}).items()):
                if ">" in name or "\n" in name:
                    raise RequestError(f"tool {tool.name!r}: the qwen3_xml format writes <parameter=NAME>, so a "
                                       f"parameter name may not hold '>' or a newline ({name!r}); rename it")
                rule = f"x{t}p{p}"
                defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}  # what its $refs name
                rules.append(f"{rule}: {lark_literal(PARAMETER + name + '>' + chr(10))} {_value({**sub, **defs})} "
                             f"{lark_literal(VALUE_END)}")
                parts.append(rule if name in required else rule + "?")
            rules.append(f"x{t}: {lark_literal(HEAD + tool.name + '>' + chr(10))} {' '.join(parts)} "
                         f"{lark_literal(TAIL)}")
            calls.append(f"x{t}")
        more = ' ("\\n" call)*' if parallel else ""
        return "\n".join([f"call: {' | '.join(calls)}", *rules, f"calls: call{more}"]) + "\n"

    # ---- reading ------------------------------------------------------------------------------------

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        calls, end, i = [], 0, start
        while (got := self._call(text, i)) is not None and got[2]:
            calls.append(ToolCall(got[0], got[1]))
            end = got[3]
            i = end + 1
        return calls, end

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        out, i = [], start
        while (got := self._call(text, i)) is not None:
            name, args, done, end = got
            body = ",".join(f"{_compact(k)}:{_compact(v)}" for k, v in args.items())
            out.append(CallProgress(name, "{" + body + ("}" if done else ""), done))
            if not done:
                break
            i = end + 1
        return out

    def _call(self, text: str, i: int) -> tuple[str, dict, bool, int] | None:
        """(name, the arguments complete so far, whether the call is complete, where it ends) of the
        call at `i`; None before its name is complete."""
        if not text.startswith(HEAD, i):
            return None
        k = text.find(">\n", i + len(HEAD))
        if k < 0:
            return None
        name, args, j = text[i + len(HEAD):k], {}, k + 2
        while text.startswith(PARAMETER, j):
            k = text.find(">\n", j + len(PARAMETER))
            v = text.find(VALUE_END, k + 2) if k >= 0 else -1
            if v < 0:
                return name, args, False, len(text)
            param = text[j + len(PARAMETER):k]
            args[param] = self._read(name, param, text[k + 2:v])
            j = v + len(VALUE_END)
        if text.startswith(TAIL, j):
            return name, args, True, j + len(TAIL)
        return name, args, False, len(text)

    def _read(self, tool: str, param: str, raw: str) -> Any:
        schema = dict(self.schemas).get(tool) or {}
        sub = (schema.get("properties") or {}).get(param) or {}
        kind = sub.get("type")
        if raw == "None" and isinstance(kind, list) and "null" in kind:
            return None  # (a nullable string's None, as the template writes it)
        if _raw(sub):
            return raw
        if raw in PYTHON:
            return PYTHON[raw]
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw  # (the schema check names what is wrong with it)

    # ---- writing ------------------------------------------------------------------------------------

    def calls_text(self, calls: list[ToolCall]) -> str:
        """`calls` as the grammar writes them."""
        return "\n".join(HEAD + c.name + ">\n" + "".join(
            f"{PARAMETER}{k}>\n{self._text(c.name, k, v)}{VALUE_END}" for k, v in c.arguments.items()) + TAIL
            for c in calls)

    def _text(self, tool: str, param: str, value: Any) -> str:
        sub = ((dict(self.schemas).get(tool) or {}).get("properties") or {}).get(param) or {}
        if isinstance(value, str) and _is_string(sub) and not _raw(sub):
            return json.dumps(value, ensure_ascii=False)
        return _template_text(value)

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


RAW_KEYWORDS = {"type", "enum", "const", "maxLength", "description", "title", "default", "examples"}


def _raw(schema: dict) -> bool:
    """Whether a string argument is written raw, as the template writes it: where raw text can hold
    its schema exactly (any text, its enum, or at most 12 characters, which cannot spell the closing
    `\n</parameter>`); a string under a pattern, a format or other lengths is written as a JSON string
    instead, which the grammar enforces exactly (and `strict` with it)."""
    short = schema.get("maxLength") is None or schema["maxLength"] < len(VALUE_END) - 1
    return _is_string(schema) and short and set(schema) <= RAW_KEYWORDS


def _value(schema: dict) -> str:
    """The grammar of one argument's text: a string raw (its enum as literals), true / false and
    null also as Python spells them, anything else JSON under its schema."""
    if isinstance(schema.get("const"), str):
        return lark_literal(schema["const"])
    if "enum" in schema and schema["enum"] and all(isinstance(v, str) for v in schema["enum"]):
        return "(" + " | ".join(lark_literal(v) for v in schema["enum"]) + ")"
    if _raw(schema):
        n = schema.get("maxLength")
        return "XSTR" if n is None else f"/[\\s\\S]{{0,{n}}}/"
    kind = schema.get("type")
    if kind == "boolean":
        return '("true" | "false" | "True" | "False")'
    if kind == "null":
        return '("null" | "None")'
    return json_rule(schema)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _template_text(value: Any) -> str:
    """An argument as the grammar writes it: a string as it is, objects and arrays as compact JSON
    (the template's `tojson` spaces them), anything else as Jinja's `string` writes it (Python's
    str: True, None, 2.5)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return _compact(value)
    return str(value)
