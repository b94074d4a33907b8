"""Hermes' format, as Qwen 2/2.5/3, Hermes and SmolLM write it:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call, text before them.
Results come back as role "tool" messages the template writes as `<tool_response>` blocks (or, with
a template that does not know tools, as those blocks in a user turn)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import JSON_CALL_OPENING, ToolFormat, json_call_part
from agentkv.chat.formats.json_calls import call_object, call_progress, decode_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Hermes(ToolFormat):
    name: ClassVar[str] = "hermes"
    opening: ClassVar[str] = OPEN
    text_before_calls: ClassVar[bool] = True
    call_opening: ClassVar[str] = OPEN + "\n" + JSON_CALL_OPENING
    between_text_and_calls: ClassVar[str] = "\n"
    words: ClassVar[tuple[str, ...]] = (OPEN, CLOSE, "<tool_response>", "</tool_response>")
    instruction: ClassVar[str] = (
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return OPEN in chat_template

    def calls_rules(self, parallel) -> str:
        more = ' ("\\n" call)*' if parallel else ""
        return f"calls: call{more}\n"

    def call_part(self, tool, close_objects) -> str:
        return json_call_part(tool, "arguments", close_objects, "\n" + CLOSE, self.json_style)

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        calls, end, i = [], 0, start
        while text.startswith(OPEN + "\n", i):
            got = decode_call(text, i + len(OPEN) + 1, "arguments")
            if got is None or not text.startswith("\n" + CLOSE, got[1]):
                break  # cut short
            calls.append(got[0])
            end = got[1] + 1 + len(CLOSE)
            i = end + 1
        return calls, end

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        out, i = [], start
        while text.startswith(OPEN + "\n", i):
            got = call_progress(text, i + len(OPEN) + 1, "arguments")
            if got is None:
                break
            out.append(got[0])
            i = got[1] + 1 + len(CLOSE) + 1
        return out

    def calls_text(self, calls: list[ToolCall]) -> str:
        return "\n".join(f"{OPEN}\n{call_object(c, 'arguments', self.json_style)}\n{CLOSE}" for c in calls)
