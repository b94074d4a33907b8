"""Kimi K2's calls (Kimi-K2-Instruct and its updates), in a section of special tokens after any text:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city":"Paris"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the reply). The call's id is `functions.<name>:<index>`, written by the model; its
template writes a call back by that id and a result as `## Return of <id>` in a turn of its own, so a
call keeps the id it wrote (returned to clients as the call's id), and a call a client names
otherwise is written back under the id of its place in the turn. The template renders the tools
itself (a `tool_declare` turn)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.formats.tagged_json import TaggedJson

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


@dataclass(frozen=True)
class Kimi(TaggedJson):
    name: ClassVar[str] = "kimi_k2"
    SECTION_OPEN: ClassVar[str] = SECTION
    SECTION_CLOSE: ClassVar[str] = SECTION_END
    CALL_OPEN: ClassVar[str] = CALL + "functions."
    NAME_END: ClassVar[str] = ARGUMENTS
    CALL_CLOSE: ClassVar[str] = CALL_END
    INDEXED: ClassVar[bool] = True
    ID_PREFIX: ClassVar[str] = "functions."
    opening: ClassVar[str] = SECTION
    call_opening: ClassVar[str] = CALL + "functions."
    words: ClassVar[tuple[str, ...]] = (SECTION, SECTION_END, CALL, ARGUMENTS, CALL_END)
    special_markers: ClassVar[tuple[str, ...]] = words
    instruction: ClassVar[str] = (
        "To call functions, write them in a section: <|tool_calls_section_begin|>, then for each call "
        "<|tool_call_begin|>functions.<function-name>:<index><|tool_call_argument_begin|><args-json-object>"
        "<|tool_call_end|>, then <|tool_calls_section_end|>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return SECTION in chat_template
