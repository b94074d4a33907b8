"""Qwen3-Coder's and Qwen3.5's XML calls, one block per call (xml_args.py holds what is shared):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

(a newline between blocks, a blank line after any text before them). Arguments other than strings
are JSON, as the template writes them back (`args_value | string`, `tojson` for objects and arrays);
booleans and null are also read and written in the template's Python spelling (True, False, None).
The template renders the tools itself and takes calls as structured `tool_calls` whose arguments
are a mapping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentkv.chat.formats.xml_args import XmlArgs


@dataclass(frozen=True)
class QwenXml(XmlArgs):
    name: ClassVar[str] = "qwen3_xml"
    HEAD: ClassVar[str] = "<tool_call>\n<function="
    NAME_END: ClassVar[str] = ">\n"
    KEY: ClassVar[str] = "<parameter="
    KEY_END: ClassVar[str] = ">\n"
    VALUE_END: ClassVar[str] = "\n</parameter>\n"
    TAIL: ClassVar[str] = "</function>\n</tool_call>"
    python_literals: ClassVar[bool] = True
    opening: ClassVar[str] = HEAD
    call_opening: ClassVar[str] = HEAD
    between_text_and_calls: ClassVar[str] = "\n\n"
    words: ClassVar[tuple[str, ...]] = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                                        "</parameter>", "<tool_response>", "</tool_response>")
    instruction: ClassVar[str] = (
        "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
        "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
        "</tool_call>")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        return "<function=" in chat_template and "<parameter=" in chat_template
