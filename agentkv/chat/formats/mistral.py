"""Mistral's format (v0.3 instruct and its kin): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`
after any text, `[TOOL_CALLS]` being a special token the grammar writes as that one token. The
template takes tool definitions (`[AVAILABLE_TOOLS]`), calls as structured `tool_calls` and results
(`[TOOL_RESULTS]`), and it insists on call ids of 9 letters and digits: ids are mapped to such."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import JSON_CALL_OPENING, ToolFormat, json_call_part, lark_literal
from agentkv.chat.formats.json_calls import call_object, call_progress, decode_call

OPEN = "[TOOL_CALLS]"
_ID = re.compile(r"[a-zA-Z0-9]{9}")


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's template takes it (9 letters and digits), the same for the same id."""
    return call_id if _ID.fullmatch(call_id) else hashlib.sha1(call_id.encode()).hexdigest()[:9]


@dataclass(frozen=True)
class Mistral(ToolFormat):
    name: ClassVar[str] = "mistral"
    opening: ClassVar[str] = OPEN
    call_opening: ClassVar[str] = JSON_CALL_OPENING
    text_before_calls: ClassVar[bool] = True
    words: ClassVar[tuple[str, ...]] = (OPEN, "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]",
                                        "[/AVAILABLE_TOOLS]")
    special_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    list_space: ClassVar[str] = " "  # what the format writes between its marker and the list
    closing: ClassVar[str] = ""  # what the format writes after the list (Phi-4-mini's <|/tool_call|>)
    instruction: ClassVar[str] = (
        "To call functions, write [TOOL_CALLS] followed by a JSON list of the calls: "
        "[TOOL_CALLS] [{\"name\": <function-name>, \"arguments\": <args-json-object>}]")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return OPEN in chat_template

    def calls_rules(self, parallel) -> str:
        # the spacing calls_text writes, which a conversation sends back: the next prompt re-reads it
        more = ' (", " call)*' if parallel else ""
        closing = f" {lark_literal(self.closing)}" if self.closing else ""
        return f'calls: {lark_literal(self.opening + self.list_space + "[")} call{more} "]"{closing}\n'

    def call_part(self, tool, close_objects) -> str:
        return json_call_part(tool, "arguments", close_objects, style=self.json_style)

    def _first(self, text: str, start: int) -> int:
        i = start + len(self.opening)
        i += text.startswith(" ", i)
        return i + 1 if text.startswith("[", i) else -1

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        calls, end, i = [], 0, self._first(text, start)
        while i >= 0 and (got := decode_call(text, i, "arguments")) is not None:
            calls.append(got[0])
            end = got[1]
            if text.startswith("]", end):
                end += 1
                return calls, end + len(self.closing) if text.startswith(self.closing, end) else end
            i = end + 1 + text.startswith(" ", end + 1) if text.startswith(",", end) else -1
        return calls, end

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        out, i = [], self._first(text, start)
        while i >= 0 and (got := call_progress(text, i, "arguments")) is not None:
            out.append(got[0])
            j = got[1]
            i = j + 1 + text.startswith(" ", j + 1) if text.startswith(",", j) else -1
        return out

    def calls_text(self, calls: list[ToolCall]) -> str:
        written = (call_object(c, "arguments", self.json_style) for c in calls)
        return f"{self.opening}{self.list_space}[" + ", ".join(written) + "]" + self.closing

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.native:
            return super().assistant_message(content, calls, text)
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": mistral_id(c.id), "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}

    def results_messages(self, results: list[tuple[ToolCall, str]]) -> list[dict]:
        if not self.native:
            return super().results_messages(results)
        return [{"role": "tool", "name": c.name, "tool_call_id": mistral_id(c.id), "content": text}
                for c, text in results]
