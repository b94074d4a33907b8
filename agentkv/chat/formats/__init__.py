"""Each model family's tool-call format, as data: how tools are offered, the call syntax as a
grammar over the offered tools' schemas, how calls and results are written back, how to read them.

    fmt = tool_format_for(tokenizer)            # detected from the chat template and special tokens
    fmt = tool_format_for(tokenizer, "mistral") # or named (Engine(tool_format=...), serve --tool-format)

The agent loop, the server and `engine.chat(tools=...)` all go through the engine's format.
"""

from __future__ import annotations

from agentkv.chat.formats.base import TAG_STARTS, ToolFormat
from agentkv.chat.formats.deepseek import DeepSeekV3, DeepSeekV31
from agentkv.chat.formats.gemma import FunctionGemma, Gemma4
from agentkv.chat.formats.glm import Glm
from agentkv.chat.formats.granite import Granite
from agentkv.chat.formats.harmony import Harmony
from agentkv.chat.formats.hermes import Hermes
from agentkv.chat.formats.kimi import Kimi
from agentkv.chat.formats.llama3 import Llama3Json
from agentkv.chat.formats.mistral import Mistral
from agentkv.chat.formats.mistral_args import MistralArgs
from agentkv.chat.formats.phi4 import Phi4Mini
from agentkv.chat.formats.pythonic import Pythonic
from agentkv.chat.formats.qwen_xml import QwenXml
from agentkv.errors import RequestError

FORMATS: dict[str, type[ToolFormat]] = {f.name: f for f in (
    DeepSeekV3, DeepSeekV31, FunctionGemma, Gemma4, Glm, Granite, Harmony, Hermes, Kimi, Llama3Json, Mistral,
    MistralArgs, Phi4Mini, Pythonic, QwenXml)}
# Detection order: the most specific mark first (gpt-oss's channels, Gemma 4's and FunctionGemma's
# `call:`, Kimi's and DeepSeek's marker tokens, Granite's roles, Phi-4-mini's <|tool|>, Mistral's
# [ARGS], then its [TOOL_CALLS], Qwen's XML <function=, GLM's <arg_key>, then Hermes' <tool_call>,
# which those templates and Llama-based Hermes templates hold too).
DETECTION = (Harmony, Gemma4, FunctionGemma, Kimi, DeepSeekV3, DeepSeekV31, Granite, Phi4Mini, MistralArgs, Mistral,
             QwenXml, Glm, Hermes, Pythonic, Llama3Json)


def detect(chat_template: str | None, special_tokens=()) -> type[ToolFormat]:
    """The format a chat template (and the tokenizer's special tokens) was written for; Hermes'
    where nothing says (the format most small models are trained on, offered in the system prompt)."""
    for fmt in DETECTION:
        if chat_template and fmt.knows(chat_template):
            return fmt
    if "[ARGS]" in special_tokens:
        return MistralArgs
    if Mistral.opening in special_tokens:
        return Mistral
    return Hermes


def tool_format_for(tokenizer, name: str | None = None) -> ToolFormat:
    """The tool format of a tokenizer's model: `name` (one of FORMATS), or detected."""
    template = getattr(tokenizer, "chat_template", None)
    specials = tuple(getattr(tokenizer, "special_tokens", ()))
    if name is None:
        return detect(template, specials).for_template(template, specials)
    return format_class(name).for_template(template, specials)


def format_class(name: str) -> type[ToolFormat]:
    if name not in FORMATS:
        raise RequestError(f"tool_format={name!r} is not known; choose one of {sorted(FORMATS)} (or leave it unset "
                           "to detect it from the chat template)")
    return FORMATS[name]


__all__ = ["FORMATS", "TAG_STARTS", "DeepSeekV3", "DeepSeekV31", "FunctionGemma", "Gemma4", "Glm", "Granite",
           "Harmony", "Hermes", "Kimi", "Llama3Json", "Mistral", "MistralArgs", "Phi4Mini", "Pythonic", "QwenXml",
           "ToolFormat", "detect", "format_class", "tool_format_for"]
