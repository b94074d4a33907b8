"""One assistant reply under a model's tool format: a `Turn` owns what the reply may be (the tools its
grammar offers and in which mode, the output's schema, whether a reasoning block comes first), the
prompt's part of it (the tool definitions where the chat template expects them, or in the system
message where it does not know tools), the reply's grammar, and the read-back: the reasoning split
off, the calls it completed parsed, and each call's arguments checked against its tool's whole schema
(what the grammar relaxed; an `OutputValidationError` with the text).

`Engine.chat`, the server's chat and responses routes and each agent step all plan and read their
replies here; they keep only their own mapping (HTTP fields, an agent's Step). A call cut by
max_tokens is left out, and the text never holds the format's markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from agentkv.chat.calls import FunctionSpec, ToolCall, tool_name_problem
from agentkv.chat.formats import ToolFormat
from agentkv.chat.reasoning import ReasoningFormat, State, reply_grammar
from agentkv.errors import OutputValidationError, RequestError
from agentkv.grammar.compiler import output_grammar_schema
from agentkv.grammar.schema.parse import value_parser
from agentkv.grammar.schema.validation import schema_check

MODES = ("auto", "required", "none")


@dataclass(frozen=True)
class Reply:
    """A reply read back: its reasoning (None where it did not reason), its answer (the text after the
    reasoning block), the answer's text before any call (none of the format's markup), the calls it
    completed, where the last of them ends in the answer, and where the calls start (-1: none)."""

    reasoning: str | None
    answer: str
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    calls_end: int = 0
    calls_start: int = -1


@dataclass(frozen=True)
class Turn:
    fmt: ToolFormat
    specs: tuple[FunctionSpec, ...] = ()  # the tools the grammar offers (one, for a named tool_choice)
    definitions: tuple[dict, ...] = ()  # every tool's definition, as the prompt shows them
    mode: str = "none"  # "auto", "required" or "none"
    schema: Any = None  # the output's schema (a type or a JSON schema) under "auto" / "none"; None: text
    parallel: bool = True  # several calls in one reply
    # text may not write the format's markup even without tools (a conversation that holds calls,
    # which a small model would otherwise copy)
    markup_free: bool = False
    reasoning: ReasoningFormat | None = None  # the model's reasoning markers
    state: State = "off"  # where the reply starts: inside a block, free to open one, or not reasoning

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", self.fmt.bind(self.specs))  # (frozen: set once, here)

    @classmethod
    def plan(cls, fmt: ToolFormat, tools=(), tool_choice: str = "auto", schema: Any = None,
             reasoning: ReasoningFormat | None = None, parallel: bool = True) -> Turn:
        """A turn over `tools` (`@ak.tool` functions or OpenAI definitions); `tool_choice` "auto",
        "required", "none" or a tool's name (then calls of it only). RequestError names what is wrong."""
        specs, defs = [], []
        for i, t in enumerate(tools):
            spec, definition = _spec(t, i)
            specs.append(spec)
            defs.append(definition)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise RequestError(f"tools have repeated names ({names}); give each tool its own name")
        mode = tool_choice if specs else "none"
        if tool_choice not in MODES:
            if tool_choice not in names:
                raise RequestError(f"tool_choice={tool_choice!r} is neither one of {list(MODES)} nor a tool's name "
                                   f"({names})")
            specs, mode = [s for s in specs if s.name == tool_choice], "required"
        return cls(fmt, tuple(specs), tuple(defs), mode, schema, parallel, reasoning=reasoning)

    def after(self, prompt: str) -> Turn:
        """This turn as a reply to the rendered `prompt` (which says whether it may reason)."""
        return replace(self, state=self.reasoning.state(prompt)) if self.reasoning is not None else self

    # ---- the prompt's part ------------------------------------------------------------------------------

    @property
    def template_tools(self) -> list[dict] | None:
        """The definitions as the chat template's `tools` variable (None where it does not take them)."""
        return self.fmt.template_tools(list(self.definitions))

    def messages(self, messages: list[dict]) -> list[dict]:
        """`messages` with the tool definitions in the system message where the template does not
        render them itself."""
        return self.fmt.offered(messages, list(self.definitions))

    # ---- the reply's grammar ----------------------------------------------------------------------------

    @property
    def calls_possible(self) -> bool:
        return bool(self.specs) and self.mode != "none"

    @property
    def output_schema(self) -> dict | None:
        """The output's JSON schema as the grammar writes it (None for text)."""
        return None if self.schema is None else output_grammar_schema(self.schema)

    def json_style(self, requested: str | None = None) -> str:
        """The reply's JSON style: the request's, else the one the model's template writes calls in,
        else the model's choice (grammar/schema/style.py)."""
        return requested or self.fmt.json_style or "model"

    def grammar(self, close_objects: bool = True, json_style: str | None = None) -> str | None:
        """The reply's Lark grammar: a reasoning block where the model may reason, then the answer
        (text, the output, calls of the offered tools, as the mode allows), its JSON in
        `json_style` (as `json_style()` resolves it); None where nothing constrains the reply."""
        style = self.json_style(json_style)
        fmt = self.fmt if self.fmt.json_style == style else replace(self.fmt, json_style=style)
        answer = fmt.answer_grammar(list(self.specs), self.mode if self.specs else "none", self.output_schema,
                                    self.parallel, close_objects=close_objects, markup_free=self.markup_free)
        return reply_grammar(answer, self.reasoning, self.state)

    def params(self, params):
        """`params` (SamplingParams) with this turn's grammar and JSON style."""
        if params.structured:
            raise RequestError("with tools or reasoning, the reply's grammar is agentkv's; give schema= for the "
                               "output, not json_schema/regex/grammar")
        style = self.json_style(params.json_style)
        grammar = self.grammar(params.close_objects, style)
        return params.with_(grammar=grammar, json_style=style) if grammar is not None else params

    # ---- the read-back ----------------------------------------------------------------------------------

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        """(the reasoning, the answer) of a reply (still being written, unless `final`)."""
        return self.reasoning.split(text, self.state, final) if self.state != "off" else (None, text)

    def read_text(self, text: str, cut: bool = False, check: bool = True) -> Reply:
        """`text` read back (`cut`: max_tokens ended it, so a call it was writing is dropped). With
        `check`, each call's arguments are checked against their tool's whole schema
        (OutputValidationError); an agent checks them itself, as a refusal the model corrects."""
        thought, answer = self.split(text)
        if self.mode == "none":
            return Reply(thought, answer, self.fmt.text(answer))
        content, calls, end = self.fmt.parse(answer, cut)
        specs = {s.name: s for s in self.specs}
        for call in calls if check else ():
            failure = schema_check(specs[call.name].parameters).failure(call.arguments)
            if failure is not None:
                raise OutputValidationError(f"the arguments of the call of {call.name!r} do not validate against "
                                            f"its schema: {failure.message}", text, "length" if cut else "stop",
                                            failure.keyword, failure.pointer)
        return Reply(thought, answer, content, calls, end, self.fmt.calls_start(answer))

    def read(self, out):
        """A RequestOutput with each completion's reasoning, calls (ids `call_{k}_{i}` unless written) and content
        read from its text, and its parser (the output's value) where it made no call."""
        completions = []
        parse = value_parser(self.schema) if self.schema is not None else None
        for k, c in enumerate(out.completions):
            reply = self.read_text(c.text, cut=c.finish_reason == "length")
            calls = [replace(call, id=call.id or f"call_{k}_{i}") for i, call in enumerate(reply.calls)]
            reason = "tool_calls" if calls and c.finish_reason != "length" else c.finish_reason
            completions.append(replace(c, tool_calls=calls, content=reply.content, finish_reason=reason,
                                       reasoning=reply.reasoning,
                                       parser=parse if parse is not None and not calls else c.parser))
        return replace(out, completions=completions)


def _spec(tool: Any, i: int) -> tuple[FunctionSpec, dict]:
    """(the format's view, the definition the prompt shows) of an `ak.tool` or an OpenAI definition."""
    if hasattr(tool, "definition") and hasattr(tool, "parameters"):
        return FunctionSpec(tool.name, tool.parameters), tool.definition
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"tools[{i}] must be an @ak.tool function or {{\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"parameters\": {...}}}")
    if problem := tool_name_problem(fn["name"]):
        raise RequestError(f"tools[{i}]: {problem}")
    return FunctionSpec(fn["name"], fn.get("parameters") or {"type": "object", "properties": {}}), tool
