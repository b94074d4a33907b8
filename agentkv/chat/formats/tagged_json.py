"""Calls between marker tokens with JSON arguments, the shape DeepSeek's and Kimi K2's formats share:

    SECTION_OPEN (CALL_OPEN name [":" index] NAME_END {arguments} CALL_CLOSE)+ SECTION_CLOSE

after any text. A family says its markers (class constants, deepseek.py and kimi.py); the grammar
writes each call's arguments as compact JSON under the tool's schema, and the parse reads the
arguments' text as written, so streamed argument deltas add up to a call's `function.arguments`.
A format whose calls carry an index (Kimi's `functions.get_weather:0`) gives each call the id it
wrote, which its template writes back verbatim (in the call and in its result's header).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import ToolFormat, arguments_schema, json_rule, lark_literal
from agentkv.chat.formats.json_calls import value_end

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class TaggedJson(ToolFormat):
    SECTION_OPEN: ClassVar[str]
    SECTION_CLOSE: ClassVar[str]
    CALL_OPEN: ClassVar[str]
    NAME_END: ClassVar[str]
    CALL_CLOSE: ClassVar[str]
    BETWEEN: ClassVar[str] = ""  # between two calls
    INDEXED: ClassVar[bool] = False  # the name is followed by ":" and the call's index (0, 1, ...)
    ID_PREFIX: ClassVar[str] = ""  # an indexed call's id: ID_PREFIX name ":" index (what CALL_OPEN ends with)

    text_before_calls: ClassVar[bool] = True

    @classmethod
    def _head(cls) -> re.Pattern:
        index = r":(\d+)" if cls.INDEXED else "()"
        return re.compile(re.escape(cls.CALL_OPEN) + r"([a-zA-Z0-9_-]{1,64})" + index + re.escape(cls.NAME_END))

    # ---- grammar ------------------------------------------------------------------------------------

    def calls_rules(self, parallel) -> str:
        more = f" ({lark_literal(self.BETWEEN)} call)*" if self.BETWEEN else " call*"
        return (f"calls: {lark_literal(self.SECTION_OPEN)} call{more if parallel else ''} "
                f"{lark_literal(self.SECTION_CLOSE)}\n")

    def call_part(self, tool, close_objects) -> str:
        # an index of up to three digits, without leading zeros (the families write 0, 1, 2, ...)
        index = ' ":" /(0|[1-9][0-9]{0,2})/' if self.INDEXED else ""
        arguments = json_rule(arguments_schema(tool, close_objects), self.json_style)
        return (f"start: {lark_literal(tool.name)}{index} {lark_literal(self.NAME_END)} "
                f"{arguments} {lark_literal(self.CALL_CLOSE)}\n")

    # ---- reading ------------------------------------------------------------------------------------

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        calls, end, i, head = [], 0, start + len(self.SECTION_OPEN), self._head()
        while m := head.match(text, i):
            try:
                args, stop = _DECODER.raw_decode(text, m.end())
            except ValueError:
                break  # cut short
            if not isinstance(args, dict) or not text.startswith(self.CALL_CLOSE, stop):
                break
            calls.append(ToolCall(m.group(1), args, self._id(m, calls), arguments_text=text[m.end():stop]))
            i = stop + len(self.CALL_CLOSE)
            end = i + len(self.SECTION_CLOSE) if text.startswith(self.SECTION_CLOSE, i) else i
            i += len(self.BETWEEN) if text.startswith(self.BETWEEN, i) else 0
        return calls, end

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        out, i, head = [], start + len(self.SECTION_OPEN), self._head()
        while m := head.match(text, i):
            stop = value_end(text, m.end())
            if stop < 0:  # still being written
                out.append(CallProgress(m.group(1), text[m.end():], False, self._id(m, out)))
                break
            out.append(CallProgress(m.group(1), text[m.end():stop], True, self._id(m, out)))
            i = stop + len(self.CALL_CLOSE) + len(self.BETWEEN)
        return out

    def _id(self, m: re.Match, before: list) -> str:
        """The id an indexed call wrote; one that repeats an earlier call's in the reply (which the
        families never write, and clients could not tell apart) is made that of its place instead."""
        if not self.INDEXED:
            return ""
        taken = {c.id for c in before}
        written = f"{self.ID_PREFIX}{m.group(1)}:{m.group(2)}"
        k = len(before)
        while written in taken:
            written, k = f"{self.ID_PREFIX}{m.group(1)}:{k}", k + 1
        return written

    # ---- writing ------------------------------------------------------------------------------------

    def calls_text(self, calls: list[ToolCall]) -> str:
        return self.SECTION_OPEN + self.BETWEEN.join(
            f"{self.CALL_OPEN}{c.name}{self._index(c, k)}{self.NAME_END}{c.arguments_json}{self.CALL_CLOSE}"
            for k, c in enumerate(calls)) + self.SECTION_CLOSE

    def _index(self, call: ToolCall, k: int) -> str:
        """":" and the index an indexed call wrote (in its id), or its place in the reply."""
        if not self.INDEXED:
            return ""
        written = call.id.rpartition(":")[2] if call.id.startswith(f"{self.ID_PREFIX}{call.name}:") else ""
        return ":" + (written if written.isdigit() else str(k))

    def written_id(self, call: ToolCall, k: int) -> str:
        return f"{self.ID_PREFIX}{call.name}{self._index(call, k)}" if self.INDEXED else call.id

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.native:
            return super().assistant_message(content, calls, text)
        # the template writes the calls itself; their arguments as the text the model wrote
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": self.written_id(c, k), "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments_json}}
                               for k, c in enumerate(calls)]}
