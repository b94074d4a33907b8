"""Tools from a Model Context Protocol server, for `ak.Agent`.

    agent = ak.Agent("...", tools=[get_weather, ak.mcp_tools("python my_server.py")])
    agent = ak.Agent("...", tools=[ak.mcp_tools("http://127.0.0.1:8000/mcp")])   # streamable HTTP

The server is started (stdio) or reached (a URL) when the agent is made; its tools are listed with
their input schemas, which the step grammar enforces like any tool's; a call goes through the
session, and an error the server reports reaches the model as the tool's error. The session lives
on a thread of its own with its own event loop (MCP's transports are bound to the task that opened
them), so an agent's runs, sync or async, in any loop, share it. It closes with the agent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import shlex
import sys
import threading
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from agentkv.agents._tools import Tool
from agentkv.errors import ToolArgumentsError, ToolDefinitionError
from agentkv.grammar.schema.validation import schema_check


class MCPToolError(RuntimeError):
    """The MCP server answered a call with an error (its text is what the model is shown)."""


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool of an MCP server: arguments checked against its input schema, calls through the session."""

    toolset: MCPToolset | None = field(default=None, repr=False, compare=False)
    remote_name: str = ""  # the server's name for it (`name` is that, made a valid tool name)

    @property
    def is_async(self) -> bool:
        return True

    def validate(self, arguments: dict | str) -> dict[str, Any]:
        arguments = self.arguments_dict(arguments)
        problem = schema_check(self.parameters).error(arguments)
        if problem is not None:
            raise ToolArgumentsError(self.name, problem)
        return arguments

    def call(self, arguments: dict | str, ctx: Any = None) -> Any:
        return self.toolset.call(self.remote_name, self.validate(arguments))

    async def acall(self, arguments: dict | str, ctx: Any = None) -> Any:
        kwargs = self.validate(arguments)
        return await asyncio.wrap_future(self.toolset.submit(self.remote_name, kwargs))


class MCPToolset:
    """One MCP server's tools, over one session. `server`: a command line (run with stdio) or an
    http(s) URL (streamable HTTP). `timeout`: seconds to start and list, and per call."""

    def __init__(self, server: str | Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 timeout: float = 30.0):
        self.server, self.env, self.cwd, self.timeout = server, env, cwd, timeout
        self.tools: list[MCPTool] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session = None
        self._stop: asyncio.Event | None = None
        self._main: concurrent.futures.Future | None = None

    @property
    def url(self) -> str | None:
        return self.server if isinstance(self.server, str) and re.match(r"https?://", self.server) else None

    def connect(self) -> list[MCPTool]:
        """Start the session and list the tools (once)."""
        if self.tools or self._loop is not None:
            return self.tools
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ToolDefinitionError("ak.mcp_tools needs the mcp package: pip install 'agentkv[mcp]'") from None
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="agentkv-mcp", daemon=True).start()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._run(ready), self._loop)
        try:
            listed = ready.result(self.timeout)
        except Exception as e:
            self.close()
            raise ToolDefinitionError(f"the MCP server {self.server!r} could not be reached or listed: "
                                      f"{type(e).__name__}: {e}") from None
        self.tools = [self._tool(t) for t in listed]
        return self.tools

    def submit(self, name: str, arguments: dict) -> concurrent.futures.Future:
        if self._session is None:
            raise MCPToolError(f"the MCP session with {self.server!r} is closed")
        return asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)

    def call(self, name: str, arguments: dict) -> Any:
        return self.submit(name, arguments).result(self.timeout)

    def close(self) -> None:
        """End the session (and stop a stdio server)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
            try:
                self._main.result(self.timeout)
            except Exception:  # the server went first: nothing left to close
                pass
        self._session = None
        loop.call_soon_threadsafe(loop.stop)

    # ---- on the session's loop ------------------------------------------------------------------------

    async def _run(self, ready: concurrent.futures.Future) -> None:
        """Open the transport and session, list the tools, and hold them open until `close`: one
        task enters and leaves them, as the transports require."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                self._session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await self._session.initialize()
                listed, cursor = [], None
                while True:
                    page = await self._session.list_tools(params=_page(cursor))
                    listed.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self._stop = asyncio.Event()
                ready.set_result(listed)
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            elif not isinstance(e, Exception):
                raise

    def _transport(self):
        if self.url:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        argv = shlex.split(self.server) if isinstance(self.server, str) else list(self.server)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the interpreter running the agent, with its packages
        return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=self.env, cwd=self.cwd))

    async def _call(self, name: str, arguments: dict) -> Any:
        result = await self._session.call_tool(name, arguments, read_timeout_seconds=self.timeout)
        text = "\n".join(getattr(c, "text", None) or f"[{getattr(c, 'type', 'content')}]" for c in result.content)
        if getattr(result, "is_error", False):
            raise MCPToolError(text or "the tool failed")
        if not text and result.structured_content is not None:
            return result.structured_content
        return text

    def _tool(self, t) -> MCPTool:
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", t.name)[:64] or "tool"
        schema = dict(t.input_schema or {"type": "object", "properties": {}})
        schema.pop("title", None)
        return MCPTool(name, t.description or "", self._missing, None, schema, toolset=self, remote_name=t.name)

    @staticmethod
    def _missing(**kwargs):  # an MCP tool runs on the server: `call` / `acall` send it there
        raise NotImplementedError


def mcp_tools(server: str | Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
              timeout: float = 30.0) -> MCPToolset:
    """The tools of an MCP server, for `ak.Agent(tools=[...])`: a command line to run with stdio
    ("python my_server.py", or a list of arguments) or a streamable-HTTP URL."""
    return MCPToolset(server, env=env, cwd=cwd, timeout=timeout)


def _page(cursor: str | None):
    if cursor is None:
        return None
    from mcp.types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)
