"""What an agent run returns and streams: steps, tool calls and results, usage, events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentkv.chat.calls import ToolCall


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str  # what the model is shown: the tool's return value as text, or the error
    value: Any = None  # the tool's return value (None when it failed)
    error: str | None = None  # why the call failed: its arguments, or the tool raised
    refused: bool = False  # the tool refused the arguments (counts as a retry); False when the tool raised
    repeated: bool = False  # the run made this call before: not run again, this is the earlier result
    replayed: bool = False  # read back from the run's journal (a resumed durable run): not run again


@dataclass
class AgentUsage:
    steps: int = 0
    tool_calls: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the radix cache (the pinned prefix, earlier steps)
    completion_tokens: int = 0
    forward_passes: int = 0
    jump_forward_tokens: int = 0  # tokens the grammar decided, appended without a forward pass

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, other: AgentUsage) -> None:
        """Add another run's usage (an agent run as a tool: its usage is the caller's)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def add_generation(self, usage) -> None:
        """Add one step's engine `Usage`."""
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        self.completion_tokens += usage.completion_tokens
        self.forward_passes += usage.forward_passes
        self.jump_forward_tokens += usage.jump_forward_tokens


@dataclass
class Step:
    """One generation of the model and what followed from it."""

    index: int  # 1-based
    tool_choice: str  # the mode this step was generated under: "auto", "required", "none" or a tool name
    text: str  # everything the model wrote
    content: str = ""  # its text outside tool calls (and outside a reasoning block)
    reasoning: str | None = None  # what a reasoning model wrote in its block, None where it wrote none
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    error: str | None = None  # the output failed validation: the message the model was given to retry
    usage: Any = None  # the engine's Usage of this step's generation
    seconds: float = 0.0
    agent: str = ""  # the name of the agent whose step it was (handoffs change it)
    forced: bool = False  # the step had to answer: the last of max_steps, or every tool was withheld
    replayed: bool = False  # read back from the run's journal (a resumed durable run): not generated again


@dataclass(frozen=True)
class ApprovalRequired:
    """The output of a run that stopped at calls of tools that need approval (`requires_approval`):
    continue with `agent.run(history=result.messages, approvals={call.id: True or False or a reason})`
    (a durable run: `agent.resume(run_id, approvals=...)`; there also a call that was running when the
    run's process ended, of a tool not marked idempotent: it may have run)."""

    calls: list[ToolCall]


@dataclass
class AgentResult:
    output: Any  # a str, an instance of the agent's output_type, or ApprovalRequired
    steps: list[Step]
    usage: AgentUsage
    # the conversation in OpenAI's message shape (structured tool calls, role "tool" results), system
    # prompt first; pass it as `history=` to continue (with this agent or another)
    messages: list[dict]
    agent: str = ""  # the agent that gave the output (after handoffs, the last one handed to)

    @property
    def forced_final(self) -> bool:
        """The output came from a step that had to answer (max_steps ran out, or every tool was withheld)."""
        return bool(self.steps) and self.steps[-1].forced


# ---- events of `Agent.stream` ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepStart:
    step: int
    tool_choice: str


@dataclass(frozen=True)
class TextDelta:
    step: int
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    step: int
    call: ToolCall


@dataclass(frozen=True)
class ToolResultEvent:
    step: int
    result: ToolResult


@dataclass(frozen=True)
class StepEnd:
    step: Step
    usage: AgentUsage  # the run's usage so far


@dataclass(frozen=True)
class RunEnd:
    result: AgentResult


AgentEvent = StepStart | TextDelta | ToolCallEvent | ToolResultEvent | StepEnd | RunEnd
