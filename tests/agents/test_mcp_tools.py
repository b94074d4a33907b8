"""MCP tools in agents: an MCP server written with the `mcp` package's server side (tests/agents/mcp_server.py),
reached over stdio and over streamable HTTP, whose tools an `ak.Agent` calls with arguments the
grammar made valid; the server's errors reach the model; the session closes with the agent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

import agentkv as ak  # noqa: E402
from agentkv.errors import ToolDefinitionError  # noqa: E402
from tests.server.test_server import serving  # noqa: E402

SERVER = Path(__file__).with_name("mcp_server.py")


@pytest.fixture(scope="module")
def engine(tiny_long_dir):
    e = ak.Engine(str(tiny_long_dir), num_slots=16384)
    yield e
    e.close()


def run(engine, toolset, tool_choice: str, text: str = "go"):
    with ak.Agent("Use the tools.", tools=[toolset], tool_choice=tool_choice, max_steps=2, engine=engine,
                  temperature=1.0, seed=3, max_tokens=120) as agent:
        names = sorted(agent.tools)
        result = agent.run_sync(text)
    return names, result


def test_stdio_tools_are_listed_and_called(engine):
    toolset = ak.mcp_tools(["python", str(SERVER)])
    names, result = run(engine, toolset, "add")
    assert names == ["add", "lookup_city"]  # `lookup.city` made a valid tool name
    call = result.steps[0].tool_calls[0]
    assert call.name == "add" and set(call.arguments) == {"a", "b"}
    assert result.steps[0].tool_results[0].content == str(call.arguments["a"] + call.arguments["b"])
    with pytest.raises(ak.MCPToolError, match="closed"):  # the session closed with the agent
        toolset.call("add", {"a": 1, "b": 2})


def test_a_server_error_reaches_the_model(engine):
    names, result = run(engine, ak.mcp_tools([sys.executable, str(SERVER)]), "lookup_city")
    (res,) = result.steps[0].tool_results[:1]
    code = res.call.arguments["code"]
    if code in ("LIS", "CDG"):  # a random model could name a known code
        assert res.error is None
    else:
        assert "unknown airport code" in res.content and res.error and not res.refused


def test_streamable_http(engine):
    from tests.agents.mcp_server import server

    with serving(server.streamable_http_app()) as base:
        url = base.removesuffix("/v1") + "/mcp"
        toolset = ak.mcp_tools(url)
        assert [t.name for t in toolset.connect()] == ["add", "lookup_city"]
        assert toolset.call("add", {"a": 2, "b": 5}) == "7"
        _, result = run(engine, toolset, "add")
        call = result.steps[0].tool_calls[0]
        assert result.steps[0].tool_results[0].content == str(call.arguments["a"] + call.arguments["b"])


def test_arguments_are_checked_against_the_input_schema():
    toolset = ak.mcp_tools(["python", str(SERVER)])
    try:
        (add,) = [t for t in toolset.connect() if t.name == "add"]
        with pytest.raises(ak.ToolArgumentsError, match="'b' is a required property"):
            add.call({"a": 1})
        assert add.call({"a": 1, "b": 2}) == "3"
    finally:
        toolset.close()


def test_a_server_that_does_not_start_is_a_clear_error():
    with pytest.raises(ToolDefinitionError, match="could not be reached"):
        ak.Agent("x", tools=[ak.mcp_tools(["python", "-c", "raise SystemExit(3)"], timeout=10)])
