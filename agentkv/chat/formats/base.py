"""What every tool-call format shares: how tools are offered, the shape of a step's grammar, and the
text rules around the calls. Each family's module (hermes.py, llama3.py, mistral.py, mistral_args.py,
pythonic.py, qwen_xml.py, glm.py) says only what is its own: the call syntax as grammar rules, its
parse, and how calls and results are written back into the conversation.

A step's grammar is one of: free text; the output (JSON under a schema); calls; or text or output
*or* calls (tool_choice "auto"). Free text may not start a tool tag (`<tool`, `</tool`), nor write
the chat template's role markers or the format's own markers, nor open with `<` or with a character
that starts the format's calls: nothing the model writes can be a malformed call, an imitated tool
result or an imitated turn, and a reply that starts like a call is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from agentkv.chat.calls import CallProgress, ToolCall, free_text, without_partial
from agentkv.chat.formats.parts import part_text
from agentkv.errors import RequestError
from agentkv.grammar.compiler import closed_schema
from agentkv.grammar.composed import ComposedGrammar
from agentkv.grammar.schema.style import SEPARATORS

TOOL = "tool"  # the rule of a step's grammar that its offered tools' calls compose (one part a tool)

# Free text may not start a tool tag (a small model otherwise imitates a tool's result as
# `<tool_response>`, `<tool_response]`, `<tool-response>`), whatever the format.
TAG_STARTS = ("<tool", "</tool")

INJECTED_HEAD = """

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{definitions}
</tools>

"""


@dataclass(frozen=True)
class ToolFormat:
    """How one model family offers tools, writes its calls and takes their results.

    native: the chat template renders `tools=` itself (else the definitions go into the system
    prompt, in the words of `instruction`). markers: the template's role markers, kept out of text.
    """

    native: bool = False
    markers: tuple[str, ...] = ()
    # The JSON style its calls are written in (grammar/schema/style.py): the template's where it writes
    # calls (chat/formats/template_style.py), a request's where it names one; None: the model's choice.
    json_style: str | None = None

    name: ClassVar[str]
    opening: ClassVar[str]  # what a reply's calls start with
    text_before_calls: ClassVar[bool] = False  # free text may precede the calls in one reply
    words: ClassVar[tuple[str, ...]] = ()  # the format's markup: never in free text
    special_markers: ClassVar[tuple[str, ...]] = ()  # markup the tokenizer holds as special tokens
    template_kwargs: ClassVar[dict[str, Any]] = {}  # what the chat template is rendered with
    instruction: ClassVar[str]  # how to call, after the injected definitions
    call_opening: ClassVar[str] = ""  # what every call starts with, before the tool's own part (call_part)
    text_opening: ClassVar[str] = ""  # what a reply's text or output starts with (harmony's final channel)
    one_call: ClassVar[bool] = False  # a reply makes one call at most (the template writes no more)

    # ---- detection ----------------------------------------------------------------------------------

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        """The template renders tools in this format."""
        return False

    @classmethod
    def for_template(cls, chat_template: str | None, special_tokens=()) -> ToolFormat:
        """This format for a chat template; of the tokenizer's `special_tokens` (texts), those the
        template writes are its role markers."""
        own = set(cls.words) | {cls.opening}
        markers = tuple(t for t in special_tokens if chat_template and t in chat_template and t not in own)
        return cls(native=bool(chat_template) and "tools" in chat_template and cls.knows(chat_template),
                   markers=markers)

    def bind(self, specs) -> ToolFormat:
        """This format for one turn's offered tools (`FunctionSpec`s): most formats read calls without
        them; one that writes arguments in a syntax of its own reads them by their schemas."""
        return self

    # ---- prompts ------------------------------------------------------------------------------------

    def system_message(self, instructions: str, definitions: list[dict]) -> dict:
        """The system message; with a template that does not know tools, it carries their definitions."""
        if self.native or not definitions:
            return {"role": "system", "content": instructions}
        listed = "\n".join(json.dumps(d, ensure_ascii=False) for d in definitions)
        return {"role": "system", "content": instructions + INJECTED_HEAD.format(definitions=listed) + self.instruction}

    def offered(self, messages: list[dict], definitions: list[dict]) -> list[dict]:
        """`messages` with the tool definitions in their system message (made where there is none),
        where the template does not render tools itself; unchanged otherwise."""
        if self.native or not definitions:
            return list(messages)
        first = messages[0] if messages and messages[0].get("role") == "system" else None
        system = self.system_message(first["content"] if first else "", definitions)
        system["content"] = system["content"].lstrip()
        return [system] + list(messages[1:] if first else messages)

    def template_tools(self, definitions: list[dict]) -> list[dict] | None:
        """What to pass as the chat template's `tools=`."""
        return definitions if self.native and definitions else None

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        """An assistant turn that made `calls`, as the conversation keeps it: the text the grammar
        wrote (`text`, where the reply is kept whole), so the next step's prompt re-reads this one
        from the radix cache."""
        if text is None:
            text = self.calls_text(calls)
            if content and self.text_before_calls:
                text = content + self.between_text_and_calls + text
        return {"role": "assistant", "content": text}

    between_text_and_calls: ClassVar[str] = ""

    def written_id(self, call: ToolCall, k: int) -> str:
        """The id the template writes for the `k`th call of a turn (and in its result): the call's
        own, but for a format whose calls carry an id of their own shape (Kimi K2's)."""
        return call.id

    def results_messages(self, results: list[tuple[ToolCall, str]]) -> list[dict]:
        """The messages that give the model its tool calls' results, in the order of the calls."""
        if self.native:
            return [{"role": "tool", "name": c.name, "tool_call_id": c.id, "content": text} for c, text in results]
        body = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for _, text in results)
        return [{"role": "user", "content": body}]

    # ---- grammar ------------------------------------------------------------------------------------

    def grammar(self, tools: list[Any], mode: str, output_schema: dict | None, parallel: bool = True,
                close_objects: bool = True) -> str | ComposedGrammar | None:
        """The grammar of one step (start rule `start`): Lark text, a ComposedGrammar whose parts are the
        offered tools' calls, or None for unconstrained text.

        mode: "auto" (text, or the output, or tool calls), "required" (calls of `tools`), "none" (the
        output only: text, or JSON under `output_schema`). `parallel`: several calls in one step.
        `close_objects`: dict schemas' objects take only their declared keys unless they say otherwise.
        """
        body = self.answer_grammar(tools, mode, output_schema, parallel, close_objects)
        return None if body is None else "start: answer\n" + body

    def answer_grammar(self, tools, mode, output_schema, parallel=True, close_objects=True,
                       markup_free: bool = False) -> str | ComposedGrammar | None:
        """`grammar` with its start rule named `answer` (a reasoning block may come before it).
        `markup_free`: text without tools still may not write the format's markup (a conversation
        that holds calls and results, which a small model would otherwise copy)."""
        if output_schema is None and not tools and not markup_free:
            return None
        if output_schema is not None and close_objects:
            output_schema = closed_schema(output_schema)
        text = f"TEXT: /{free_text(self.text_words(tools), self.opening[0])}/\n"
        lead = f"{lark_literal(self.text_opening)} " if self.text_opening else ""
        if mode == "none" or not tools:
            return f"answer: {lead}{json_rule(output_schema, self.json_style)}\n" if output_schema is not None else \
                f"answer: {lead}TEXT\n" + text
        # each offered tool's call is a part the compiler builds once (grammar/composed.py), so a step
        # whose tools differ from an earlier one's by one tool compiles that tool alone. The opening all
        # calls share stays in the head: where text may run into a call, a mask's walk from the text on
        # into the call then branches to every tool only once a token has passed the opening.
        parts = tuple(part_text(self, t, close_objects) for t in tools)  # (formats/parts.py keeps them)
        opening = f"{lark_literal(self.call_opening)} " if self.call_opening else ""
        calls = self.calls_rules(parallel) + f"call: {opening}{TOOL}\n"
        if mode == "required":
            head = "answer: calls\n" + calls
        elif output_schema is not None:
            head = f"answer: {lead}{json_rule(output_schema, self.json_style)} | calls\n" + calls
        else:
            before = "TEXT? " if self.text_before_calls else ""
            head = f"answer: {lead}TEXT | {before}calls\n" + text + calls
        return ComposedGrammar(head, TOOL, parts, tuple(f"tool {t.name!r}" for t in tools))

    @property
    def forbidden(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(TAG_STARTS + self.words + self.markers))

    def text_words(self, tools: list[Any]) -> tuple[str, ...]:
        """What free text may not contain, beside `tools`."""
        return self.forbidden

    def calls_rules(self, parallel: bool) -> str:
        """Lark rules that define `calls`: one call (the rule `call`, any offered tool's), or several
        when `parallel`."""
        raise NotImplementedError

    def call_part(self, tool: Any, close_objects: bool) -> str:
        """The Lark grammar (start rule `start`) of one call of `tool` after `call_opening`; it depends
        on the tool alone (the compiler keeps it by its text)."""
        raise NotImplementedError

    # ---- reading ------------------------------------------------------------------------------------

    def calls_start(self, text: str) -> int:
        """Where the calls of a reply written under `grammar` begin, or -1."""
        if self.text_before_calls:
            return text.find(self.opening)
        return 0 if text.startswith(self.opening) else -1

    def parse(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall], int]:
        """(the text before the first call, the complete calls, where the last complete call ends) of
        a step's output written under `grammar`; a call cut short by max_tokens is not among them,
        and none of its markup is in the text (`cut`: the output was cut, so text ending in a start
        of the opening ends before it)."""
        start = self.calls_start(text)
        if start < 0:
            return self.content(text) if cut else text, [], 0
        calls, end = self.parse_calls(text, start)
        return text[:start].rstrip(), calls, end

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        """The complete calls from `start` (where `opening` is), and where the last of them ends."""
        raise NotImplementedError

    def text(self, answer: str, final: bool = True) -> str:
        """A reply's answer that is text (no calls), less the header the format writes before text
        (`text_opening`: harmony's final channel), which a stream (`final` False) holds back while it
        may be writing it."""
        head = self.text_opening
        if not head or answer.startswith(head):
            return answer[len(head):]
        return "" if not final and head.startswith(answer) else answer

    def content(self, text: str) -> str:
        """The part of a reply (perhaps still growing) that is surely text: before its calls, less a
        start of the opening it ends with and the whitespace before that (which a reply with calls
        does not keep), or nothing yet where the calls would come first."""
        if not self.text_before_calls:
            stripped = text.lstrip()
            return "" if not stripped or self.opening.startswith(stripped[: len(self.opening)]) else text
        cut = text.find(self.opening)
        return (text[:cut] if cut >= 0 else without_partial(text, self.opening)).rstrip()

    def progress(self, text: str) -> list[CallProgress]:
        """The calls of a reply still being written, as far as they go: each one's name once it is
        complete, and its arguments' text so far (streamed as argument deltas)."""
        start = self.calls_start(text)
        return [] if start < 0 else self.calls_progress(text, start)

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        calls, _ = self.parse_calls(text, start)
        return [CallProgress(c.name, c.arguments_json, True) for c in calls]

    def calls_text(self, calls: list[ToolCall]) -> str:
        """`calls` written as the grammar writes them."""
        raise NotImplementedError


def json_rule(schema: dict, style: str | None = None) -> str:
    """A %json block; `style` names its JSON style (else the compiler's: the request's)."""
    return lark_schema(f"%json:{style}" if style else "%json", schema)


def lark_schema(directive: str, schema: dict) -> str:
    text = json.dumps(schema, ensure_ascii=False)
    if "\n" in text:  # json.dumps escapes newlines in strings; this only guards the grammar's line syntax
        raise RequestError("a tool schema must not contain raw newlines")
    return f"{directive} {text}"


def lark_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def arguments_schema(tool: Any, close_objects: bool) -> dict:
    return closed_schema(tool.parameters) if close_objects else tool.parameters


JSON_CALL_OPENING = '{"name":'


def json_call_part(tool: Any, arguments_key: str, close_objects: bool, after: str = "",
                   style: str | None = None) -> str:
    """The grammar of one call `{"name":"<tool>","<arguments_key>":{...}}` (the name first: the closed
    object schema with the name's const and both keys required) after its opening (JSON_CALL_OPENING),
    then `after`. In `style` (None: the model's choice): the call's separators and its arguments' are
    one style, so under the model's choice the call's first separator picks both. Each style's
    branch starts with a literal (the name, after the space where spaced): the compiler links a
    branch when a step first reads past it (grammar/composer.py's lazy parts)."""
    name = json.dumps(tool.name, ensure_ascii=False)
    schema = arguments_schema(tool, close_objects)
    styles = ("compact", "spaced") if style in (None, "model") else (style,)
    branches = []
    for one in styles:
        comma, colon = SEPARATORS[one]
        head = colon[1:] + name + comma + f'"{arguments_key}"' + colon  # (after the opening's `{"name":`)
        branches.append(f"{lark_literal(head)} {json_rule(schema, one)}")
    body = branches[0] if len(branches) == 1 else "(" + " | ".join(branches) + ")"
    return f"start: {body} {lark_literal('}' + after)}\n"
