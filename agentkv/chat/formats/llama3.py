"""Llama 3.1 / 3.2 / 3.3's JSON format: a reply that calls a tool is the object
`{"name": ..., "parameters": {...}}` (several separated by "; ", as vLLM's llama3_json reads them).
Results come back in the template's `ipython` turns (role "tool"). The template is rendered with
`tools_in_user_message=False`, which puts the definitions in the system turn rather than in the
first user message: the prefix every conversation shares (and an agent pins) then holds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import JSON_CALL_OPENING, ToolFormat, json_call_part
from agentkv.chat.formats.json_calls import call_object, call_progress, decode_call

SEPARATOR = "; "


@dataclass(frozen=True)
class Llama3Json(ToolFormat):
    name: ClassVar[str] = "llama3_json"
    # The model is trained to reply with the call alone, but may write a sentence first: the call
    # head is kept out of free text, so a call written after text is a call, never content.
    opening: ClassVar[str] = '{"name":'
    call_opening: ClassVar[str] = JSON_CALL_OPENING
    text_before_calls: ClassVar[bool] = True
    between_text_and_calls: ClassVar[str] = " "
    words: ClassVar[tuple[str, ...]] = ('{"name":',)
    template_kwargs: ClassVar[dict[str, Any]] = {"tools_in_user_message": False}
    instruction: ClassVar[str] = (
        "To call a function, respond with only the JSON for the call, in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}. "
        "Do not use variables.")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return "<|start_header_id|>" in chat_template and ("<|python_tag|>" in chat_template
                                                            or '"parameters"' in chat_template)

    def calls_rules(self, parallel) -> str:
        more = f' ("{SEPARATOR}" call)*' if parallel else ""
        return f"calls: call{more}\n"

    def call_part(self, tool, close_objects) -> str:
        return json_call_part(tool, "parameters", close_objects, style=self.json_style)

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        calls, end, i = [], 0, start
        while True:
            got = decode_call(text, i, "parameters")
            if got is None:
                break
            calls.append(got[0])
            end = got[1]
            if not text.startswith(SEPARATOR, end):
                break
            i = end + len(SEPARATOR)
        return calls, end

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        out, i = [], start
        while (got := call_progress(text, i, "parameters")) is not None:
            out.append(got[0])
            i = got[1] + len(SEPARATOR)
        return out

    def calls_text(self, calls: list[ToolCall]) -> str:
        return SEPARATOR.join(call_object(c, "parameters", self.json_style) for c in calls)
