"""Gemma 4's calls (and FunctionGemma's, the same with other markers): each
`<|tool_call>call:name{key:value,...}<tool_call|>`, its arguments in Gemma's value notation
(gemma_values.py: keys bare, strings between `<|"|>` tokens), calls one after another and nothing
before them, every marker a special token:

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

The model then writes `<|tool_response>` (a stop token), which is where the template puts each
result: `<|tool_response>response:get_weather{value:<|"|>...<|"|>}<tool_response|>`, the model's
turn going on after it. The template renders the tools itself (`<|tool>declaration:...<tool|>` in
the system turn) and writes a call's arguments given as text as they are, so a reply's calls go
back as the notation the model wrote. A schema the notation cannot carry is a RequestError at
request time naming the tool and the keyword.

FunctionGemma (Gemma 3 270M tuned for calls) writes `<start_function_call>call:name{...}
<end_function_call>`, strings between `<escape>` tokens, results as `<start_function_response>
response:name{...}<end_function_response>`, its tools in a `developer` turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import TOOL_NAME, CallProgress, ToolCall, read_calls, read_progress
from agentkv.chat.formats.base import ToolFormat, arguments_schema, lark_literal
from agentkv.chat.formats.gemma_values import Notation


@dataclass(frozen=True)
class Gemma4(ToolFormat):
    OPEN: ClassVar[str] = "<|tool_call>"
    CLOSE: ClassVar[str] = "<tool_call|>"
    NOTATION: ClassVar[Notation] = Notation('<|"|>')

    name: ClassVar[str] = "gemma4"
    opening: ClassVar[str] = OPEN
    call_opening: ClassVar[str] = OPEN + "call:"
    words: ClassVar[tuple[str, ...]] = (OPEN, CLOSE, "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>",
                                        NOTATION.quote)
    special_markers: ClassVar[tuple[str, ...]] = words
    instruction: ClassVar[str] = (
        "To call a function, write <|tool_call>call:<function-name>{<key>:<value>,...}<tool_call|>, a "
        "string value between <|\"|> tokens, other values as JSON, keys bare")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return cls.call_opening in chat_template

    # ---- grammar ------------------------------------------------------------------------------------

    def calls_rules(self, parallel) -> str:
        return "calls: call+\n" if parallel else "calls: call\n"

    def call_part(self, tool, close_objects) -> str:
        members, rules = self.NOTATION.arguments(arguments_schema(tool, close_objects), f"tool {tool.name!r}")
        return "\n".join([f"start: {lark_literal(tool.name + '{')} {members} {lark_literal('}' + self.CLOSE)}",
                          *rules]) + "\n"

    # ---- reading ------------------------------------------------------------------------------------

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        return read_calls(self._call, text, start)

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        return read_progress(self._call, text, start)

    def _call(self, text: str, i: int) -> tuple[str, dict, bool, int] | None:
        """(name, the arguments complete so far, whether the call is complete, where it ends) of the
        call at `i`; None before its name is complete."""
        if not text.startswith(self.call_opening, i):
            return None
        m = TOOL_NAME.match(text, i + len(self.call_opening))
        if m is None or not text.startswith("{", m.end()):
            return None
        args, j, closed = self.NOTATION.read_members(text, m.end() + 1, "}")
        if closed and text.startswith("}" + self.CLOSE, j):
            return m.group(), args, True, j + 1 + len(self.CLOSE)
        return m.group(), args, False, len(text)

    # ---- writing ------------------------------------------------------------------------------------

    def calls_text(self, calls: list[ToolCall]) -> str:
        return "".join(f"{self.call_opening}{c.name}{{{self.NOTATION.members(c.arguments)}}}{self.CLOSE}"
                       for c in calls)

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.native:
            return super().assistant_message(content, calls, text)
        # the template writes arguments given as text between the call's braces as they are
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": self.NOTATION.members(c.arguments)}}
                               for c in calls]}


@dataclass(frozen=True)
class FunctionGemma(Gemma4):
    OPEN: ClassVar[str] = "<start_function_call>"
    CLOSE: ClassVar[str] = "<end_function_call>"
    NOTATION: ClassVar[Notation] = Notation("<escape>")

    name: ClassVar[str] = "functiongemma"
    opening: ClassVar[str] = OPEN
    call_opening: ClassVar[str] = OPEN + "call:"
    words: ClassVar[tuple[str, ...]] = (OPEN, CLOSE, "<start_function_response>", "<end_function_response>",
                                        "<start_function_declaration>", "<end_function_declaration>", NOTATION.quote)
    special_markers: ClassVar[tuple[str, ...]] = words
    instruction: ClassVar[str] = (
        "To call a function, write <start_function_call>call:<function-name>{<key>:<value>,...}<end_function_call>, "
        "a string value between <escape> tokens, other values as JSON, keys bare")
    # Google's words that switch the model to calling (its guide: the developer turn must hold them),
    # right before the declarations the template writes
    TRIGGER: ClassVar[str] = "You are a model that can do function calling with the following functions"

    def system_message(self, instructions: str, definitions: list[dict]) -> dict:
        if not self.native or not definitions:
            return super().system_message(instructions, definitions)
        head = instructions.rstrip() + "\n\n" if instructions.strip() else ""
        return {"role": "system", "content": head + self.TRIGGER}

    def offered(self, messages: list[dict], definitions: list[dict]) -> list[dict]:
        if not self.native or not definitions:
            return super().offered(messages, definitions)
        first = messages[0] if messages and messages[0].get("role") in ("system", "developer") else None
        if first is not None and self.TRIGGER in str(first.get("content")):
            return list(messages)
        system = self.system_message(first["content"] if first else "", definitions)
        return [system] + list(messages[1:] if first else messages)
