"""The agent layer: `ak.Agent`, its tools, its run context and what a run returns.

An agent renders each step through the conversation protocol (`agentkv.chat`) and runs it on any
engine that has the `AgentEngine` methods (`agentkv.agents._engine`); it imports neither the
engine nor torch. The modules here are private (`_`-prefixed); these names are the API, and
`import agentkv as ak` re-exports them.
"""

from agentkv.agents._agent import Agent
from agentkv.agents._context import RunContext
from agentkv.agents._dbos import DBOSAgent
from agentkv.agents._journal import Journal
from agentkv.agents._mcp import MCPToolError, MCPToolset, mcp_tools
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
from agentkv.agents._tools import Tool, tool

__all__ = [
    "Agent", "AgentEvent", "AgentResult", "AgentUsage", "ApprovalRequired", "DBOSAgent", "Journal", "MCPToolError",
    "MCPToolset",
    "RunContext", "RunEnd", "Step", "StepEnd", "StepStart", "TextDelta", "Tool", "ToolCallEvent", "ToolResult",
    "ToolResultEvent", "mcp_tools", "tool",
]
