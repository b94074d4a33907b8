"""An agent whose tool comes from an MCP server: `ak.mcp_tools` starts examples/mcp_server.py over
stdio, lists its tools with their schemas, and the agent's grammar makes every call to it valid.
The server process stops when the agent closes.

    agentkv run examples/mcp_agent.py --input "What is the weather in Oslo?"
    python examples/mcp_agent.py
"""

from pathlib import Path

import agentkv as ak

SERVER = Path(__file__).with_name("mcp_server.py")

agent = ak.Agent(
    "You are a travel assistant. Call the tool to look up the weather, then answer in one sentence.",
    tools=[ak.mcp_tools(["python", str(SERVER)])],
    tool_choice="required",  # the first step calls the server's tool; after it the model decides
    parallel_tool_calls=False,
    max_steps=3,
    max_tokens=120,
)


def main(question: str = "What is the weather in Paris?") -> str:
    result = agent.run_sync(question)
    for step in result.steps:
        for call, res in zip(step.tool_calls, step.tool_results):
            print(f"step {step.index}: {call.name}({call.arguments}) -> {res.content}")
    return result.output


if __name__ == "__main__":
    print(main())
    agent.close()
