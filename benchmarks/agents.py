"""Agents with tools on the embedded model: pins on vs off vs the radix cache off vs HF `generate`.

16 agents x 3 steps: one ak.Agent (a 600-token system prompt with four tool definitions) runs 16
user tasks with `run_batch`: step 1 must call a tool (greedy), step 2 answers from the result (or
calls another tool); step 3 answers the user's follow-up question, continuing the conversation
(`history=`) with tools offered but not required. Then other traffic (unrelated long prompts)
passes through a KV pool too small to keep everything, and a second wave of 16 new tasks runs: that
is when a pin matters, since an unpinned system prompt is evicted like any other leaf.

The peer replays the same loop through HF transformers `generate`, in a worker process of this run
(see common.py): each step's prompts, exactly as our agents rendered them (tool results included),
as one left-padded batch per step and wave, generating as many tokens as the longest of our replies
at that step (HF has no grammar, so every forced token of a tool call is a forward pass there too).

    python benchmarks/agents.py [--agents 16] [--num-slots 12000] [--skip-hf]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Peer, hf_generate, table

import agentkv as ak

CITIES = ["Paris", "Lisbon", "Oslo", "Tokyo", "Lima", "Cairo", "Quito", "Seoul"]


@ak.tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Current weather and a 3-day forecast for a city.

    Args:
        city: The city's name.
        unit: The temperature unit.
    """
    return f"{len(city) * 3} degrees {unit}, clear; tomorrow light rain"


@ak.tool
def convert_currency(
    amount: float, source: Literal["EUR", "USD", "GBP", "JPY"], target: Literal["EUR", "USD", "GBP", "JPY"]) -> float:
    """Convert an amount between currencies at today's rate."""
    return round(amount * 1.07, 2)


@ak.tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights between two cities on a date (YYYY-MM-DD); returns the cheapest."""
    return f"{origin}-{destination} on {date}: 212 EUR, 2 h 40 min"


@ak.tool
def book_hotel(city: str, nights: int, max_price: float) -> str:
    """Book a hotel in a city for some nights under a price per night."""
    return f"booked 'Hotel Central' in {city} for {nights} nights at {max_price * 0.8:.0f} per night"


TOOLS = [get_weather, convert_currency, search_flights, book_hotel]
INSTRUCTIONS = ("You are a travel agent. Use the tools to look up weather, prices, flights and hotels, "
                "one call at a time, then answer the traveller in two sentences with the facts you found.")


def task(i: int) -> str:
    a, b = CITIES[i % len(CITIES)], CITIES[(i * 3 + 1 + i // len(CITIES)) % len(CITIES)]
    return [f"I fly from {a} to {b} on 2026-03-{10 + i % 18}. What weather should I expect there?",
            f"Find me a flight from {a} to {b} on 2026-04-0{1 + i % 9} and a hotel for 3 nights.",
            f"How much is {100 + 25 * i} EUR in JPY, and is it warm in {b}?",
            f"Book 2 nights in {b} under 150 per night and tell me the weather."][i % 4]


def other_traffic(n: int) -> list[str]:
    return [f"Document {k}: " + " ".join(f"line {k}.{j} of an unrelated report about logistics" for j in range(120))
            for k in range(n)]


FOLLOW_UP = "Thanks. In one sentence: what should I pack?"


def make_agent(engine, pin: bool, tool_choice: str = "required") -> ak.Agent:
    return ak.Agent(INSTRUCTIONS, tools=TOOLS, engine=engine, tool_choice=tool_choice, max_steps=3, max_tokens=96,
                    parallel_tool_calls=False, pin=pin)


def wave(first: ak.Agent, follow: ak.Agent, tasks: list[str]) -> list[ak.AgentResult]:
    """Each task, then a follow-up turn on its conversation; returns the runs, both turns merged."""
    runs = first.run_batch_sync(tasks)

    async def follow_ups():
        return await asyncio.gather(*(follow.run(FOLLOW_UP, history=r.messages) for r in runs))

    return [_merge(a, b) for a, b in zip(runs, asyncio.run(follow_ups()))]


def _merge(a: ak.AgentResult, b: ak.AgentResult) -> ak.AgentResult:
    usage = ak.AgentUsage(**{k: getattr(a.usage, k) + getattr(b.usage, k) for k in vars(a.usage)})
    return ak.AgentResult(b.output, a.steps + b.steps, usage, b.messages)


def run_config(label: str, compiler, args, pin: bool = True, **engine_options) -> dict:
    with ak.Engine(num_slots=args.num_slots, **engine_options) as engine:
        engine.grammar_compiler = compiler  # grammars compiled before the timed runs
        engine.generate("warm up", max_tokens=2)
        agent, follow = make_agent(engine, pin), make_agent(engine, pin, tool_choice="auto")
        start = time.perf_counter()
        waves = [wave(agent, follow, [task(i) for i in range(args.agents)])]
        wall = time.perf_counter() - start
        engine.generate(other_traffic(args.traffic), max_tokens=1)  # not timed
        start = time.perf_counter()
        waves.append(wave(agent, follow, [task(i) for i in range(args.agents, 2 * args.agents)]))
        wall += time.perf_counter() - start
        agent.close()
        follow.close()
        st = engine.stats()
    runs = [r for w in waves for r in w]
    prompt = sum(r.usage.prompt_tokens for r in runs)
    cached = sum(r.usage.cached_tokens for r in runs)
    wave2 = waves[1]
    return {"label": label, "wall": wall, "steps": sum(r.usage.steps for r in runs),
            "jumped": sum(r.usage.jump_forward_tokens for r in runs),
            "calls": sum(r.usage.tool_calls for r in runs), "hit": cached / prompt,
            "hit2": sum(r.usage.cached_tokens for r in wave2) / sum(r.usage.prompt_tokens for r in wave2),
            "prefill": st["prefill_tokens_computed"], "passes": sum(r.usage.forward_passes for r in runs),
            "tokens": sum(r.usage.completion_tokens for r in runs), "waves": waves, "engine": engine}


def replay_hf(peer: Peer, engine, waves, pad: int) -> tuple[float, int]:
    """The same steps through HF generate: per wave and step index, one batch of the prompts."""
    wall = computed = 0
    for runs in waves:
        for k in range(max(len(r.steps) for r in runs)):
            prompts, longest = [], 0
            for r in runs:
                if k < len(r.steps):
                    prompts.append(engine.tokenizer.encode(engine.render(_messages_before(r, k))))
                    longest = max(longest, r.steps[k].usage.completion_tokens)
            if prompts:
                seconds, _ = peer.call(hf_generate, prompts, longest, pad)
                wall += seconds
                computed += sum(len(p) for p in prompts)
    return wall, computed


def _messages_before(result, k: int) -> list[dict]:
    """The conversation the agent rendered for step k (0-based): up to its k-th assistant message."""
    seen = 0
    for i, m in enumerate(result.messages):
        if m["role"] == "assistant":
            if seen == k:
                return result.messages[:i]
            seen += 1
    raise ValueError(f"no step {k}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--traffic", type=int, default=16, help="unrelated prompts between the two waves")
    ap.add_argument("--num-slots", type=int, default=12000, help="KV pool size in tokens (small enough to evict)")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()

    with ak.Engine() as warm:  # compile the step grammars once, shared by every configuration
        agent = make_agent(warm, pin=False)
        agent.run_sync(task(0))
        compiler = warm.grammar_compiler
        system_tokens = len(warm.tokenizer.encode(warm.render([agent.system_message], add_generation_prompt=False)))

    results = [run_config("agentkv, pinned prompt", compiler, args),
               run_config("agentkv, no pin", compiler, args, pin=False),
               run_config("agentkv, radix cache off", compiler, args, pin=False, enable_radix_cache=False)]
    ours = results[0]["wall"]
    rows = [
        [r["label"], r["wall"], r["steps"], r["calls"], r["tokens"], r["jumped"], r["passes"], r["prefill"],
         f"{r['hit']:.1%}", f"{r['hit2']:.1%}", r["wall"] / ours]
        for r in results
    ]
    if not args.skip_hf:
        peer = Peer()
        pad = sorted(results[0]["engine"].tokenizer.eos_ids)[0]
        peer.call(hf_generate, [[1, 2, 3]], 2, pad)  # warm up
        wall, computed = replay_hf(peer, results[0]["engine"], results[0]["waves"], pad)
        peer.close()
        rows.append(
            ["HF generate, batch per step", wall, results[0]["steps"], "-", "-", "-", "-", computed, "0.0%", "0.0%",
             wall / ours]
        )
    print("wall s: the two waves of agents (the traffic between them is not timed)")
    print(
        f"{args.agents} agents x 2 waves, 3+ steps each (a tool call, its answer, a follow-up turn), system prompt "
        f"{system_tokens} tokens with {len(TOOLS)} tools, {args.traffic} unrelated prompts between the waves, "
        f"KV pool {args.num_slots} tokens, greedy, fp32"
    )
    print(
        table(
            rows,
            ["system", "wall s", "steps", "tool calls", "completion tokens", "jump-forward tokens", "forward passes",
             "prefill tokens computed", "cache hit", "cache hit, wave 2", "time / pinned"],
        )
    )


if __name__ == "__main__":
    main()
