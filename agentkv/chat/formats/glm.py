"""GLM-4.5's (and 4.6's, 4.7's) calls, one block per call (xml_args.py holds what is shared):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

each block on a line of its own (the reply's text too starts on a new line after the reasoning
block, as the template writes it back). Arguments other than strings are JSON, as the
template writes them back (`v | tojson if v is not string else v`). The template renders the tools
itself, takes calls as structured `tool_calls` whose arguments are a mapping, and gives results back
in an `<|observation|>` turn of `<tool_response>` blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.formats.xml_args import XmlArgs


@dataclass(frozen=True)
class Glm(XmlArgs):
    name: ClassVar[str] = "glm"
    HEAD: ClassVar[str] = "\n<tool_call>"  # (the template writes a reply's every part on a new line)
    NAME_END: ClassVar[str] = "\n"
    KEY: ClassVar[str] = "<arg_key>"
    KEY_END: ClassVar[str] = "</arg_key>\n<arg_value>"
    VALUE_END: ClassVar[str] = "</arg_value>\n"
    TAIL: ClassVar[str] = "</tool_call>"
    BETWEEN: ClassVar[str] = ""
    opening: ClassVar[str] = HEAD
    call_opening: ClassVar[str] = HEAD
    between_text_and_calls: ClassVar[str] = ""
    words: ClassVar[tuple[str, ...]] = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                                        "</arg_value>", "<tool_response>", "</tool_response>")
    instruction: ClassVar[str] = (
        "For each function call, output the function name and arguments within the following XML format:\n"
        "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n"
        "</tool_call>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return "<arg_key>" in chat_template and "<arg_value>" in chat_template
