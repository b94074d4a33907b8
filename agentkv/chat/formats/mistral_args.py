"""Mistral's newer format (v11 tokenizers and later: Mistral Small 3.x, Magistral, Devstral, Ministral 3):
`[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`, each call its own `[TOOL_CALLS]`, directly after any
text and after each other, both markers special tokens the grammar writes as those tokens. The
template takes tool definitions (`[AVAILABLE_TOOLS]`), calls as structured `tool_calls` (the arguments
as the JSON text the model wrote) and results (`[TOOL_RESULTS]...[/TOOL_RESULTS]`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import ToolFormat, arguments_schema, json_rule, lark_literal
from agentkv.chat.formats.json_calls import value_end

OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"([a-zA-Z0-9_-]{1,64})" + re.escape(ARGS))
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class MistralArgs(ToolFormat):
    name: ClassVar[str] = "mistral_args"
    opening: ClassVar[str] = OPEN
    call_opening: ClassVar[str] = OPEN
    text_before_calls: ClassVar[bool] = True
    words: ClassVar[tuple[str, ...]] = (OPEN, ARGS, "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]",
                                        "[/AVAILABLE_TOOLS]")
    special_markers: ClassVar[tuple[str, ...]] = (OPEN, ARGS)
    instruction: ClassVar[str] = (
        "To call a function, write [TOOL_CALLS], its name, [ARGS] and its arguments as a JSON object: "
        "[TOOL_CALLS]<function-name>[ARGS]<args-json-object>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return OPEN in chat_template and ARGS in chat_template

    def calls_rules(self, parallel) -> str:
        return "calls: call call*\n" if parallel else "calls: call\n"

    def call_part(self, tool, close_objects) -> str:
        arguments = json_rule(arguments_schema(tool, close_objects), self.json_style)
        return f"start: {lark_literal(tool.name + ARGS)} {arguments}\n"

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        calls, end, i = [], 0, start
        while text.startswith(OPEN, i) and (m := _NAME.match(text, i + len(OPEN))):
            try:
                args, stop = _DECODER.raw_decode(text, m.end())
            except ValueError:
                break  # cut short
            if not isinstance(args, dict):
                break
            calls.append(ToolCall(m.group(1), args, arguments_text=text[m.end():stop]))
            end = i = stop
        return calls, end

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        out, i = [], start
        while text.startswith(OPEN, i) and (m := _NAME.match(text, i + len(OPEN))):
            stop = value_end(text, m.end())
            if stop < 0:  # still being written (a scalar's end is known only once more text follows)
                out.append(CallProgress(m.group(1), text[m.end():], False))
                break
            out.append(CallProgress(m.group(1), text[m.end():stop], True))
            i = stop
        return out

    def calls_text(self, calls: list[ToolCall]) -> str:
        return "".join(f"{OPEN}{c.name}{ARGS}{c.arguments_json}" for c in calls)

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.native:
            return super().assistant_message(content, calls, text)
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments_json}} for c in calls]}
