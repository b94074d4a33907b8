"""A travel agent with two tools on the embedded model: every tool call it writes is well-formed,
because each step is generated under the grammar of the tools' schemas. Its system prompt and tool
definitions stay pinned in the radix cache, so every step starts from cached KV.

    agentkv run examples/agent.py --input "Weather in Lisbon, and 200 EUR in USD?"    # the live view
    python examples/agent.py                                                             # plain prints
"""

from typing import Literal

import agentkv as ak

WEATHER = {"paris": (18, "sunny"), "lisbon": (24, "clear"), "oslo": (4, "rain"), "london": (12, "drizzle")}
RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.0}


@ak.tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Current weather for a city.

    Args:
        city: The city's name, e.g. "Paris".
        unit: The temperature unit.
    """
    if city.lower() not in WEATHER:
        raise ValueError(f"no weather station in {city}; known: {', '.join(w.title() for w in WEATHER)}")
    degrees, sky = WEATHER[city.lower()]
    if unit == "fahrenheit":
        degrees = round(degrees * 9 / 5 + 32)
    return f"{degrees} degrees {unit}, {sky}"


@ak.tool
def convert_currency(amount: float, source: Literal["EUR", "USD", "GBP", "JPY"],
                     target: Literal["EUR", "USD", "GBP", "JPY"]) -> float:
    """Convert an amount of money between currencies at today's rate.

    Args:
        amount: How much money.
        source: The currency the amount is in.
        target: The currency to convert to.
    """
    return round(amount / RATES[source] * RATES[target], 2)


agent = ak.Agent(
    "You are a travel assistant. Call the tools to look up weather and exchange rates, then answer "
    "the user in one or two sentences using the tool results.",
    tools=[get_weather, convert_currency],
    tool_choice="required",  # the first step calls a tool; after it the model decides
    parallel_tool_calls=False,  # one call per step: a small model otherwise repeats its call
    max_steps=4,
    max_tokens=160,
)


def main(question: str = "What is the weather in Lisbon, and how much is 200 EUR in USD?") -> str:
    result = agent.run_sync(question)
    for step in result.steps:
        for call, res in zip(step.tool_calls, step.tool_results):
            print(f"step {step.index}: {call.name}({call.arguments}) -> {res.content}")
    u = result.usage
    print(f"{u.steps} steps, {u.tool_calls} tool calls, cache hit {u.cache_hit_rate:.0%}, "
          f"{u.jump_forward_tokens} of {u.completion_tokens} tokens forced by the grammar")
    return result.output


if __name__ == "__main__":
    print(main())
    agent.close()
