"""A travel agent with two tools on the embedded model, and a typed answer: every tool call it writes
is well-formed, because each step is generated under the grammar of the tools' schemas; the run
ends in a `TravelAnswer` (a Pydantic model) holding what the tools returned. Its system prompt and
tool definitions stay pinned in the radix cache, so every step starts from cached KV.

    agentkv run examples/agent.py --input "Weather in Lisbon, and 200 EUR in USD?"    # the live view
    python examples/agent.py                                                             # plain prints
"""

import json
from typing import Literal

from pydantic import BaseModel

import agentkv as ak

Currency = Literal["EUR", "USD", "GBP", "JPY"]

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
def convert_currency(amount: float, source: Currency, target: Currency) -> float:
    """Convert an amount of money between currencies at today's rate.

    Args:
        amount: How much money.
        source: The currency the amount is in.
        target: The currency to convert to.
    """
    return round(amount / RATES[source] * RATES[target], 2)


class Weather(BaseModel):
    city: str
    report: str


class Conversion(BaseModel):
    amount: float
    source: Currency
    target: Currency
    converted: float


class TravelAnswer(BaseModel):
    """The agent's answer, typed: the run's output is an instance of it."""

    weather: Weather | None
    money: Conversion | None


def answer(ctx: ak.RunContext) -> TravelAnswer:
    """Give the final answer once the tools have run."""
    calls = {
        c["id"]: c["function"] for m in ctx.messages if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    runs = {
        m["name"]: (json.loads(calls[m["tool_call_id"]]["arguments"]), m["content"])
        for m in ctx.messages
        if m["role"] == "tool"
    }
    weather = money = None
    if "get_weather" in runs:
        args, report = runs["get_weather"]
        weather = Weather(city=args["city"], report=report)
    if "convert_currency" in runs:
        args, converted = runs["convert_currency"]
        money = Conversion(**args, converted=float(converted))
    return TravelAnswer(weather=weather, money=money)


def each_tool_once(ctx: ak.RunContext, tools: list[ak.Tool]) -> list[ak.Tool]:
    """A step offers the tools not yet called: a small model otherwise calls one again and again."""
    called = {m["name"] for m in ctx.messages if m["role"] == "tool"}
    return [t for t in tools if t.name not in called]


agent = ak.Agent(
    "You are a travel assistant. Call the tools to look up the weather and to convert money, then "
    "answer with their results.",
    tools=[get_weather, convert_currency],
    output_type=[answer],  # an output function: the model calls it to finish, the run's output is what it returns
    prepare_tools=each_tool_once,
    tool_choice="required",  # the first step calls a tool; after it the model decides
    parallel_tool_calls=False,  # one call per step: a small model otherwise repeats its call
    max_steps=5,
    max_tokens=160,
)


def main(question: str = "What is the weather in Lisbon, and how much is 200 EUR in USD?") -> TravelAnswer:
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
