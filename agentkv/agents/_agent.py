"""`ak.Agent`: a tool-calling loop whose every tool call is well-formed, over a pinned prompt.

    agent = ak.Agent("You are a travel assistant.", tools=[get_weather], output_type=Advice)
    result = await agent.run("What should I wear in Paris?")   # result.output is an Advice
    result = agent.run_sync("...")                              # from synchronous code

This file is the agent's configuration and its prompt: instructions (static ones pinned in the
engine's radix cache, functions of the run context rendered after them), tools, handoffs, output
types and validators. The loop itself is _run.py.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentkv.agents._context import RunContext
from agentkv.agents._engine import AgentEngine
from agentkv.agents._journal import Journal
from agentkv.agents._mcp import MCPToolset
from agentkv.agents._output import OutputSpec
from agentkv.agents._result import AgentEvent, AgentResult, RunEnd
from agentkv.agents._run import AgentRun
from agentkv.agents._tools import Tool, tool
from agentkv.chat.calls import tool_name_problem
from agentkv.chat.formats import ToolFormat
from agentkv.chat.reasoning import ReasoningFormat
from agentkv.chat.turn import MODES
from agentkv.defaults import LIBRARY_MAX_TOKENS, LIBRARY_TEMPERATURE
from agentkv.engine.sampling_params import SamplingParams
from agentkv.errors import AgentError, EngineClosedError, RequestError
from agentkv.syncio import Awaitable, EventStream, iterate_sync, run_sync
from agentkv.typed import default_engine


@dataclass
class Setup:
    """What an agent's prompt is on one engine (the format and template are the model's)."""

    format: ToolFormat
    reasoning: ReasoningFormat | None
    system: dict  # the static system message (tool definitions in it where the template does not render them)
    definitions: list[dict]
    instructions_apart: bool  # the template renders a second system message after the pinned one
    pin: Any = None


class Agent:
    """A model with instructions and tools, run step by step until it gives its output.

    instructions: a string, a function of the run context (`ctx -> str`, sync or async; or
    `@agent.instructions`), or a list of both. Strings are the system prompt, pinned in the cache;
    functions are evaluated per run and rendered after it, so they cost only their own tokens.
    tool_choice: "auto" (the model decides), "required" (the first step must call a tool), "none"
    (no tools), or a tool's name (the first step calls that tool); after a step that had to call, the
    choice returns to "auto". The last of `max_steps` steps is generated without tools, so a run
    always ends with an output (`result.forced_final` says when it was forced).
    output_type: None (text), a type Pydantic validates (a model, `list[int]`, `A | B`), an output
    function, or a list of those (their union); `@agent.output_validator` functions may raise
    `ak.ModelRetry`. `retries` bounds, per tool, the calls its arguments were refused or it raised
    ModelRetry (a tool's own `retries=` overrides it); `output_retries` (default: `retries`) the
    outputs that failed validation.
    handoffs: agents this one may hand the conversation to (a `transfer_to_<name>` call).
    prepare_tools: `(ctx, tools) -> tools`, per step: the tools offered (every definition stays in
    the pinned prompt; the rest are masked out of the step's grammar).
    A call the run already made (same tool, same arguments) is not run again unless `rerun_calls`:
    that step is left out of the conversation and the next one is generated without those tools
    (and without handoffs).
    Sampling options (temperature, max_tokens per step, seed, ...) are `SamplingParams`' own;
    temperature and max_tokens default as the whole library does (agentkv/defaults.py). `adapter="name"`
    runs every step on that LoRA adapter of the engine (its system prompt pinned in the adapter's cache).
    """

    def __init__(self, instructions: str | Callable | Sequence[str | Callable] = "", tools: Sequence[Any] = (), *,
                 name: str = "agent", description: str = "", output_type: Any = None, deps_type: Any = None,
                 handoffs: Sequence[Agent] = (), prepare_tools: Callable | None = None, tool_choice: str = "auto",
                 max_steps: int = 8, retries: int = 1, output_retries: int | None = None,
                 parallel_tool_calls: bool = True, rerun_calls: bool = False, engine: AgentEngine | None = None,
                 pin: bool = True, chat_template_kwargs: dict | None = None, temperature: float = LIBRARY_TEMPERATURE,
                 max_tokens: int = LIBRARY_MAX_TOKENS, journal: Journal | None = None, **sampling: Any):
        parts = list(instructions) if isinstance(instructions, (list, tuple)) else [instructions]
        if not all(isinstance(p, str) or callable(p) for p in parts):
            raise RequestError("instructions must be a string, a function of the run context, or a list of those")
        self.static_instructions = "\n\n".join(p for p in parts if isinstance(p, str) and p)
        self._instruction_functions: list[Callable] = [p for p in parts if not isinstance(p, str)]
        if problem := tool_name_problem(name):
            raise RequestError(f"Agent name {name!r}: {problem}")
        self.name, self.description, self.deps_type = name, description, deps_type
        self._setups: dict[int, tuple[Any, Setup]] = {}  # by id(engine): the prompt there
        self.tools: dict[str, Tool] = {}
        self._toolsets = [t for t in tools if isinstance(t, MCPToolset)]  # closed with the agent
        for t in [x for t in tools for x in (t.connect() if isinstance(t, MCPToolset) else [t])]:
            self._add_tool(tool(t))
        self.handoffs: dict[str, Agent] = {}  # by the name of the tool that transfers to the agent
        for target in handoffs:
            self._add_handoff(target)
        if tool_choice not in MODES and tool_choice not in self.tools:
            raise RequestError(f"tool_choice={tool_choice!r} is neither one of {list(MODES)} nor a tool's name "
                               f"({sorted(self.tools) or 'no tools given'})")
        if tool_choice != "none" and tool_choice != "auto" and not self.tools:
            raise RequestError(f"tool_choice={tool_choice!r} needs tools; pass tools=[...]")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise RequestError(f"max_steps={max_steps!r} must be an integer >= 1")
        if tool_choice not in ("auto", "none") and max_steps < 2:
            raise RequestError(f"tool_choice={tool_choice!r} needs max_steps >= 2: one step to call, one to answer")
        for label, n in (("retries", retries), ("output_retries", output_retries)):
            if n is not None and (not isinstance(n, int) or n < 0):
                raise RequestError(f"{label}={n!r} must be an integer >= 0")
        self.output_spec = OutputSpec(output_type)  # a GrammarError now for something that has no schema
        self.output_type = output_type
        self._validators: list[Callable] = []
        self.prepare_tools = prepare_tools
        self.tool_choice, self.max_steps, self.retries = tool_choice, max_steps, retries
        self.output_retries = retries if output_retries is None else output_retries
        self.parallel_tool_calls, self.rerun_calls = parallel_tool_calls, rerun_calls
        self.params = SamplingParams().with_(
            temperature=temperature, max_tokens=max_tokens, **sampling)  # names unknown ones
        if self.params.structured or self.params.n != 1:
            raise RequestError("an Agent sets the grammar of each step itself; give output_type=, not "
                               "json_schema/regex/grammar, and n=1")
        self._engine, self._want_pin = engine, pin
        self.journal = journal  # where runs given a run_id are recorded (agents/_journal.py)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._setup_lock = threading.Lock()
        # what the agent holds (its pins, its MCP sessions), released when it is garbage-collected
        # without close(): agents made per request must not use up the pin budget
        self._held: dict[str, Any] = {"pins": []}
        self._finalizer = weakref.finalize(self, _release, self._held, self._toolsets)
        self._closed = False
        _live_agents.add(self)

    # ---- adding to the agent ----------------------------------------------------------------------------

    def tool(self, func: Callable | None = None, **options: Any):
        """`@agent.tool` (or `@agent.tool(retries=..., requires_approval=...)`): add a tool, with or
        without a RunContext first parameter."""
        if func is None:
            return lambda f: self.tool(f, **options)
        self._add_tool(tool(func, **options))
        return func

    def instructions(self, func: Callable) -> Callable:
        """`@agent.instructions`: a function of the run context (or of nothing) whose text is added to
        the instructions on each run, after the pinned prompt."""
        self._instruction_functions.append(func)
        return func

    def output_validator(self, func: Callable) -> Callable:
        """`@agent.output_validator`: `(ctx, output) -> output` or `(output) -> output`, sync or async;
        raise `ak.ModelRetry("what is wrong")` to have the model try again."""
        self._validators.append(func)
        return func

    def _add_tool(self, t: Tool) -> None:
        if self._setups:
            raise AgentError("tools are part of the pinned prompt: add them before the agent's first run")
        if t.name in self.tools:
            raise RequestError(f"two tools are named {t.name!r}; give one a different name with @ak.tool(name=...)")
        self.tools[t.name] = t

    def _add_handoff(self, target: Agent) -> None:
        if not isinstance(target, Agent):
            raise RequestError(f"handoffs are Agents, not {type(target).__name__}")
        name = f"transfer_to_{target.name}"

        def transfer() -> str:
            return f"Transferred to {target.name}."

        about = f": {target.description}" if target.description else ""
        self._add_tool(tool(transfer, name=name, description=f"Hand the conversation to {target.name}{about}"))
        self.handoffs[name] = target

    def as_tool(self, name: str | None = None, description: str | None = None, input_type: Any = str) -> Tool:
        """This agent as another's tool: the caller writes its input (`input_type`: a string by
        default, or e.g. a constrained string or a Pydantic model, given to this agent as JSON), gets
        its output, and this run's usage is added to the caller's."""
        from pydantic import TypeAdapter

        adapter = TypeAdapter(input_type)

        async def run_agent(ctx, input):
            text = input if isinstance(input, str) else adapter.dump_json(input).decode()
            result = await self.run(text, deps=ctx.deps, engine=self._engine or ctx.engine)  # its own, or the caller's
            ctx.usage.add(result.usage)
            return result.output

        run_agent.__annotations__ = {"ctx": RunContext, "input": input_type, "return": Any}  # evaluated: a local type
        run_agent.__doc__ = f"{description or self.description or 'Ask ' + self.name}\n\nArgs:\n    input: The request."
        return tool(run_agent, name=name or self.name)

    # ---- running ----------------------------------------------------------------------------------

    def run(self, input: str | Sequence[dict] | None = None, *, history: Sequence[dict] | None = None, deps: Any = None,
            approvals: dict[str, bool | str] | None = None, engine: AgentEngine | None = None,
            run_id: str | None = None, journal: Journal | None = None) -> Awaitable:
        """`await agent.run(...)`: run to the output. `input` is the user's message (or messages);
        `history` a previous result's `messages` to continue that conversation (its system messages
        are replaced by this agent's); `deps` what tools and instruction functions get as
        `ctx.deps`; `approvals` answers a run that ended waiting for approval ({call id: True, or
        False / a reason to refuse}). With `run_id` the run is durable: each step is recorded in
        `journal` (ak.Journal(folder); default: the agent's) before the run moves on, and
        `agent.resume(run_id)` finishes it after its process ended. Called without await (the form
        before 0.2), it runs synchronously with a DeprecationWarning; use `run_sync`."""
        return Awaitable(lambda: self._run(input, history=history, deps=deps, approvals=approvals, engine=engine,
                                           run_id=run_id, journal=journal), "Agent.run_sync")

    def resume(self, run_id: str, *, journal: Journal | None = None, approvals: dict[str, bool | str] | None = None,
               deps: Any = None, engine: AgentEngine | None = None) -> Awaitable:
        """`await agent.resume(run_id)`: finish a durable run (`run(..., run_id=...)`) whose process ended,
        or that ended waiting for approval: the model replies and tool results its journal holds are read
        back, not made again (tools never run twice), and the run goes on from there, its conversation's
        KV read back from the engine's disk tier. A call that was running when the process ended runs
        again only if its tool is `idempotent`; otherwise the run ends asking (ApprovalRequired), and
        `approvals={call id: True}` runs it, False or a reason tells the model it was not."""
        return Awaitable(lambda: self._run(None, deps=deps, approvals=approvals, engine=engine, run_id=run_id,
                                           journal=journal, resume=True), "Agent.resume")

    def resume_sync(self, run_id: str, **kw: Any) -> AgentResult:
        """`resume` from synchronous code."""
        return run_sync(self._run(None, run_id=run_id, resume=True, **kw))

    def run_sync(self, input: str | Sequence[dict] | None = None, **kw: Any) -> AgentResult:
        """`run` from synchronous code (also where an event loop is running: on a thread of its own)."""
        return run_sync(self._run(input, **kw))

    async def arun(self, input: str | Sequence[dict] | None = None, **kw: Any) -> AgentResult:
        """Deprecated: `await agent.run(...)`."""
        warnings.warn("Agent.arun is deprecated: use `await agent.run(...)`", DeprecationWarning, stacklevel=2)
        return await self.run(input, **kw)

    async def _run(self, input, **options) -> AgentResult:
        async for event in self._events(input, where="Agent.run", **options):
            if isinstance(event, RunEnd):
                return event.result
        raise AgentError("the run ended without a result")  # unreachable: a run ends with RunEnd or raises

    def stream(self, input: str | Sequence[dict] | None = None, *, history: Sequence[dict] | None = None,
               deps: Any = None, approvals: dict | None = None, engine: AgentEngine | None = None,
               run_id: str | None = None, journal: Journal | None = None, resume: bool = False) -> EventStream:
        """`async for event in agent.stream(...)`: the run's events as they happen (StepStart,
        TextDelta, ToolCallEvent, ToolResultEvent, StepEnd, and RunEnd with the result); `run_id`,
        `journal` as `run`'s, `resume=True` as `resume` (input None). Iterated with a plain `for` (the
        form before 0.2) it runs synchronously with a DeprecationWarning; use `stream_sync`."""
        return EventStream(lambda: self._events(input, history=history, deps=deps, approvals=approvals, engine=engine,
                                                run_id=run_id, journal=journal, resume=resume))

    def stream_sync(self, input: str | Sequence[dict] | None = None, **kw: Any) -> Iterator[AgentEvent]:
        yield from iterate_sync(self._events(input, **kw))

    def astream(self, input: str | Sequence[dict] | None = None, **kw: Any) -> AsyncIterator[AgentEvent]:
        """Deprecated: `agent.stream(...)`."""
        warnings.warn("Agent.astream is deprecated: use `async for event in agent.stream(...)`", DeprecationWarning,
                      stacklevel=2)
        return self._events(input, **kw)

    def _events(self, input, *, history=None, deps=None, approvals=None, engine: AgentEngine | None = None,
                run_id: str | None = None, journal: Journal | None = None, resume: bool = False, steps_via=None,
                where: str = "Agent.stream", **unknown) -> AsyncIterator[AgentEvent]:
        _refuse(unknown, where)
        if self._closed:
            raise AgentError("this agent is closed; make a new Agent")
        if steps_via is not None:  # a DBOS workflow's run (agents/_dbos.py): DBOS keeps it
            return AgentRun(self, input, history, deps, approvals, engine, steps_via=steps_via).events()
        journal = journal or self.journal
        if run_id is None:
            if journal is not None and journal is not self.journal:
                raise RequestError("journal= records a durable run: give it a run_id= too")
            return AgentRun(self, input, history, deps, approvals, engine).events()
        if journal is None:
            raise RequestError("run_id= makes the run durable: give journal=ak.Journal(folder) (here or to the Agent)")
        if resume:
            record, input, history = journal.claim(run_id, self)
        else:
            record = journal.start(run_id, self, input, history)
        return AgentRun(self, input, history, deps, approvals, engine, record).events()

    async def run_batch(self, inputs: Sequence[str | Sequence[dict]], *, deps: Any = None,
                        max_concurrency: int | None = None) -> list[AgentResult]:
        """Run many inputs concurrently (at most `max_concurrency` at once); the engine batches their
        steps, all sharing the pinned prompt. Results are in the order of `inputs`."""
        if max_concurrency is not None and (not isinstance(max_concurrency, int) or max_concurrency < 1):
            raise RequestError(f"max_concurrency={max_concurrency!r} must be an integer >= 1 or None")
        gate = asyncio.Semaphore(max_concurrency or max(1, len(inputs)))

        async def one(i):
            async with gate:
                return await self.run(i, deps=deps)

        return list(await asyncio.gather(*(one(i) for i in inputs)))

    def run_batch_sync(self, inputs: Sequence[str | Sequence[dict]], **kw: Any) -> list[AgentResult]:
        return run_sync(self.run_batch(inputs, **kw))

    # ---- prompt and pin -------------------------------------------------------------------------------

    @property
    def engine(self) -> AgentEngine:
        return self._engine or default_engine()

    @contextlib.contextmanager
    def override(self, *, engine: AgentEngine | None = None):
        """`with agent.override(engine=test_engine):` runs the agent on another engine (in tests)."""
        saved, self._engine = self._engine, engine if engine is not None else self._engine
        try:
            yield self
        finally:
            self._engine = saved

    @property
    def system_message(self) -> dict:
        """The system message the agent's conversations start with (tool definitions included when
        the model's chat template does not render them itself)."""
        return self.setup(self.engine).system

    def setup(self, engine: AgentEngine) -> Setup:
        """The agent's prompt on `engine`, made (and its system prompt pinned) on first use there."""
        with self._setup_lock:
            got = self._setups.get(id(engine))
            if got is None:
                fmt = engine.tool_format
                defs = [t.definition for t in self.tools.values()]
                system = fmt.system_message(self._instructions_with_output(), defs)
                s = Setup(fmt, engine.reasoning, system, defs, self._second_system_renders(engine, system))
                if self._want_pin and engine.config.cache.enable_radix_cache:
                    # (in its LoRA adapter's cache, where it runs on one: that KV is the adapter's own)
                    lora = {"adapter": self.params.adapter} if self.params.adapter else {}
                    s.pin = engine.pin(engine.conversation_prefix([system], tools=fmt.template_tools(defs),
                                                                  **self.chat_template_kwargs), **lora)
                    self._held["pins"].append((engine, s.pin))
                self._setups[id(engine)] = got = (engine, s)
            return got[1]

    def _instructions_with_output(self) -> str:
        if self.output_spec.text:
            return self.static_instructions
        return (self.static_instructions + "\n\n" + self.output_spec.describe()).lstrip()

    def _second_system_renders(self, engine: AgentEngine, system: dict) -> bool:
        """Whether the template renders a system message after the first (Qwen, Llama 3 do; Mistral's
        refuses one): where it does not, per-run instructions join the first (and miss the pin)."""
        if not self._instruction_functions:
            return False
        mark = "\x1fagentkv-instructions\x1f"
        try:
            text = engine.render([system, {"role": "system", "content": mark}, {"role": "user", "content": "?"}],
                                 **self.chat_template_kwargs)
        except Exception:  # noqa: BLE001 - a template that raises on it (jinja's raise_exception)
            return False
        return mark in text

    async def instructions_text(self, ctx) -> str:
        """The per-run instructions: each instruction function's text, in order."""
        texts = []
        for f in self._instruction_functions:
            takes = bool(inspect.signature(f).parameters)
            value = f(ctx) if takes else f()
            texts.append(await value if inspect.isawaitable(value) else value)
        return "\n\n".join(str(t) for t in texts if t)

    @property
    def pinned_tokens(self) -> int:
        """How many tokens of the system prompt are pinned in the default engine's cache (0 before the
        first run, after close, or with pin=False)."""
        got = self._setups.get(id(self._engine)) if self._engine is not None else None
        got = got or next(iter(self._setups.values()), None)
        return got[1].pin.num_tokens if got is not None and got[1].pin is not None and not self._closed else 0

    # ---- lifetime -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the pinned prompts (the engine may then evict them) and end MCP sessions."""
        self._finalizer.detach()
        with self._setup_lock:
            self._closed = True
            pins, self._held["pins"] = self._held["pins"], []
        for engine, pin in pins:
            try:
                engine.unpin(pin)
            except EngineClosedError:  # the engine went first (interpreter exit): nothing to release
                pass
        for toolset in self._toolsets:
            toolset.close()
        _live_agents.discard(self)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={list(self.tools)}, output_type={self.output_type!r})"


def _refuse(unknown: dict, where: str) -> None:
    if unknown:
        raise RequestError(
            f"{where} got unknown options {sorted(unknown)}: it takes input, history, deps, approvals and engine")


def _release(held: dict, toolsets: list) -> None:
    """An agent collected without close(): its pins and sessions go (each unpin posted, not awaited:
    a collection may run on the engine thread)."""
    for engine, pin in held.get("pins", []):
        try:
            engine.unpin(pin, wait=False)
        except EngineClosedError:
            pass
    for toolset in toolsets:
        toolset.close()


_live_agents: weakref.WeakSet[Agent] = weakref.WeakSet()


@atexit.register
def _close_agents() -> None:
    for a in list(_live_agents):
        a.close()
