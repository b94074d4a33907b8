"""Phi-4-mini's calls: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>`, both
markers special tokens, the list as Granite's (granite.py). Its template takes the tools neither as
`tools=` nor in a turn of their own: a system message carries their definitions in a `tools` field
(JSON text), which the template writes between `<|tool|>` and `<|/tool|>`. It writes every message
as `<|role|>content<|end|>`: a reply's calls go back as the text the model wrote, results as role
"tool" turns (`<|tool|>...<|end|>`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.formats.granite import Granite

OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"
# Microsoft's system prompt where a conversation brings none (its model card's example)
DEFAULT_SYSTEM = "You are a helpful assistant with some tools."


@dataclass(frozen=True)
class Phi4Mini(Granite):
    name: ClassVar[str] = "phi4_mini"
    opening: ClassVar[str] = OPEN
    closing: ClassVar[str] = CLOSE
    words: ClassVar[tuple[str, ...]] = (OPEN, CLOSE, "<|tool|>", "<|/tool|>", "<|tool_response|>")
    special_markers: ClassVar[tuple[str, ...]] = (OPEN, CLOSE)
    instruction: ClassVar[str] = (
        "To call functions, respond with <|tool_call|>, a JSON list of the calls and <|/tool_call|>: "
        "<|tool_call|>[{\"name\": <function-name>, \"arguments\": <args-json-object>}]<|/tool_call|>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return "<|tool|>" in chat_template and "<|/tool|>" in chat_template

    def template_tools(self, definitions: list[dict]) -> list[dict] | None:
        return None if self.native else super().template_tools(definitions)

    def system_message(self, instructions: str, definitions: list[dict]) -> dict:
        if not self.native or not definitions:
            return super().system_message(instructions, definitions)
        functions = [d.get("function", d) for d in definitions]
        return {"role": "system", "content": instructions, "tools": json.dumps(functions, ensure_ascii=False)}

    def offered(self, messages: list[dict], definitions: list[dict]) -> list[dict]:
        if not self.native or not definitions:
            return super().offered(messages, definitions)
        first = messages[0] if messages and messages[0].get("role") == "system" else None
        system = self.system_message(first["content"] if first else DEFAULT_SYSTEM, definitions)
        return [system] + list(messages[1:] if first else messages)
