"""Tools: typed Python functions a model can call.

    @ak.tool
    def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
        '''Current weather for a city.

        Args:
            city: The city's name, e.g. "Paris".
            unit: Celsius or Fahrenheit.
        '''

`get_weather` stays callable as before; `get_weather.parameters` is the JSON schema of its arguments
(from the signature, through Pydantic: Literal, Enum, Optional, defaults, nested models, lists),
`get_weather.definition` the OpenAI-style function definition that chat templates render, and
`get_weather.validate(arguments)` checks a model's arguments before `call` / `acall` runs the function.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from agentkv.agents._context import is_run_context
from agentkv.chat.calls import tool_name_problem
from agentkv.errors import ToolArgumentsError, ToolDefinitionError
from agentkv.grammar.schema.pydantic import constrained_generator
from agentkv.syncio import run_sync


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    func: Callable[..., Any]
    args_model: Any = field(repr=False)  # a Pydantic model of the arguments
    parameters: dict = field(repr=False)  # its JSON schema, titles stripped
    takes_context: bool = False  # its first parameter is a RunContext, passed by the agent, not the model
    retries: int | None = None  # how often its arguments may be refused (or ModelRetry raised); None: the agent's
    requires_approval: bool = False  # a call ends the run until it is approved (Agent.run(approvals=...))
    # a call may run twice to the same effect: a durable run killed while it ran runs it again on resume
    # (otherwise the resumed run asks for a decision: agents/_journal.py)
    idempotent: bool = False

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @property
    def definition(self) -> dict:
        """The OpenAI-style definition: {"type": "function", "function": {name, description, parameters}}."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def validate(self, arguments: dict | str) -> dict[str, Any]:
        """The function's keyword arguments from a model's arguments (a dict or JSON text), validated
        and converted (nested models built, enums made); ToolArgumentsError says what is wrong."""
        from pydantic import ValidationError

        arguments = self.arguments_dict(arguments)
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or '(arguments)'}: {err['msg']}" for err in e.errors())
            raise ToolArgumentsError(self.name, problems) from None
        return {name: getattr(parsed, name) for name in self.args_model.model_fields}

    def arguments_dict(self, arguments: dict | str) -> dict:
        """A model's arguments (a dict or JSON text) as a dict; ToolArgumentsError where they are not one."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                raise ToolArgumentsError(self.name, f"the arguments are not JSON: {e}") from None
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(self.name, f"the arguments must be a JSON object, not {type(arguments).__name__}")
        return arguments

    def call(self, arguments: dict | str, ctx: Any = None) -> Any:
        """Validate the arguments and run the tool (an async tool runs to completion here, also
        where an event loop is running). `ctx`: the RunContext of a tool that takes one."""
        result = self.func(*self._context(ctx), **self.validate(arguments))
        return run_sync(result) if inspect.isawaitable(result) else result

    async def acall(self, arguments: dict | str, ctx: Any = None) -> Any:
        """Validate the arguments and run the tool; a sync tool runs in a worker thread."""
        args, kwargs = self._context(ctx), self.validate(arguments)
        if self.is_async:
            return await self.func(*args, **kwargs)
        result = await asyncio.to_thread(self.func, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    def _context(self, ctx: Any) -> tuple:
        if not self.takes_context:
            return ()
        if ctx is None:
            raise ToolDefinitionError(f"tool {self.name} takes a RunContext; run it through an Agent, or pass ctx=")
        return (ctx,)


def tool(func: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         retries: int | None = None, requires_approval: bool = False, idempotent: bool = False):
    """Make a Tool of a typed function; use as `@ak.tool` or `@ak.tool(name=..., description=...,
    retries=..., requires_approval=..., idempotent=...)`. A first parameter annotated `ak.RunContext`
    receives the agent's run context and is not shown to the model."""
    if func is None:
        return lambda f: tool(f, name=name, description=description, retries=retries,
                              requires_approval=requires_approval, idempotent=idempotent)
    if isinstance(func, Tool):
        return func
    if not callable(func) or not hasattr(func, "__name__"):
        raise ToolDefinitionError(f"@ak.tool needs a function, not {type(func).__name__}")
    if retries is not None and (not isinstance(retries, int) or retries < 0):
        raise ToolDefinitionError(f"tool {func.__name__}: retries={retries!r} must be an integer >= 0")
    summary, param_docs = parse_docstring(inspect.getdoc(func) or "")
    model, takes_context = args_model(func, param_docs)
    if problem := tool_name_problem(name or func.__name__):
        raise ToolDefinitionError(f"{problem}; give one with @ak.tool(name=...)")
    return Tool(name or func.__name__, description if description is not None else summary, func, model,
                _json_schema(model), takes_context, retries, requires_approval, idempotent)


# ---- signature -> Pydantic model -> JSON schema ----------------------------------------------------------


def args_model(func: Callable[..., Any], param_docs: dict[str, str] | None = None):
    """(a Pydantic model of the function's parameters, whether its first one is a RunContext)."""
    from pydantic import ConfigDict, Field, create_model

    param_docs = param_docs or {}
    try:
        hints = get_type_hints(func, include_extras=True)
    except Exception as e:  # an annotation that does not resolve (a forward reference to a missing name)
        raise ToolDefinitionError(f"the annotations of {func.__name__} do not resolve: {e}") from None
    fields: dict[str, Any] = {}
    params = list(inspect.signature(func).parameters.values())
    takes_context = bool(params) and is_run_context(hints.get(params[0].name, params[0].annotation))
    for p in params[takes_context:]:
        if is_run_context(hints.get(p.name, p.annotation)):
            raise ToolDefinitionError(f"{func.__name__}: a RunContext parameter must come first ({p.name} does not)")
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {func.__name__}: *{p.name} / **{p.name} cannot be described to a model; name every parameter")
        if p.kind is p.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"tool {func.__name__}: parameter {p.name} is positional-only; tools are called by name")
        if p.name not in hints:
            raise ToolDefinitionError(
                f"tool {func.__name__}: parameter {p.name} has no type annotation; annotate it "
                f"(e.g. `{p.name}: str`) so the model knows what to pass"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], Field(default, description=param_docs.get(p.name)))
    try:
        model = create_model(f"{func.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    except Exception as e:  # a type Pydantic cannot describe
        raise ToolDefinitionError(f"tool {func.__name__}: {e}") from None
    return model, takes_context


def _json_schema(model) -> dict:
    class NoFieldTitles(constrained_generator()):  # (with the constraints validation checks: Decimal places, ...)
        # titles repeat the field names: tokens in every prompt, no information
        def field_title_should_be_set(self, schema) -> bool:
            return False

    try:
        schema = model.model_json_schema(schema_generator=NoFieldTitles)
    except Exception as e:  # e.g. a callable or arbitrary class as a parameter type
        raise ToolDefinitionError(
            f"the parameters of {model.__name__.removesuffix('_arguments')} have no JSON schema: {e}") from None
    schema.pop("title", None)
    return schema


# ---- docstrings: Google ("Args:"), reST (":param x:") and NumPy ("Parameters\n----------") ------------------

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:?\s*$")
_PARAM_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args"}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a docstring in Google, reST or NumPy style."""
    lines = doc.expandtabs().strip().splitlines()
    summary: list[str] = []
    i = 0
    while i < len(lines) and not _SECTION.match(lines[i]) and not lines[i].lstrip().startswith(":"):
        summary.append(lines[i].strip())
        i += 1
    params: dict[str, str] = {}
    section = current = item_indent = None
    numpy = False
    while i < len(lines):
        line = lines[i]
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        i += 1
        if not stripped:
            continue
        if head := _SECTION.match(line):
            section, current, item_indent = head.group(1).lower(), None, None
            numpy = i < len(lines) and set(lines[i].strip()) == {"-"}  # NumPy underlines its headers
            i += numpy
            continue
        if m := re.match(r":param\s+(?:[^:]*\s)?(\w+)\s*:(.*)", stripped):
            section, current = "rest", m.group(1)
            params[current] = m.group(2)
            continue
        if stripped.startswith(":"):  # :returns:, :raises:, :type x: ...
            section, current = "rest", None
            continue
        if section == "rest":
            if current is not None:
                params[current] += " " + stripped
            continue
        if section not in _PARAM_SECTIONS:
            continue
        if item_indent is None:
            item_indent = indent
        if indent <= item_indent:  # a new parameter: `name : type` (NumPy) or `name (type): text` (Google)
            m = re.match(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:(.*)", stripped)
            current = m.group(1).lstrip("*") if m else None
            if current is not None:
                params[current] = "" if numpy else m.group(2)
        elif current is not None:
            params[current] += " " + stripped
    text = " ".join(" ".join(summary).split())
    return text, {k: " ".join(v.split()) for k, v in params.items() if v.strip()}
