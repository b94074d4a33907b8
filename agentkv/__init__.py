"""agentkv: structured output and agents on an LLM engine that remembers.

`import agentkv as ak` is the whole user surface: `ak.Engine`, `ak.SamplingParams`, typed generation
(`ak.generate`, `ak.stream`), tools and agents (`@ak.tool`, `ak.Agent`), the DSL (`@ak.function`, `ak.gen`, ...),
and the errors.
The engine names load on first use, so `agentkv.grammar` (pure Python and numpy) never imports torch.
"""

from agentkv.agents import (
    Agent,
    AgentResult,
    AgentUsage,
    ApprovalRequired,
    DBOSAgent,
    Journal,
    MCPToolError,
    MCPToolset,
    RunContext,
    RunEnd,
    Step,
    StepEnd,
    StepStart,
    TextDelta,
    Tool,
    ToolCallEvent,
    ToolResult,
    ToolResultEvent,
    mcp_tools,
    tool,
)
from agentkv.chat.calls import ToolCall
from agentkv.dsl import (
    Fork,
    ProgramState,
    assistant,
    function,
    gen,
    select,
    system,
    user,
)
from agentkv.errors import (
    AdapterError,
    AgentError,
    AgentKVError,
    AgentRetriesError,
    CacheError,
    EngineClosedError,
    EngineError,
    GrammarError,
    IncompleteOutputError,
    JournalError,
    ModelLoadError,
    ModelRetry,
    OutputError,
    OutputValidationError,
    PinBudgetError,
    PromptTooLongError,
    RequestError,
    ToolArgumentsError,
    ToolDefinitionError,
    UnknownAdapterError,
)
from agentkv.typed import agenerate, astream, default_engine, generate, set_default_engine, stream

_ENGINE_NAMES = {"Completion", "Engine", "PinHandle", "RequestOutput", "SamplingParams", "StreamDelta", "Usage"}


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        from agentkv import engine  # here: the engine loads torch (seconds), which the other layers never need

        return getattr(engine, name)
    raise AttributeError(f"module 'agentkv' has no attribute {name!r}")


__version__ = "0.2.0"
__all__ = [
    "Agent", "AgentError", "AgentResult", "AgentRetriesError", "AgentUsage", "ApprovalRequired", "DBOSAgent",
    "Journal", "JournalError", "ModelRetry",
    "RunContext", "RunEnd", "Step", "StepEnd", "StepStart",
    "TextDelta", "ToolCall", "ToolCallEvent", "ToolResult", "ToolResultEvent",
    "AdapterError", "AgentKVError", "CacheError", "Completion", "Engine", "EngineClosedError", "EngineError",
    "GrammarError", "IncompleteOutputError", "UnknownAdapterError", "ModelLoadError", "OutputError",
    "OutputValidationError",
    "PinBudgetError", "PinHandle", "PromptTooLongError", "RequestError", "RequestOutput", "SamplingParams",
    "StreamDelta", "Usage",
    "Tool", "ToolArgumentsError", "ToolDefinitionError", "MCPToolError", "MCPToolset", "mcp_tools",
    "Fork", "ProgramState", "assistant", "function", "gen", "select", "system", "user",
    "agenerate", "astream", "default_engine", "generate", "set_default_engine", "stream", "tool",
]
