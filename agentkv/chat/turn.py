"""`engine.chat(messages, tools=[...])`: one reply under the model's tool-call format, read back as calls.

The engine's tool format, which the agent loop and the server use too (formats/): the tool
definitions offered as the chat template expects (or in the system prompt where it does not know
tools), the reply (after any reasoning block: reasoning.py) generated under the grammar of the
offered tools' schemas, and read back as the calls it completed and the text before them. A call cut
by max_tokens is left out (`finish_reason` "length"); the text never holds the format's markup.
Arguments are checked against their tool's whole schema, which matters only where the grammar
relaxed a keyword (an `OutputValidationError` with the text).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agentkv.chat.calls import FunctionSpec, tool_name_problem
from agentkv.chat.formats import ToolFormat
from agentkv.chat.reasoning import ReasoningFormat, State, reply_grammar
from agentkv.errors import OutputValidationError, RequestError
from agentkv.grammar.compiler import output_grammar_schema
from agentkv.grammar.schema.parse import value_parser
from agentkv.grammar.schema.validation import schema_check

MODES = ("auto", "required", "none")


@dataclass(frozen=True)
class ToolChat:
    fmt: ToolFormat
    specs: tuple[FunctionSpec, ...]  # the tools the grammar offers (one, for a named tool_choice)
    definitions: tuple[dict, ...]  # every tool's definition, as the prompt shows them
    mode: str
    schema: Any  # the output's schema under tool_choice "auto" / "none", or None for text
    reasoning: ReasoningFormat | None = None  # the model's reasoning markers
    state: State = "off"  # where the reply starts: inside a block, free to open one, or not reasoning

    @classmethod
    def plan(
        cls, fmt: ToolFormat, tools, tool_choice: str, schema: Any, reasoning: ReasoningFormat | None = None
    ) -> ToolChat:
        specs, defs = [], []
        for i, t in enumerate(tools):
            spec, definition = _spec(t, i)
            specs.append(spec)
            defs.append(definition)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise RequestError(f"tools have repeated names ({names}); give each tool its own name")
        mode = tool_choice
        if tool_choice not in MODES:
            if tool_choice not in names:
                raise RequestError(
                    f"tool_choice={tool_choice!r} is neither one of {list(MODES)} nor a tool's name ({names})"
                )
            specs, mode = [s for s in specs if s.name == tool_choice], "required"
        return cls(fmt, tuple(specs), tuple(defs), mode, schema, reasoning)

    def after(self, prompt: str) -> ToolChat:
        """This plan for a reply to the rendered `prompt` (which says whether it may reason)."""
        return replace(self, state=self.reasoning.state(prompt)) if self.reasoning is not None else self

    @property
    def template_tools(self) -> list[dict] | None:
        return self.fmt.template_tools(list(self.definitions))

    def messages(self, messages: list[dict]) -> list[dict]:
        """`messages` with the tool definitions in the system message where the template does not
        render them itself."""
        return self.fmt.offered(messages, list(self.definitions))

    def params(self, params):
        if params.structured:
            raise RequestError(
                "with tools or reasoning, the reply's grammar is agentkv's; give schema= for the "
                "output, not json_schema/regex/grammar"
            )
        output = None if self.schema is None else output_grammar_schema(self.schema)
        answer = self.fmt.answer_grammar(list(self.specs), self.mode, output, close_objects=params.close_objects)
        grammar = reply_grammar(answer, self.reasoning, self.state)
        return params.with_(grammar=grammar) if grammar is not None else params

    def read(self, out):
        """The output with each completion's calls and content read from its text."""
        by_name = {s.name: s for s in self.specs}
        completions = []
        for k, c in enumerate(out.completions):
            cut = c.finish_reason == "length"
            thought, answer = self.reasoning.split(c.text, self.state) if self.state != "off" else (None, c.text)
            content, calls, _ = self.fmt.parse(answer, cut) if self.mode != "none" else (answer, [], 0)
            calls = [replace(call, id=f"call_{k}_{i}") for i, call in enumerate(calls)]
            for call in calls:
                problem = schema_check(by_name[call.name].parameters).error(call.arguments)
                if problem is not None:
                    raise OutputValidationError(
                        f"the arguments of the call of {call.name!r} do not validate against its schema: {problem}",
                        c.text,
                        c.finish_reason,
                    )
            reason = "tool_calls" if calls and c.finish_reason != "length" else c.finish_reason
            parser = self._output_parser() if not calls else None
            completions.append(
                replace(
                    c,
                    tool_calls=calls,
                    content=content,
                    finish_reason=reason,
                    reasoning=thought,
                    parser=parser if parser is not None else c.parser,
                )
            )
        return replace(out, completions=completions)

    def _output_parser(self):
        return value_parser(self.schema) if self.schema is not None else None


def _spec(tool: Any, i: int) -> tuple[FunctionSpec, dict]:
    """(the format's view, the definition the prompt shows) of an `ak.tool` or an OpenAI definition."""
    if hasattr(tool, "definition") and hasattr(tool, "parameters"):
        return FunctionSpec(tool.name, tool.parameters), tool.definition
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(
            f'tools[{i}] must be an @ak.tool function or {{"type": "function", "function": '
            '{"name": ..., "parameters": {...}}}'
        )
    if problem := tool_name_problem(fn["name"]):
        raise RequestError(f"tools[{i}]: {problem}")
    return FunctionSpec(fn["name"], fn.get("parameters") or {"type": "object", "properties": {}}), tool
