"""What a tool, an instruction function or an output validator is given about the run it serves.

    @ak.tool
    def balance(ctx: ak.RunContext[Bank], account: str) -> float:
        return ctx.deps.balance(ctx.deps.customer_id, account)

A first parameter annotated `RunContext` (or `RunContext[Deps]`) is not shown to the model: the
agent passes the run's context there. `deps` is what `agent.run(..., deps=...)` was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, get_origin

from agentkv.agents._engine import AgentEngine

Deps = TypeVar("Deps")


@dataclass
class RunContext(Generic[Deps]):
    deps: Deps
    agent: Any  # the Agent whose step this is (after a handoff, the agent handed to)
    engine: AgentEngine  # the engine the run generates on
    usage: Any  # the run's AgentUsage so far; an agent run as a tool adds its usage here
    messages: list[dict] = field(default_factory=list)  # the conversation so far
    step: int = 0  # the step being served (1-based; 0 before the first)
    retry: int = 0  # how many times the tool (or the output) being served has been retried in this run
    tool_name: str | None = None  # the tool being called, where a tool is served
    tool_call_id: str | None = None


def is_run_context(annotation: Any) -> bool:
    """`RunContext` or `RunContext[Deps]` (as an annotation, possibly a string of one)."""
    if isinstance(annotation, str):
        return annotation.split("[", 1)[0].strip().rsplit(".", 1)[-1] == "RunContext"
    return annotation is RunContext or get_origin(annotation) is RunContext
