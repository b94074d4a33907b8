"""gpt-oss's harmony format. After the prompt's `<|start|>assistant` a reply is an optional analysis
message (the reasoning: `<|channel|>analysis<|message|>...<|end|><|start|>assistant`, chat/reasoning.py),
then either the final message or one call to a function:

    <|channel|>final<|message|>The weather is sunny.
     to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}

ended by the model's stop tokens (`<|return|>`, `<|call|>`). Every marker is a special token the
grammar writes as that token; the final channel's header is written before free text and before a
JSON output alike, and taken off again when the reply is read. A call's header is the one gpt-oss's
template writes back (the recipient before the channel), so a call re-reads as it was written, but
for its arguments, which the template re-spaces (`tojson`). The template writes one call to a
message, so a reply makes one call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import ToolFormat, arguments_schema, json_rule, lark_literal
from agentkv.chat.formats.json_calls import value_end

FINAL = "<|channel|>final<|message|>"
TO = " to=functions."
COMMENTARY = "<|channel|>commentary json<|message|>"
SPECIALS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>")
_CALL = re.compile(re.escape(TO) + r"([a-zA-Z0-9_-]{1,64})" + re.escape(COMMENTARY))
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Harmony(ToolFormat):
    name: ClassVar[str] = "harmony"
    opening: ClassVar[str] = TO
    call_opening: ClassVar[str] = TO
    text_opening: ClassVar[str] = FINAL
    one_call: ClassVar[bool] = True
    words: ClassVar[tuple[str, ...]] = SPECIALS
    special_markers: ClassVar[tuple[str, ...]] = SPECIALS[:5]
    instruction: ClassVar[str] = "Calls to these tools must go to the commentary channel: 'functions'."

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return "<|channel|>commentary" in chat_template

    def calls_rules(self, parallel) -> str:
        return "calls: call\n"

    def call_part(self, tool, close_objects) -> str:
        return (f"start: {lark_literal(tool.name + COMMENTARY)} "
                f"{json_rule(arguments_schema(tool, close_objects), self.json_style)}\n")

    def template_tools(self, definitions: list[dict]) -> list[dict] | None:
        # gpt-oss's template writes each tool's description unguarded (a tool without one fails to render)
        tools = super().template_tools(definitions)
        return tools and [{**d, "function": {"description": "", **d["function"]}} if "function" in d else d
                          for d in tools]

    # ---- reading ------------------------------------------------------------------------------------

    def parse(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall], int]:
        if not text.startswith(TO):
            return self.content(text), [], 0
        calls, end = self.parse_calls(text, 0)
        return "", calls, end

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        m = _CALL.match(text, start)
        if not m:
            return [], 0
        try:
            args, stop = _DECODER.raw_decode(text, m.end())
        except ValueError:
            return [], 0  # cut short
        if not isinstance(args, dict):
            return [], 0
        return [ToolCall(m.group(1), args, arguments_text=text[m.end():stop])], stop

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        m = _CALL.match(text, start)
        if not m:
            return []
        stop = value_end(text, m.end())
        if stop < 0:
            return [CallProgress(m.group(1), text[m.end():], False)]
        return [CallProgress(m.group(1), text[m.end():stop], True)]

    def content(self, text: str) -> str:
        """The final message's text: the reply less its channel header (nothing while the header, or
        a call's, may still be being written)."""
        if text.startswith(TO) or TO.startswith(text):
            return ""
        return self.text(text, final=False)

    # ---- writing ------------------------------------------------------------------------------------

    def calls_text(self, calls: list[ToolCall]) -> str:
        return "".join(f"{TO}{c.name}{COMMENTARY}{c.arguments_json}" for c in calls[:1])

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.native:
            return super().assistant_message(content, calls, text)
        # the template writes the call (the arguments a mapping it writes as JSON)
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                             "arguments": c.arguments}}
                               for c in calls]}
