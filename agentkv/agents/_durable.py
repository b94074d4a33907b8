"""A durable run's side of the step loop (agents/_run.py's AgentRun takes it in): tool calls made
through the run's journal or DBOS steps, calls that wait for a decision, the model step a DBOS step
makes, and the prompt pinned before each live step. The journal's records are agents/_journal.py's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentkv.agents._journal import step_record
from agentkv.agents._result import ToolResult
from agentkv.chat.calls import ToolCall

RUN_PIN_TTL_S = 600.0  # how long a durable run's conversation stays pinned after its last step


class DurableSteps:
    """AgentRun's durable methods: it has `journal`, `steps_via`, `approvals`, `engine`, `_pin` and
    `_run_tool`."""

    def _waits(self, agent, call: ToolCall, index: int) -> bool:
        """A durable run's call that must wait for a decision: one needing approval, not answered; or one
        its journal says was running when the run's process ended, of a tool not marked idempotent."""
        record = self.journal.call(journal_name(index, call))
        if record is not None and record["state"] == "done" or call.id in (self.approvals or {}):
            return False
        if record is not None:  # started, never finished: it may have run
            return not agent.tools[call.name].idempotent
        return agent.tools[call.name].requires_approval

    async def _durable_call(self, agent, t, call: ToolCall, index: int, parent=None) -> ToolResult:
        """A tool call of a durable run: made through a DBOS step, or read from the journal where it
        finished before, else recorded as started, run, and recorded with its result."""
        if self.steps_via is not None:  # a DBOS step (at least once: a call running at a crash runs again)
            async def run() -> dict:
                return result_record(await self._run_tool(agent, t, call, index, parent))
            body = await self.steps_via.tool(journal_name(index, call), run)
            return ToolResult(call, body["content"], body["value"], body["error"], body["refused"])
        name = journal_name(index, call)
        record = self.journal.call(name)
        if record is not None and record["state"] == "done":  # it ran before the process ended: not again
            return ToolResult(call, record["content"], record.get("value"), record["error"], record["refused"],
                              replayed=True)
        verdict = (self.approvals or {}).get(call.id, True)
        if verdict is not True:  # refused by the caller (approval, or a call that may have run)
            reason = verdict if isinstance(verdict, str) else "the user did not approve it"
            again = " again" if record is not None else ""  # (started before: it may have run once)
            result = ToolResult(call, f"The call was not run{again}: {reason}", None, reason)
        else:
            await asyncio.to_thread(self.journal.record_call, name, {"state": "started"})  # before it runs
            result = await self._run_tool(agent, t, call, index, parent)
        await asyncio.to_thread(self.journal.record_call, name, {"state": "done", **result_record(result)})
        return result

    async def _generated(self, prompt_ids: list[int], params) -> dict:
        """One live model step as a DBOS step makes it: its prompt pinned first, the reply as a record."""
        await self._keep_conversation(prompt_ids)
        done = None
        async for delta in self.engine.stream(prompt_ids, params):
            if delta.completion is not None:
                done = (delta.completion, delta.usage)
        return step_record(*done)

    async def _keep_conversation(self, ids: list[int]) -> None:
        """A durable run's next prompt (its conversation so far), pinned for a while before the step
        generates, and so written through to the engine's disk tier: a run whose process dies during
        the step starts it again from cache when resumed."""
        pin = getattr(self.engine, "pin", None)
        if pin is None or not getattr(self.engine.config.cache, "enable_radix_cache", False):
            return
        try:
            handle = await asyncio.to_thread(pin, ids, ttl_s=RUN_PIN_TTL_S)
        except Exception:  # (over the pin budget, say: the run goes on, its next step may recompute)
            return
        if self._pin is not None:
            await asyncio.to_thread(self.engine.unpin, self._pin)
        self._pin = handle


def journal_name(index: int, call: ToolCall) -> str:
    """A call's name in a run's journal: its step and id (a replayed step gives its calls the same ids)."""
    return f"{index}:{call.id}"


def result_record(result: ToolResult) -> dict:
    """A tool call's result as a journal (or a DBOS step) keeps it."""
    return {"content": result.content, "value": _json_value(result.value), "error": result.error,
            "refused": result.refused}


def _json_value(value: Any) -> Any:
    """A tool's return value as a journal keeps it: as JSON where it has a JSON form, else its text."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return as_text(value)


def as_text(value: Any) -> str:
    """A tool's return value as the model is shown it (and a journal keeps what has no JSON form)."""
    if isinstance(value, str):
        return value
    if hasattr(value, "model_dump_json"):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
