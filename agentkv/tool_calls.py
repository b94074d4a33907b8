"""Tool calls in the model's own format: the system prompt that offers tools, the grammar a step is
generated under, and the parse of what the model wrote.

The format is Hermes': `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per
call, as Qwen 2/2.5/3, Hermes and SmolLM are trained to write. A chat template that knows the format
(it mentions `<tool_call>`) renders the tool definitions and tool results itself; for one that does
not (SmolLM2's ignores `tools`), the definitions go into the system prompt in Qwen's words, and tool
results come back as `<tool_response>` blocks in a user turn, as Qwen's template writes them.

A step's grammar makes every call well-formed: its JSON is one of the offered tools' names with
arguments that match that tool's schema. Free text (under tool_choice "auto") may not contain
`<tool_call>` outside a well-formed call, so nothing the model writes can be a malformed call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentkv.errors import RequestError

OPEN, CLOSE = "<tool_call>", "</tool_call>"

_INJECTED_TOOLS = """

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{definitions}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class FunctionSpec:
    """A tool as the format needs it: what `ak.tool` objects and OpenAI tool definitions both give."""

    name: str
    parameters: dict

    @property
    def definition(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "parameters": self.parameters}}


def call_text(call: ToolCall) -> str:
    """A call written as the grammar writes it (compact JSON), so a conversation that sends our
    calls back re-reads them from the radix cache."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False, separators=(",", ":"))
    return f"{OPEN}\n{body}\n{CLOSE}"


@dataclass(frozen=True)
class ToolCallFormat:
    """How one model's chat template offers tools and takes their results."""

    native: bool  # the template renders `tools=` and role "tool" messages itself

    @classmethod
    def for_template(cls, chat_template: str | None) -> ToolCallFormat:
        return cls(native=bool(chat_template) and OPEN in chat_template and "tools" in chat_template)

    # ---- prompts ------------------------------------------------------------------------------------

    def system_message(self, instructions: str, definitions: list[dict]) -> dict:
        """The system message; with a template that does not know tools, it carries their definitions."""
        if self.native or not definitions:
            return {"role": "system", "content": instructions}
        listed = "\n".join(json.dumps(d, ensure_ascii=False) for d in definitions)
        return {"role": "system", "content": instructions + _INJECTED_TOOLS.format(definitions=listed)}

    def template_tools(self, definitions: list[dict]) -> list[dict] | None:
        """What to pass as the chat template's `tools=`."""
        return definitions if self.native and definitions else None

    def results_messages(self, results: list[tuple[ToolCall, str]]) -> list[dict]:
        """The messages that give the model its tool calls' results, in the order of the calls."""
        if self.native:
            return [{"role": "tool", "name": call.name, "tool_call_id": call.id, "content": text} for call, text in results]
        body = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for _, text in results)
        return [{"role": "user", "content": body}]

    # ---- grammar ------------------------------------------------------------------------------------

    def grammar(self, tools: list[Any], mode: str, output_schema: dict | None, parallel: bool = True) -> str | None:
        """The Lark grammar of one step, or None for unconstrained text.

        mode: "auto" (text, or the output, or tool calls), "required" (calls of `tools`), "none" (the
        output only: text, or JSON under `output_schema`). `parallel`: several calls in one step.
        """
        if output_schema is None and not tools:
            return None
        if mode == "none" or not tools:
            # the output; as text, it may not look like a call that will never run
            return f"start: {_json(output_schema)}\n" if output_schema is not None else _TEXT_ONLY
        more = ' ("\\n" call)*' if parallel else ""
        call = f'call: "{_esc(OPEN)}\\n" {_json(_calls_schema(tools))} "\\n{_esc(CLOSE)}"\ncalls: call{more}\n'
        if mode == "required":
            return "start: calls\n" + call
        if output_schema is not None:
            return f"start: {_json(output_schema)} | calls\n" + call
        return "start: TEXT | TEXT? calls\n" + _TEXT + call

    def parse(self, text: str) -> tuple[str, list[ToolCall], int]:
        """(the text before the first call, the complete calls, where the last complete call ends) of
        a step's output written under `grammar`; a call cut short by max_tokens is not among them."""
        head, sep, _ = text.partition(OPEN)
        if not sep:
            return text, [], 0
        decoder = json.JSONDecoder()
        calls, end, i = [], 0, len(head)
        while text.startswith(OPEN + "\n", i):
            # decode rather than search for the closing tag: an argument string may contain it
            try:
                value, j = decoder.raw_decode(text, i + len(OPEN) + 1)
            except json.JSONDecodeError:  # cut short
                break
            if not text.startswith("\n" + CLOSE, j):
                break
            calls.append(ToolCall(value["name"], value["arguments"]))
            end = j + 1 + len(CLOSE)
            i = end + 1
        return head.strip(), calls, end


def _calls_schema(tools: list[Any]) -> dict:
    branches = [
        {"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in tools
    ]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _json(schema: dict) -> str:
    text = json.dumps(schema, ensure_ascii=False)
    if "\n" in text:  # json.dumps escapes newlines in strings; this only guards the grammar's line syntax
        raise RequestError("a tool schema must not contain raw newlines")
    return f"%json {text}"


def _esc(literal: str) -> str:
    return literal.replace("\\", "\\\\").replace('"', '\\"')


def text_without(word: str) -> str:
    """A regex (no lookaround) for the strings in which `word` never occurs.

    `word`'s first character must not occur again in it (true of `<tool_call>`), which keeps the
    automaton simple: after a partial match, that character restarts the match and any other
    mismatch starts over. A string is then: runs that are not the first character, or the first
    character followed by partial matches restarted by it (`loop`) and one mismatch (`leave`);
    it may end inside a partial match (`tail`).
    """
    first, rest = word[0], word[1:]
    if not rest or first in rest:
        raise ValueError(f"text_without needs a word of 2+ characters whose first does not recur: {word!r}")
    prefixes = [rest[:k] for k in range(len(rest))]
    loop = "|".join(f"{_re(p)}{_re(first)}" for p in prefixes)
    leave = "|".join(f"{_re(p)}[^{_cls(rest[k])}{_cls(first)}]" for k, p in enumerate(prefixes))
    tail = "|".join(_re(p) for p in prefixes if p)
    return (f"(?:[^{_cls(first)}]|{_re(first)}(?:{loop})*(?:{leave}))*"
            f"(?:{_re(first)}(?:{loop})*(?:{tail})?)?")


def _re(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/-" else c for c in text)


def _cls(c: str) -> str:
    return "\\" + c if c in r"\]^-[/" else c


# free text that cannot contain a call's opening tag (the grammars above name it)
_TEXT = f"TEXT: /{text_without(OPEN)}/\n"
_TEXT_ONLY = "start: TEXT\n" + _TEXT
