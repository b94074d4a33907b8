"""Tool calls in the model's own format: the system prompt that offers tools, the grammar a step is
generated under, and the parse of what the model wrote.

The format is Hermes': `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per
call, as Qwen 2/2.5/3, Hermes and SmolLM are trained to write. A chat template that knows the format
(it mentions `<tool_call>`) renders the tool definitions and tool results itself; for one that does
not (SmolLM2's ignores `tools`), the definitions go into the system prompt in Qwen's words, and tool
results come back as `<tool_response>` blocks in a user turn, as Qwen's template writes them.

A step's grammar makes every call well-formed: its JSON is one of the offered tools' names with
arguments that match that tool's schema (objects closed where the schema leaves
`additionalProperties` unset, unless `close_objects=False`). Free text may not start a tool tag
(`<tool`, `</tool`: `<tool_call>`, `<tool_response>` and their look-alikes) nor write the chat
template's role markers (`<|im_start|>`, ...) outside a well-formed call: nothing the model writes
can be a malformed call, an imitated tool result or an imitated turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentkv.errors import RequestError
from agentkv.grammar.compiler import closed_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names: no markup in a call
MARKUP = (OPEN, CLOSE, "<tool_response>", "</tool_response>")
# What free text may not write: the start of any tool tag (a small model otherwise imitates a
# tool's result as `<tool_response>`, `<tool_response]`, `<tool-response>`), and the template's role
# markers. Nor may it open with a tag of any name: a small model wraps its answer in one it makes up
# (`<user_response>`, `<string>`), copying the shape of the tool results above it.
TAG_STARTS = ("<tool", "</tool")

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


def tool_name_problem(name: Any) -> str | None:
    """What is wrong with a tool's name, or None."""
    if isinstance(name, str) and TOOL_NAME.fullmatch(name):
        return None
    return f"the tool name {name!r} must be 1 to 64 letters, digits, underscores or dashes"


def call_text(call: ToolCall) -> str:
    """A call written as the grammar writes it (compact JSON), so a conversation that sends our
    calls back re-reads them from the radix cache."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False, separators=(",", ":"))
    return f"{OPEN}\n{body}\n{CLOSE}"


@dataclass(frozen=True)
class ToolCallFormat:
    """How one model's chat template offers tools and takes their results."""

    native: bool  # the template renders `tools=` and role "tool" messages itself
    markers: tuple[str, ...] = ()  # the template's role markers (special tokens it writes), kept out of text

    @classmethod
    def for_template(cls, chat_template: str | None, special_tokens=()) -> ToolCallFormat:
        """The format for a chat template; `special_tokens` (texts) are the tokenizer's, of which
        those the template writes are its role markers."""
        markers = tuple(t for t in special_tokens if chat_template and t in chat_template and t not in MARKUP)
        return cls(native=bool(chat_template) and OPEN in chat_template and "tools" in chat_template,
                   markers=markers)

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ToolCallFormat:
        return cls.for_template(tokenizer.chat_template, getattr(tokenizer, "special_tokens", ()))

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

    def grammar(self, tools: list[Any], mode: str, output_schema: dict | None, parallel: bool = True,
                close_objects: bool = True) -> str | None:
        """The Lark grammar of one step, or None for unconstrained text.

        mode: "auto" (text, or the output, or tool calls), "required" (calls of `tools`), "none" (the
        output only: text, or JSON under `output_schema`). `parallel`: several calls in one step.
        `close_objects`: dict schemas' objects take only their declared keys unless they say otherwise.
        """
        if output_schema is None and not tools:
            return None
        if output_schema is not None and close_objects:
            output_schema = closed_schema(output_schema)
        text = f"TEXT: /{free_text(TAG_STARTS + self.markers)}/\n"
        if mode == "none" or not tools:
            # the output; as text, it may not look like a call that will never run, nor a tool's result
            return f"start: {_json(output_schema)}\n" if output_schema is not None else "start: TEXT\n" + text
        more = ' ("\\n" call)*' if parallel else ""
        calls = _calls_schema(tools, close_objects)
        call = f'call: "{_esc(OPEN)}\\n" {_json(calls)} "\\n{_esc(CLOSE)}"\ncalls: call{more}\n'
        if mode == "required":
            return "start: calls\n" + call
        if output_schema is not None:
            return f"start: {_json(output_schema)} | calls\n" + call
        return "start: TEXT | TEXT? calls\n" + text + call

    def parse(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall], int]:
        """(the text before the first call, the complete calls, where the last complete call ends) of
        a step's output written under `grammar`; a call cut short by max_tokens is not among them,
        and none of its markup is in the text (`cut`: the output was cut, so text ending in a start
        of the opening tag ends before it)."""
        head, sep, _ = text.partition(OPEN)
        if not sep:
            return _without_partial_tag(text) if cut else text, [], 0
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


def _without_partial_tag(text: str) -> str:
    """`text` less a start of the opening tag it ends with (an output cut inside `<tool_`)."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return text[:-k]
    return text


def _calls_schema(tools: list[Any], close_objects: bool = True) -> dict:
    branches = [
        {"type": "object", "properties": {"name": {"const": t.name},
                                          "arguments": closed_schema(t.parameters) if close_objects else t.parameters},
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


def free_text(words) -> str:
    """A regex for text in tool mode: none of `words` in it, and its first character after any
    whitespace starts no word and no tag (`<`); or nothing at all."""
    words = [words] if isinstance(words, str) else list(words)
    firsts = "".join(_cls(c) for c in sorted({"<"} | {w[0] for w in words}))
    return f"(?:\\s*[^\\s{firsts}]{text_without(words)})?"


def text_without(words) -> str:
    """A regex (no lookaround) for the strings in which none of `words` occurs.

    No word may contain a word's first character except at its start (true of `<tool_call>` and
    `<|im_start|>` alike), which keeps the automaton a trie: a string is then free characters, and
    partial matches (a proper prefix of a word), each ended either by a first character (which starts
    the next one) or by a character that continues no word (`leave`); it may end inside one.
    """
    words = [words] if isinstance(words, str) else list(dict.fromkeys(words))
    words = [w for w in words if not any(v != w and v in w for v in words)]  # one inside another: the shorter
    firsts = {w[0] for w in words}
    if any(len(w) < 2 or any(c in firsts for c in w[1:]) for w in words):
        raise ValueError(f"text_without needs words of 2+ characters that hold no first character again: {words!r}")
    prefixes = sorted({w[:k] for w in words for k in range(1, len(w))})
    follow = {p: {w[len(p)] for w in words if w.startswith(p) and len(w) > len(p)} for p in prefixes}
    free = "".join(_cls(c) for c in sorted(firsts))
    partial = "|".join(_re(p) for p in prefixes)
    leave = "|".join(f"{_re(p)}[^{''.join(_cls(c) for c in sorted(follow[p] | firsts))}]" for p in prefixes)
    return f"(?:[^{free}]|(?:{partial})*(?:{leave}))*(?:{partial})*"


def _re(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/-" else c for c in text)


def _cls(c: str) -> str:
    return "\\" + c if c in r"\]^-[/" else c
