"""A small MCP server (the `mcp` package's server side) with the travel tools of examples/agent.py,
for examples/mcp_agent.py to start over stdio.

    python examples/mcp_server.py            # speaks MCP on stdin/stdout
"""

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

WEATHER = {"paris": (18, "sunny"), "lisbon": (24, "clear"), "oslo": (4, "rain"), "london": (12, "drizzle")}

server = MCPServer("travel")


@server.tool()
def get_weather(city: str) -> str:
    """Current weather for a city, in degrees celsius."""
    if city.lower() not in WEATHER:
        raise ToolError(f"no weather station in {city}; known: {', '.join(w.title() for w in WEATHER)}")
    degrees, sky = WEATHER[city.lower()]
    return f"{degrees} degrees celsius, {sky}"


if __name__ == "__main__":
    server.run("stdio")
