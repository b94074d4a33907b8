"""An MCP server for the tests (the `mcp` package's server side): run with stdio by default, or
`--http PORT` for streamable HTTP."""

from __future__ import annotations

import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(name="lookup.city")
def lookup_city(code: Annotated[str, Field(pattern="^[A-Z]{3}$")]) -> str:
    """The city of an airport code (a dotted name, as some servers use)."""
    cities = {"LIS": "Lisbon", "CDG": "Paris"}
    if code not in cities:
        raise ToolError(f"unknown airport code {code!r}; known: {sorted(cities)}")
    return cities[code]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run("stdio")
