"""Granite 3.x's calls (IBM Granite 3.1-3.3): `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`, the
marker a special token, its list as Mistral v3 writes its own (mistral.py). The template renders the
tools itself (an `available_tools` turn) but writes every message as its content: a reply's calls go
back as the text the model wrote, results as role "tool" turns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import ToolCall
from agentkv.chat.formats.base import ToolFormat
from agentkv.chat.formats.mistral import Mistral

OPEN = "<|tool_call|>"


@dataclass(frozen=True)
class Granite(Mistral):
    name: ClassVar[str] = "granite"
    opening: ClassVar[str] = OPEN
    list_space: ClassVar[str] = ""
    words: ClassVar[tuple[str, ...]] = (OPEN,)
    special_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    instruction: ClassVar[str] = (
        "When a tool is required to answer the user's query, respond only with <|tool_call|> followed by a JSON "
        "list of tools used: <|tool_call|>[{\"name\": <function-name>, \"arguments\": <args-json-object>}]")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return "<|start_of_role|>" in chat_template and ("available_tools" in chat_template or OPEN in chat_template)

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        return ToolFormat.assistant_message(self, content, calls, text)

    def results_messages(self, results: list[tuple[ToolCall, str]]) -> list[dict]:
        return ToolFormat.results_messages(self, results)
