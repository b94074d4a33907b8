"""What an agent run ends with: its output types (and output functions) as the one JSON schema the
step's grammar writes, and how that text becomes the value.

    output_type=Invoice                  # a Pydantic model
    output_type=list[int] | int          # any type Pydantic validates: primitives, lists, unions
    output_type=[Refund, Escalation]     # one of several (a list reads as their union)
    output_type=[Refund, file_ticket]    # an output function: the model writes its arguments,
                                         # the run's output is what it returns (it may raise ModelRetry)

A union is written under `anyOf` of the members' schemas and read by Pydantic's validation of the
union (smart mode: the member the value fits best). Plain text is `output_type=None` (or `str`) and
cannot be mixed with structured members: a step's grammar writes text or JSON, not both.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any, Union

from agentkv.agents._tools import args_model
from agentkv.errors import RequestError
from agentkv.grammar.compiler import output_grammar_schema
from agentkv.grammar.schema.parse import value_parser


class OutputSpec:
    """The output side of an Agent: `text` (free text), or `schema` and `parse` / `finish`."""

    def __init__(self, output_type: Any):
        members = list(output_type) if isinstance(output_type, (list, tuple)) else [output_type]
        self.text = members in ([None], [str])
        self.schema: dict | None = None
        self._functions: dict[type, tuple[Callable, bool]] = {}  # an output function's arguments model -> it
        if self.text:
            return
        if not members or any(m is None or m is str for m in members):
            raise RequestError(f"output_type={output_type!r}: text (None or str) cannot be one of several outputs; "
                               "give structured types only, or output_type=None for text")
        types = []
        for m in members:
            if inspect.isroutine(m):
                model, takes_context = args_model(m)
                self._functions[model] = (m, takes_context)
                m = model
            types.append(m)
        self.type = types[0] if len(types) == 1 else Union[tuple(types)]  # noqa: UP007 - built at run time
        self.schema = output_grammar_schema(self.type)  # a GrammarError now for what has no schema
        self._parse = None

    def parse(self, text: str) -> Any:
        """The value of the JSON text the model wrote; OutputValidationError (with a message for the
        model) where Pydantic refuses it, IncompleteOutputError where it is not whole JSON."""
        if self._parse is None:
            self._parse = value_parser(self.type)
        return self._parse(text)

    async def finish(self, value: Any, ctx: Any) -> Any:
        """The run's output for a parsed value: what an output function returns for its arguments
        (ModelRetry from it propagates), the value itself otherwise."""
        if type(value) not in self._functions:
            return value
        func, takes_context = self._functions[type(value)]
        args = (ctx,) if takes_context else ()
        kwargs = {name: getattr(value, name) for name in type(value).model_fields}
        if inspect.iscoroutinefunction(func):
            return await func(*args, **kwargs)
        result = await asyncio.to_thread(func, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    def describe(self) -> str:
        """What the instructions say of the final answer (the grammar enforces it; the model writes
        better values when it knows the fields)."""
        what = "a JSON object" if isinstance(self.schema, dict) and self.schema.get("type") == "object" else "JSON"
        return f"Give your final answer as {what} matching this schema:\n" + json.dumps(self.schema, ensure_ascii=False)
