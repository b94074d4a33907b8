"""`ak.Agent`: a tool-calling loop whose every tool call is well-formed, over a pinned prompt.

    agent = ak.Agent("You are a travel assistant.", tools=[get_weather], output_type=Advice)
    result = agent.run("What should I wear in Paris?")   # result.output is an Advice

Each step is one generation under one grammar (tool_formats/): tool calls in the model's own
format, free text, or the output under `output_type`'s schema. Calls of a step run concurrently;
their results (or errors) go back to the model as tool messages and the loop continues. The agent's
rendered system prompt and tool definitions are pinned in the engine's radix cache on first use, so
every step of every run starts from cached KV, until `close()` (or the end of a `with` block, or
interpreter exit).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from agentkv.agent_result import (
    AgentEvent,
    AgentResult,
    AgentUsage,
    RunEnd,
    Step,
    StepEnd,
    StepStart,
    TextDelta,
    ToolCallEvent,
    ToolResult,
    ToolResultEvent,
)
from agentkv.errors import (
    AgentError,
    AgentRetriesError,
    EngineClosedError,
    OutputError,
    RequestError,
    ToolArgumentsError,
)
from agentkv.mcp_tools import MCPToolset
from agentkv.reasoning import ReasoningFormat, reply_grammar
from agentkv.syncio import iterate_sync, run_sync
from agentkv.tool_calls import ToolCall
from agentkv.tool_formats import ToolFormat
from agentkv.tools import Tool, tool

MODES = ("auto", "required", "none")


class Agent:
    """A model with instructions and tools, run step by step until it gives its output.

    tool_choice: "auto" (the model decides), "required" (the first step must call a tool), "none"
    (no tools), or a tool's name (the first step calls that tool). After a step that had to call a
    tool, the choice returns to "auto", so a required call never loops. The last of `max_steps`
    steps is generated without tools, so a run always ends with an output. `retries` bounds the
    corrections of output that fails validation and of tool arguments a tool refuses, per run.
    `parallel_tool_calls=False` allows one call per step. A call the run already made (same tool,
    same arguments) is not run again unless `rerun_calls=True`: the model is repeating itself (a small
    model copies its last turn), so that step is left out of the conversation and the next one is
    generated without the repeated tools (without any left, it is the answer).
    A reasoning model reasons before each step's answer, free of its grammar (`Step.reasoning`;
    `max_reasoning_tokens` bounds it), unless `chat_template_kwargs` turn reasoning off (Qwen3's
    `{"enable_thinking": False}`).
    Sampling options (temperature, max_tokens per step, seed, ...) are those of `SamplingParams`.
    """

    def __init__(self, instructions: str = "", tools: Sequence[Any] = (), *, output_type: Any = None,
                 tool_choice: str = "auto", max_steps: int = 8, retries: int = 1, parallel_tool_calls: bool = True,
                 rerun_calls: bool = False, engine=None, pin: bool = True, chat_template_kwargs: dict | None = None,
                 temperature: float = 0.0, max_tokens: int = 512, **sampling: Any):
        from agentkv.engine.sampling_params import SamplingParams

        if not isinstance(instructions, str):
            raise RequestError(f"instructions must be a string, not {type(instructions).__name__}")
        self.instructions = instructions
        self.tools: dict[str, Tool] = {}
        self._toolsets = [t for t in tools if isinstance(t, MCPToolset)]  # closed with the agent
        for t in [x for t in tools for x in (t.connect() if isinstance(t, MCPToolset) else [t])]:
            t = tool(t)
            if t.name in self.tools:
                raise RequestError(f"two tools are named {t.name!r}; give one a different name with @ak.tool(name=...)")
            self.tools[t.name] = t
        if tool_choice not in MODES and tool_choice not in self.tools:
            raise RequestError(f"tool_choice={tool_choice!r} is neither one of {list(MODES)} nor a tool's name "
                               f"({sorted(self.tools) or 'no tools given'})")
        if tool_choice != "none" and tool_choice != "auto" and not self.tools:
            raise RequestError(f"tool_choice={tool_choice!r} needs tools; pass tools=[...]")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise RequestError(f"max_steps={max_steps!r} must be an integer >= 1")
        if tool_choice not in ("auto", "none") and max_steps < 2:
            raise RequestError(f"tool_choice={tool_choice!r} needs max_steps >= 2: one step to call, one to answer")
        if not isinstance(retries, int) or retries < 0:
            raise RequestError(f"retries={retries!r} must be an integer >= 0")
        self.output_type = None if output_type is str else output_type
        if self.output_type is not None:
            from agentkv.grammar.compiler import output_grammar_schema

            output_grammar_schema(self.output_type)  # GrammarError now for something that is not a schema
        self.tool_choice, self.max_steps, self.retries = tool_choice, max_steps, retries
        self.parallel_tool_calls, self.rerun_calls = parallel_tool_calls, rerun_calls
        self.params = SamplingParams(temperature=temperature, max_tokens=max_tokens, **sampling)
        if self.params.structured or self.params.n != 1:
            raise RequestError("an Agent sets the grammar of each step itself; give output_type=, not "
                               "json_schema/regex/grammar, and n=1")
        self._engine, self._want_pin = engine, pin
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._setup_lock = threading.Lock()
        self._format: ToolFormat | None = None
        self._reasoning: ReasoningFormat | None = None
        self._system: dict | None = None
        self._pin = None
        # what the agent holds (its pin, its MCP sessions), released when it is garbage-collected
        # without close(): agents made per request must not use up the pin budget
        self._held: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _release, self._held, self._toolsets)
        self._closed = False
        _live_agents.add(self)

    # ---- running ----------------------------------------------------------------------------------

    def run(self, input: str | Sequence[dict], *, history: Sequence[dict] | None = None) -> AgentResult:
        """Run to the output. `input` is the user's message (or messages); `history` a previous
        result's `messages` to continue that conversation."""
        return run_sync(self.arun(input, history=history))

    async def arun(self, input: str | Sequence[dict], *, history: Sequence[dict] | None = None) -> AgentResult:
        async for event in self.astream(input, history=history):
            if isinstance(event, RunEnd):
                return event.result
        raise AgentError("the run ended without a result")  # unreachable: astream ends with RunEnd or raises

    def run_batch(self, inputs: Sequence[str | Sequence[dict]]) -> list[AgentResult]:
        """Run many inputs concurrently; the engine batches their steps, all sharing the pinned prompt."""
        async def all_runs():
            return await asyncio.gather(*(self.arun(i) for i in inputs))

        return run_sync(all_runs())

    def stream(self, input: str | Sequence[dict], *, history: Sequence[dict] | None = None) -> Iterator[AgentEvent]:
        """The run's events as they happen (StepStart, TextDelta, ToolCallEvent, ToolResultEvent,
        StepEnd, and RunEnd with the result), from synchronous code."""
        yield from iterate_sync(self.astream(input, history=history))

    async def astream(self, input: str | Sequence[dict], *, history: Sequence[dict] | None = None) -> AsyncIterator[AgentEvent]:
        """The async form of `stream`."""
        if self._closed:
            raise AgentError("this agent is closed; make a new Agent")
        engine = await asyncio.to_thread(self._setup)
        messages = self._conversation(input, history)
        usage, steps, errors = AgentUsage(), [], []
        mode = self.tool_choice
        made: dict[str, ToolResult] = {}  # the results of the run's calls, by call
        withheld: set[str] = set()  # tools the last step repeated a call of
        for index in range(1, self.max_steps + 1):
            # the last step answers; so does one after a step that repeated calls of every tool
            step_mode = mode if index < self.max_steps and not (withheld and set(self.tools) <= withheld) else "none"
            yield StepStart(index, step_mode)
            started = time.perf_counter()
            done: list = []
            prompt = self._prompt(engine, messages)
            state = self._reasoning.state(prompt) if self._reasoning is not None else "off"
            params = self._step_params(step_mode, withheld, state)
            async for delta in engine.stream(prompt, params):
                if delta.text:
                    yield TextDelta(index, delta.text)
                if delta.completion is not None:
                    done = [delta.completion, delta.usage]
            completion, step_usage = done
            usage.steps += 1
            usage.add_generation(step_usage)
            step, kept = self._read(index, step_mode, completion, state)
            step.usage = step_usage
            steps.append(step)
            withheld = set()
            if step.tool_calls:
                for call in step.tool_calls:
                    yield ToolCallEvent(index, call)
                fresh, seen = [], set(made)
                for c in step.tool_calls:
                    if self.rerun_calls or _call_key(c) not in seen:
                        fresh.append(c)
                        seen.add(_call_key(c))
                ran = dict(zip((c.id for c in fresh), await asyncio.gather(*(self._call(c) for c in fresh))))
                made.update((_call_key(r.call), r) for r in ran.values())
                step.tool_results = [ran[c.id] if c.id in ran else
                                     dataclasses.replace(made[_call_key(c)], call=c, repeated=True)
                                     for c in step.tool_calls]
                usage.tool_calls += len(fresh)
                for result in step.tool_results:
                    yield ToolResultEvent(index, result)
                withheld = {r.call.name for r in step.tool_results if r.repeated}
                if fresh:  # the conversation keeps the calls that ran, and their results
                    messages.append(self._format.assistant_message(step.content, fresh,
                                                                   kept if not withheld else None))
                    messages.extend(self._format.results_messages([(r.call, r.content) for r in step.tool_results
                                                                   if not r.repeated]))
                refused = [r for r in step.tool_results if r.refused and not r.repeated]
                if refused:
                    errors.extend(r.error for r in refused)
                    usage.retries += 1
                mode = "auto" if mode != "none" else mode  # a required or named call was made: the model decides now
                step.seconds = time.perf_counter() - started
                yield StepEnd(step, usage)
                if refused and usage.retries > self.retries:
                    raise AgentRetriesError(f"the model's tool arguments were refused {usage.retries} times "
                                            f"(retries={self.retries}): {refused[-1].error}", refused[-1].call, errors)
                continue
            messages.append({"role": "assistant", "content": kept})
            if step.error is None:
                try:
                    output = self._output(completion, step_mode, state, step.content)
                except OutputError as e:
                    step.error = str(e)
            step.seconds = time.perf_counter() - started
            yield StepEnd(step, usage)
            if step.error is None:
                yield RunEnd(AgentResult(output, steps, usage, messages))
                return
            errors.append(step.error)
            usage.retries += 1
            if usage.retries > self.retries or index == self.max_steps:
                raise AgentRetriesError(f"the model's output failed {usage.retries} times (retries={self.retries}, "
                                        f"max_steps={self.max_steps}): {step.error}", step.text, errors)
            messages.append({"role": "user", "content": f"Your reply was not valid: {step.error}\nReply again, correctly."})

    # ---- one step -----------------------------------------------------------------------------------

    def _read(self, index: int, mode: str, completion, state: str = "off") -> tuple[Step, str]:
        """The step a completion makes, and the text the conversation keeps of it (its reasoning
        included: the chat template keeps or drops it, as the model was trained).

        A reply cut by max_tokens keeps the calls it completed (the cut one is dropped); cut before
        any call, it is an error the model is asked to correct, unless it is free text, which is
        returned as it is (as `ak.generate` returns a cut free-text reply)."""
        text = completion.text
        thought, answer = self._reasoning.split(text, state) if state != "off" else (None, text)
        step = Step(index, mode, text, content=answer, reasoning=thought)
        if mode == "none":
            return step, text
        step.content, calls, end = self._format.parse(answer, cut=completion.finish_reason == "length")
        step.tool_calls = [dataclasses.replace(c, id=f"call_{index}_{k}") for k, c in enumerate(calls)]
        if completion.complete or self._format.calls_start(answer) < 0 and self.output_type is None and mode == "auto":
            return step, text
        if calls:
            return step, text[:len(text) - len(answer) + end]
        step.error = (f"the reply was cut at max_tokens ({self.params.max_tokens}) before it was complete; "
                      "write shorter arguments, or fewer calls")
        return step, text

    def _step_params(self, mode: str, withheld: set[str] = frozenset(), state: str = "off"):
        """The sampling parameters of a step: the agent's, with the grammar of the step's mode,
        offering the tools but those `withheld`, after a reasoning block where the model reasons."""
        if mode == "none" and self.output_type is not None and state == "off":
            return self.params.with_(json_schema=self.output_type)  # parsed and validated as ak.generate does
        if mode in self.tools:  # a named tool: calls of it only
            tools, mode = [self.tools[mode]], "required"
        elif mode == "none":
            tools = list(self.tools.values())  # the answer's text may not imitate their markup
        else:
            tools = [t for name, t in self.tools.items() if name not in withheld]
        answer = self._format.answer_grammar(tools, mode, self._output_schema(), self.parallel_tool_calls,
                                             close_objects=self.params.close_objects)
        grammar = reply_grammar(answer, self._reasoning, state)
        return self.params.with_(grammar=grammar) if grammar is not None else self.params

    def _output_schema(self) -> dict | None:
        if self.output_type is None:
            return None
        from agentkv.grammar.compiler import output_grammar_schema

        return output_grammar_schema(self.output_type)

    def _output(self, completion, mode: str, state: str = "off", answer: str | None = None) -> Any:
        if self.output_type is None:
            return (completion.text if answer is None else answer).strip()
        if mode == "none" and state == "off":
            return completion.parsed  # generated under json_schema=output_type
        from agentkv.engine.constrained import output_parser
        from agentkv.engine.outputs import Completion

        parser = output_parser(self.params.with_(json_schema=self.output_type))
        return Completion(completion.text, completion.token_ids, completion.finish_reason, None, parser,
                          completion.complete, content=answer).parsed

    async def _call(self, call: ToolCall) -> ToolResult:
        t = self.tools[call.name]  # the grammar only writes offered names
        try:
            value = await t.acall(call.arguments)
        except ToolArgumentsError as e:
            return ToolResult(call, f"error: {e}", None, str(e), refused=True)
        except Exception as e:  # the tool failed: the model is told, and may try otherwise
            return ToolResult(call, f"error: {type(e).__name__}: {e}", None, f"{type(e).__name__}: {e}")
        return ToolResult(call, _as_text(value), value)

    # ---- prompt and pin -------------------------------------------------------------------------------

    @property
    def engine(self):
        from agentkv.typed import default_engine

        return self._engine or default_engine()

    @property
    def system_message(self) -> dict:
        """The system message the agent's conversations start with (tool definitions included when
        the model's chat template does not render them itself)."""
        self._setup()
        return self._system

    def _setup(self):
        engine = self.engine
        with self._setup_lock:
            if self._format is None:
                self._format, self._reasoning = engine.tool_format, engine.reasoning
                defs = [t.definition for t in self.tools.values()]
                self._system = self._format.system_message(self._instructions_with_output(), defs)
                self._defs = defs
            if self._want_pin and self._pin is None and engine.config.cache.enable_radix_cache:
                self._pin, self._pinned_on = engine.pin(self._pinned_ids(engine)), engine
                self._held.update(pin=self._pin, engine=engine)
        return engine

    def _instructions_with_output(self) -> str:
        """The instructions, and with an output_type, what the final answer must look like: the
        grammar enforces it, but the model writes better values when it knows the fields."""
        if self.output_type is None:
            return self.instructions
        schema = json.dumps(self._output_schema(), ensure_ascii=False)
        return (self.instructions + "\n\nGive your final answer as a JSON object matching this schema:\n"
                + schema).lstrip()

    def _pinned_ids(self, engine) -> list[int]:
        """The tokens of the rendered system prompt that every conversation starts with."""
        return engine.conversation_prefix([self._system], tools=self._format.template_tools(self._defs),
                                          **self.chat_template_kwargs)

    def _prompt(self, engine, messages: list[dict]) -> str:
        return engine.render(messages, tools=self._format.template_tools(self._defs), **self.chat_template_kwargs)

    def _conversation(self, input, history) -> list[dict]:
        messages = [dict(m) for m in history] if history else []
        if not messages or messages[0].get("role") != "system":
            messages.insert(0, dict(self._system))
        if isinstance(input, str):
            messages.append({"role": "user", "content": input})
        elif isinstance(input, (list, tuple)) and all(isinstance(m, dict) for m in input):
            messages.extend(dict(m) for m in input)
        else:
            raise RequestError(f"an agent's input is a string or a list of message dicts, not {type(input).__name__}")
        return messages

    # ---- lifetime -------------------------------------------------------------------------------------

    @property
    def pinned_tokens(self) -> int:
        """How many tokens of the system prompt are pinned in the engine's cache (0 before the first
        run, after close, or with pin=False)."""
        return self._pin.num_tokens if self._pin is not None else 0

    def close(self) -> None:
        """Release the pinned prompt (the engine may then evict it) and end MCP sessions."""
        self._finalizer.detach()
        with self._setup_lock:
            self._closed = True
            pin, self._pin = self._pin, None
            self._held.clear()
        if pin is not None:
            try:
                self._pinned_on.unpin(pin)
            except EngineClosedError:  # the engine went first (interpreter exit): nothing to release
                pass
        for toolset in self._toolsets:
            toolset.close()
        _live_agents.discard(self)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call_key(call: ToolCall) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, ensure_ascii=False, default=str)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if hasattr(value, "model_dump_json"):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _release(held: dict, toolsets: list) -> None:
    """An agent collected without close(): its pin and sessions go (the unpin posted, not awaited:
    a collection may run on the engine thread)."""
    if held.get("pin") is not None:
        try:
            held["engine"].unpin(held["pin"], wait=False)
        except EngineClosedError:
            pass
    for toolset in toolsets:
        toolset.close()


_live_agents: weakref.WeakSet[Agent] = weakref.WeakSet()


@atexit.register
def _close_agents() -> None:
    for a in list(_live_agents):
        a.close()
