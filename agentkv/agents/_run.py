"""One run of an agent: the step loop.

Each step is one generation under one grammar (agentkv/chat/formats/): tool calls in the model's own format,
free text, or the output under the agent's output schema. A step's calls run concurrently; their
results (or errors) go back to the model as tool messages and the loop continues, until a step gives
an output that validates, a handoff passes the conversation to another agent (whose system prompt
then leads it), or a call awaits approval. The conversation is kept in OpenAI's message shape and
rendered in the model's format, so each step's prompt begins with the previous one's tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from agentkv.agents import _tracing as tracing
from agentkv.agents._context import RunContext
from agentkv.agents._durable import DurableSteps, as_text
from agentkv.agents._engine import AgentEngine
from agentkv.agents._journal import RunJournal, replayed_step
from agentkv.agents._result import (
    AgentEvent,
    AgentResult,
    AgentUsage,
    ApprovalRequired,
    RunEnd,
    Step,
    StepEnd,
    StepStart,
    TextDelta,
    ToolCallEvent,
    ToolResult,
    ToolResultEvent,
)
from agentkv.agents._step import agent_prompt, history_content, read_step, step_turn
from agentkv.chat.calls import ToolCall
from agentkv.chat.carry import TokenCarry
from agentkv.chat.messages import assistant_calls_message, tool_message
from agentkv.errors import (
    AgentError,
    AgentRetriesError,
    JournalError,
    ModelRetry,
    OutputError,
    RequestError,
    ToolArgumentsError,
)

RETRY = "\n\nFix the errors and try again."


class AgentRun(DurableSteps):
    def __init__(self, agent, input, history, deps, approvals, engine: AgentEngine | None,
                 journal: RunJournal | None = None, steps_via=None):
        """`journal`: a durable run's records (agents/_journal.py): replies and results read back where
        recorded, recorded where made. `steps_via`: a DBOS workflow's steps (agents/_dbos.py), through
        which each model reply and each tool call is made (DBOS replays them after a crash)."""
        self.agent, self.input, self.history, self.approvals = agent, input, history, approvals
        self.journal, self.steps_via = journal, steps_via
        self._pin = None  # a durable run's conversation, pinned while the run is open (written through to disk)
        self.engine: AgentEngine = engine or agent.engine
        self.usage, self.steps, self.errors = AgentUsage(), [], []
        self.tries: dict[str, int] = {}  # refusals / retries, per tool name and "output"
        self.made: dict[str, ToolResult] = {}  # the results of the run's calls, by call
        self.ctx = RunContext(deps, agent, self.engine, self.usage)
        self.carry = TokenCarry(self.engine.tokenizer)  # each prompt starts with the last one's tokens as written

    async def events(self) -> AsyncIterator[AgentEvent]:
        span, ended = tracing.start("agent run", agentkv__agent=self.agent.name), False
        steps = self._steps(span)
        try:
            async for event in steps:
                if isinstance(event, RunEnd):  # ended here: the consumer may stop at this event
                    ended = True
                    tracing.end(span, agentkv__final_agent=self.agent.name, agentkv__steps=self.usage.steps,
                                agentkv__pinned_tokens=self.agent.pinned_tokens, **tracing.usage_attributes(self.usage))
                yield event
        except BaseException as e:
            if not ended:
                tracing.end(span, e if isinstance(e, Exception) else None, **tracing.usage_attributes(self.usage))
                if self.journal is not None and isinstance(e, AgentError) and not isinstance(e, JournalError):
                    self.journal.end("failed")  # (a replay would end the same way)
            raise
        finally:  # closed here, on this loop: left to the collector, its close would find the loop gone
            await steps.aclose()

    async def _steps(self, run_span) -> AsyncIterator[AgentEvent]:
        agent = self.agent
        setup = await asyncio.to_thread(agent.setup, self.engine)
        self.messages = messages = await self._conversation(setup)
        self.ctx.messages = messages
        resumed = await self._resume(messages) if self.journal is None else []  # (a journal replays its own)
        for result in resumed:
            yield ToolResultEvent(0, result)
        mode, withheld = agent.tool_choice, set()
        if any(not r.refused for r in resumed) and mode != "none":
            mode = "auto"  # the required call was made (approved), the model decides now
        max_steps = agent.max_steps
        for index in range(1, max_steps + 1):
            agent, setup = self.agent, self.agent.setup(self.engine)
            self.ctx.step, self.ctx.agent = index, agent
            offered = await self._offered(agent, withheld)
            answer = index == max_steps or (mode != "none" and bool(agent.tools) and not offered)
            step_mode = "none" if answer else mode
            yield StepStart(index, step_mode)
            started, done = time.perf_counter(), []
            span = tracing.start("agent step", run_span, agentkv__step=index, agentkv__agent=agent.name,
                                 agentkv__tool_choice=step_mode)
            prompt = agent_prompt(agent, setup, self.engine, messages)
            state = setup.reasoning.state(prompt) if setup.reasoning is not None else "off"
            turn = step_turn(agent, setup, step_mode, offered, state,
                             markup_free=any(m.get("role") == "tool" for m in messages))
            # (a call budget closing completed would carry arguments the model never wrote, and a run
            # executes its calls: its steps are cut as they stand, the cut call dropped and asked again)
            params = turn.params(agent.params).with_(budget_closing=False)
            prompt_ids = self.carry.encode(prompt)
            recorded = self.journal.step(index) if self.journal is not None else None
            if recorded is not None:  # a resumed run: the reply as the model wrote it then
                done = list(recorded)
                yield TextDelta(index, recorded[0].text)
            elif self.steps_via is not None:  # a DBOS step: made once, replayed by DBOS after a crash
                done = list(replayed_step(await self.steps_via.model(
                    index, lambda: self._generated(prompt_ids, params))))
                yield TextDelta(index, done[0].text)
            else:
                if self.journal is not None:
                    await self._keep_conversation(prompt_ids)
                async for delta in self.engine.stream(prompt_ids, params):
                    if delta.text:
                        yield TextDelta(index, delta.text)
                    if delta.completion is not None:
                        done = [delta.completion, delta.usage]
                if self.journal is not None:  # before anything acts on it
                    await asyncio.to_thread(self.journal.record_step, index, *done)
            completion, step_usage = done
            self.carry.written(prompt, prompt_ids, completion)
            self.usage.steps += 1
            self.usage.add_generation(step_usage)
            tracing.end(span, **tracing.usage_attributes(step_usage))
            step, kept, before = read_step(agent, turn, index, step_mode, completion)
            step.usage, step.agent, step.forced = step_usage, agent.name, answer and mode != "none"
            step.replayed = recorded is not None
            self.steps.append(step)
            withheld = set()
            if step.tool_calls:
                for call in step.tool_calls:
                    yield ToolCallEvent(index, call)
                pending = await self._run_calls(agent, step, span)
                for result in step.tool_results:
                    yield ToolResultEvent(index, result)
                withheld = {r.call.name for r in step.tool_results if r.repeated}
                if withheld:  # the model is repeating itself, done with its tools: not a moment to hand off
                    withheld |= set(agent.handoffs)
                fresh = [r.call for r in step.tool_results if not r.repeated]
                if fresh:  # the conversation keeps the calls that ran (or wait), and their results
                    messages.append(assistant_calls_message(history_content(setup.format, before, step), fresh))
                    messages.extend(tool_message(r.call, r.content) for r in step.tool_results
                                    if not r.repeated and r.call not in pending)
                if any(not r.refused for r in step.tool_results):  # a required or named call was made:
                    mode = "auto" if mode != "none" else mode  # the model decides now (refused, it calls again)
                step.seconds = time.perf_counter() - started
                yield StepEnd(step, self.usage)
                self._check_refusals(agent, step)
                if pending:
                    yield RunEnd(self._result(ApprovalRequired(pending)))
                    return
                handoffs = [r.value for r in step.tool_results if r.call.name in agent.handoffs and not r.repeated]
                handoff = handoffs[0] if handoffs else None
                if handoff is not None:
                    mode = await self._hand_to(handoff)
                continue
            messages.append({"role": "assistant", "content": kept})
            output = None
            if step.error is None:
                try:
                    output = await self._output(agent, completion, step_mode, state, step.content)
                except (OutputError, ModelRetry) as e:
                    step.error = str(e)
            step.seconds = time.perf_counter() - started
            yield StepEnd(step, self.usage)
            if step.error is None:
                yield RunEnd(self._result(output))
                return
            self.errors.append(step.error)
            self.usage.retries += 1
            self.tries["output"] = self.tries.get("output", 0) + 1
            if self.tries["output"] > agent.output_retries or index == max_steps:
                raise AgentRetriesError(f"the model's output failed {self.tries['output']} times (output_retries="
                                        f"{agent.output_retries}, max_steps={max_steps}): {step.error}",
                                        step.text, self.errors)
            messages.append({"role": "user", "content": step.error + RETRY})

    # ---- calls ------------------------------------------------------------------------------------------

    async def _run_calls(self, agent, step: Step, span) -> list[ToolCall]:
        """Run the step's calls that are new (concurrently) and fill `step.tool_results`; returns the
        calls that wait for approval. A handoff is a call like any other; the first one counts."""
        fresh, seen, pending = [], set(self.made), []
        for c in step.tool_calls:
            if agent.rerun_calls or _call_key(c) not in seen:
                fresh.append(c)
                seen.add(_call_key(c))
        handoffs = [c for c in fresh if c.name in agent.handoffs]
        fresh = [c for c in fresh if c.name not in agent.handoffs or c is handoffs[0]]
        if self.journal is not None:
            pending = [c for c in fresh if self._waits(agent, c, step.index)]
        else:
            pending = [c for c in fresh if agent.tools[c.name].requires_approval]
        runs = [c for c in fresh if c not in pending]
        ran = dict(zip((c.id for c in runs), await asyncio.gather(*(self._call(agent, c, step.index, span)
                                                                      for c in runs))))
        self.made.update((_call_key(r.call), r) for r in ran.values())
        replayed = sum(r.replayed for r in ran.values())
        waiting = {c.id: ToolResult(c, "(waiting for approval)") for c in pending}
        step.tool_results = [ran.get(c.id) or waiting.get(c.id) or
                             dataclasses.replace(self.made[_call_key(c)], call=c, repeated=True)
                             for c in step.tool_calls if c in fresh or _call_key(c) in self.made]
        self.usage.tool_calls += len(runs) - replayed
        return pending

    async def _call(self, agent, call: ToolCall, index: int, parent=None) -> ToolResult:
        t = agent.tools[call.name]  # the grammar only writes offered names
        if call.name in agent.handoffs:
            return ToolResult(call, t.func(), agent.handoffs[call.name])
        if self.journal is None and self.steps_via is None:
            return await self._run_tool(agent, t, call, index, parent)
        return await self._durable_call(agent, t, call, index, parent)  # (agents/_durable.py)

    async def _run_tool(self, agent, t, call: ToolCall, index: int, parent=None) -> ToolResult:
        ctx = dataclasses.replace(self.ctx, step=index, retry=self.tries.get(call.name, 0), tool_name=call.name,
                                  tool_call_id=call.id)
        span = tracing.start(f"tool {call.name}", parent, gen_ai__tool__name=call.name, gen_ai__tool__call__id=call.id)
        try:
            value = await t.acall(call.arguments, ctx)
        except ToolArgumentsError as e:
            result = ToolResult(call, f"error: {e}", None, str(e), refused=True)
        except ModelRetry as e:  # the tool asks the model to try again
            result = ToolResult(call, f"{e}{RETRY}", None, str(e), refused=True)
        except Exception as e:  # the tool failed: the model is told, and may try otherwise
            result = ToolResult(call, f"error: {type(e).__name__}: {e}", None, f"{type(e).__name__}: {e}")
        else:
            result = ToolResult(call, as_text(value), value)
        tracing.end(span, agentkv__tool__error=result.error, agentkv__tool__refused=result.refused)
        return result

    def _check_refusals(self, agent, step: Step) -> None:
        for r in step.tool_results:
            if not r.refused or r.repeated:
                continue
            self.errors.append(r.error)
            self.usage.retries += 1
            self.tries[r.call.name] = n = self.tries.get(r.call.name, 0) + 1
            limit = agent.tools[r.call.name].retries
            limit = agent.retries if limit is None else limit
            if n > limit:
                raise AgentRetriesError(
                    f"tool {r.call.name!r} refused the model's call {n} times (retries={limit}): {r.error}", r.call,
                    self.errors)

    async def _offered(self, agent, withheld: set[str]) -> list:
        """The tools a step offers: the agent's, less the withheld, as `prepare_tools` selects."""
        tools = [t for name, t in agent.tools.items() if name not in withheld]
        if agent.prepare_tools is None:
            return tools
        chosen = agent.prepare_tools(self.ctx, list(tools))
        chosen = await chosen if inspect.isawaitable(chosen) else chosen
        names = {t.name for t in tools}
        unknown = [getattr(t, "name", t) for t in chosen if getattr(t, "name", None) not in names]
        if unknown:
            raise RequestError(
                f"prepare_tools returned {unknown}, which are not among the step's tools {sorted(names)}")
        return list(chosen)

    async def _hand_to(self, target) -> str:
        """Continue with `target`: its system messages lead the conversation, its tools and output apply."""
        self.agent = target
        setup = await asyncio.to_thread(target.setup, self.engine)
        rest = [m for m in self.messages if m.get("role") != "system"]
        self.messages[:] = await self._system_messages(target, setup) + rest
        return target.tool_choice

    # ---- the conversation ----------------------------------------------------------------------------

    async def _conversation(self, setup) -> list[dict]:
        history, input = self.history, self.input
        rest = [dict(m) for m in history or () if m.get("role") != "system"]
        if input is None:
            if not self.approvals:
                raise RequestError("give the run an input (a string or messages), or approvals= to continue one")
        elif isinstance(input, str):
            rest.append({"role": "user", "content": input})
        elif isinstance(input, (list, tuple)) and all(isinstance(m, dict) for m in input):
            rest.extend(dict(m) for m in input)
        else:
            raise RequestError(f"an agent's input is a string or a list of message dicts, not {type(input).__name__}")
        return await self._system_messages(self.agent, setup) + rest

    async def _system_messages(self, agent, setup) -> list[dict]:
        """The agent's system message (pinned), and its per-run instructions after it (or in it,
        where the template takes one system message only)."""
        self.ctx.agent = agent
        extra = await agent.instructions_text(self.ctx) if agent._instruction_functions else ""
        if not extra:
            return [dict(setup.system)]
        if setup.instructions_apart:
            return [dict(setup.system), {"role": "system", "content": extra}]
        return [{**setup.system, "content": (setup.system["content"] + "\n\n" + extra).lstrip()}]

    async def _resume(self, messages: list[dict]) -> list[ToolResult]:
        """Run (or refuse) the calls a previous run left waiting for approval, as `approvals` says."""
        if not self.approvals:
            return []
        answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
        last = next((m for m in reversed(messages) if m.get("role") == "assistant" and m.get("tool_calls")), None)
        waiting = [c for c in (last or {}).get("tool_calls", []) if c.get("id") not in answered]
        if not waiting:
            raise RequestError("approvals= was given, but no call in the history waits for one")
        missing = [c["id"] for c in waiting if c["id"] not in self.approvals]
        if missing:
            raise RequestError(
                f"calls {missing} wait for approval: give approvals={{call id: True, or False / a reason}}")
        results = []
        for c in waiting:
            fn = c.get("function") or {}
            call = ToolCall(fn.get("name", ""), json.loads(fn.get("arguments") or "{}"), c["id"], fn.get("arguments"))
            verdict = self.approvals[c["id"]]
            if call.name not in self.agent.tools:
                raise RequestError(
                    f"the call {c['id']} waiting for approval is of {call.name!r}, not a tool of this agent")
            if verdict is True:
                result = await self._call(self.agent, call, 0)
                self.usage.tool_calls += 1
            else:
                reason = verdict if isinstance(verdict, str) else "the user did not approve it"
                result = ToolResult(call, f"The call was not run: {reason}", None, reason)
            messages.append(tool_message(call, result.content))
            results.append(result)
        return results

    async def _output(self, agent, completion, mode: str, state: str, answer: str) -> Any:
        spec = agent.output_spec
        value = answer.strip() if spec.text else spec.parse(answer)
        ctx = dataclasses.replace(self.ctx, retry=self.tries.get("output", 0))
        value = await spec.finish(value, ctx)
        for validate in agent._validators:
            takes_ctx = len(inspect.signature(validate).parameters) > 1
            got = validate(ctx, value) if takes_ctx else validate(value)
            value = await got if inspect.isawaitable(got) else got
        return value

    def _result(self, output) -> AgentResult:
        if self.journal is not None:
            self.journal.end("waiting" if isinstance(output, ApprovalRequired) else "done")
        return AgentResult(output, self.steps, self.usage, self.messages, self.agent.name)


def _call_key(call: ToolCall) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, ensure_ascii=False, default=str)
