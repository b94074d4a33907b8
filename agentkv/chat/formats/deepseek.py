"""DeepSeek's calls, in a section of its marker tokens after any text. V3.1's (and V3.2-Exp's, on the
same template) have the arguments straight after the name:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city":"Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3's and R1's (V3-0324, R1-0528 and R1's distilled models) name the call's type and fence the
arguments, one call a line:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city":"Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Both templates write calls (`tool_calls`, the arguments as the text the model wrote) and results
(`<｜tool▁output▁begin｜>`) themselves but not the tools: their definitions go into the system prompt
in the words of DeepSeek's own tool prompts (V3.1's model card; V2.5's and V3's, "## Tools")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.calls import ToolCall
from agentkv.chat.formats.tagged_json import TaggedJson

SECTION, SECTION_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
WORDS = (SECTION, SECTION_END, CALL, SEP, CALL_END, "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
         "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")


@dataclass(frozen=True)
class DeepSeekV31(TaggedJson):
    name: ClassVar[str] = "deepseek_v31"
    SECTION_OPEN: ClassVar[str] = SECTION
    SECTION_CLOSE: ClassVar[str] = SECTION_END
    CALL_OPEN: ClassVar[str] = CALL
    NAME_END: ClassVar[str] = SEP
    CALL_CLOSE: ClassVar[str] = CALL_END
    opening: ClassVar[str] = SECTION
    call_opening: ClassVar[str] = CALL
    words: ClassVar[tuple[str, ...]] = WORDS
    # DeepSeek's tool prompt (its model card's), after the tools' definitions
    instruction: ClassVar[str] = (
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        f"{SECTION}{CALL}tool_call_name{SEP}tool_call_arguments{CALL_END}{{{{additional_tool_calls}}}}"
        f"{SECTION_END}\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces\n")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return SEP in chat_template and "```json" not in chat_template  # (V3's and R1's fence theirs)

    def system_message(self, instructions: str, definitions: list[dict]) -> dict:
        if self.native or not definitions:
            return super().system_message(instructions, definitions)
        tools = "".join(f"\n### {fn['name']}\nDescription: {fn.get('description', '')}\n\nParameters: "
                        f"{json.dumps(fn.get('parameters') or {}, ensure_ascii=False)}\n"
                        for fn in (d.get("function", d) for d in definitions))
        head = instructions + "\n\n" if instructions else ""
        return {"role": "system", "content": f"{head}## Tools\nYou have access to the following tools:\n{tools}\n"
                                             + self.instruction}

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        # the template writes calls itself, tools offered in its words or not
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                             "arguments": c.arguments_json}}
                               for c in calls]}

    def results_messages(self, results: list[tuple[ToolCall, str]]) -> list[dict]:
        return [{"role": "tool", "name": c.name, "tool_call_id": c.id, "content": text} for c, text in results]



@dataclass(frozen=True)
class DeepSeekV3(DeepSeekV31):
    name: ClassVar[str] = "deepseek_v3"
    CALL_OPEN: ClassVar[str] = CALL + "function" + SEP
    NAME_END: ClassVar[str] = "\n```json\n"
    CALL_CLOSE: ClassVar[str] = "\n```" + CALL_END
    BETWEEN: ClassVar[str] = "\n"
    call_opening: ClassVar[str] = CALL + "function" + SEP
    instruction: ClassVar[str] = ""  # DeepSeek's prompt lists the functions alone

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return SEP in chat_template and "```json" in chat_template

    def system_message(self, instructions: str, definitions: list[dict]) -> dict:
        if self.native or not definitions:
            return super().system_message(instructions, definitions)
        tools = "".join(f"- `{fn['name']}`:\n```json\n{json.dumps(fn, indent=4, ensure_ascii=False)}\n```\n"
                        for fn in (d.get("function", d) for d in definitions))
        head = instructions + "\n\n" if instructions else ""
        return {"role": "system",
                "content": f"{head}## Tools\n\n### Function\n\nYou have the following functions available:\n\n{tools}"}
