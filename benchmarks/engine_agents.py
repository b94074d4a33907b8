"""Agents sharing a system prompt: agentkv vs agentkv with the radix cache off vs llama.cpp reusing the
prefix each prompt shares with the one before (llama_cpp_peer.py, where llama-cpp-python is installed)
vs HF `generate`.

8 agents x 4 turns. Every agent has the same ~800-token system prompt with tool definitions and its
own task; each turn appends the agent's previous reply and a new user message, and generates 48
tokens greedily. agentkv runs the 8 agents of a turn as one concurrent batch; HF transformers runs
the same prompts one call at a time, as a request-at-a-time library is used. The peer runs in a
worker process of this run (see common.py). Prints wall time, prefill tokens computed, cache hit
rate and the ratios.

With `--busy N`, N processes spin beside the whole run (`python -c "while 1: pass"`): every side shares
the machine with them.

    python benchmarks/engine_agents.py [--agents 8] [--turns 4] [--new-tokens 48] [--skip-hf] [--skip-llama-cpp]
                                       [--busy N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_peer
import torch
from common import Peer, busy_processes, hf_generate, table

import agentkv as ak

TOOLS = [
    ("get_weather", "Current weather and a 3-day forecast for a city.", {"city": "string", "unit": ["C", "F"]}),
    ("search_web", "Search the web and return the top results with snippets.",
     {"query": "string", "max_results": "integer"}),
    ("read_calendar", "List calendar events between two dates.", {"start_date": "string", "end_date": "string"}),
    ("create_event", "Create a calendar event with attendees.",
     {"title": "string", "start": "string", "attendees": "array"}),
    ("send_email", "Send an email to one or more recipients.", {"to": "array", "subject": "string", "body": "string"}),
    ("lookup_contact", "Find a contact's email and phone by name.", {"name": "string"}),
    ("convert_currency", "Convert an amount between two currencies at today's rate.",
     {"amount": "number", "from": "string", "to": "string"}),
    ("book_flight", "Search and hold a flight between two airports.",
     {"origin": "string", "destination": "string", "date": "string"}),
    ("translate_text", "Translate text into a target language.", {"text": "string", "target_language": "string"}),
]
TASKS = [
    "Plan a weekend trip to Lisbon for two people on a modest budget.",
    "Find a time next week to meet with Dana and Omar about the launch.",
    "Summarize today's top three technology news stories.",
    "Convert 250 euros to Japanese yen and explain the rate.",
    "Draft a polite email declining a meeting invitation.",
    "Check whether I need an umbrella in Oslo tomorrow.",
    "Translate a short welcome message into Spanish and German.",
    "Compute the compound interest on 1000 dollars at 5 percent for 10 years.",
]
FOLLOW_UPS = ["Good. What is the next step?", "Please go on, and be specific.", "Now wrap it up in a short summary."]


def system_prompt() -> str:
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": desc,
                "parameters": {
                    "type": "object",
                    "properties": {
                        k: ({"type": "string", "enum": v} if isinstance(v, list) else {"type": v})
                        for k, v in params.items()
                    },
                    "required": list(params),
                },
            },
        }
        for name, desc, params in TOOLS
    ]
    return (
        "You are a capable assistant that plans and acts on behalf of the user. Think step by step, keep "
        'answers short, and call a tool when it helps by writing <tool_call>{"name": ..., "arguments": ...}'
        "</tool_call>. Never invent tool results. You can use these tools:\n" + json.dumps(tools)
    )


def run_agentkv(engine: ak.Engine, agents: int, turns: int, new_tokens: int) -> tuple[float, list[list[list[int]]]]:
    """Returns the wall time and the prompts (token ids) of every turn, for the other runs to replay."""
    convs = [
        [{"role": "system", "content": system_prompt()}, {"role": "user", "content": TASKS[i % len(TASKS)]}]
        for i in range(agents)
    ]
    prompts_per_turn = []
    start = time.perf_counter()
    for t in range(turns):
        prompts = [engine.tokenizer.encode(engine.render(c)) for c in convs]
        prompts_per_turn.append(prompts)
        outs = engine.generate(prompts, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        for c, o in zip(convs, outs):
            c.append({"role": "assistant", "content": o.text})
            c.append({"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]})
    return time.perf_counter() - start, prompts_per_turn


def replay_agentkv(engine: ak.Engine, prompts_per_turn, new_tokens: int) -> float:
    start = time.perf_counter()
    for prompts in prompts_per_turn:
        engine.generate(prompts, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return time.perf_counter() - start


def _common(a: list[int], b: list[int]) -> int:
    """Tokens two prompts share at their start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--skip-hf", action="store_true", help="leave out the (slow) HF run")
    ap.add_argument("--skip-llama-cpp", action="store_true", help="leave out llama.cpp (llama_cpp_peer.py)")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning beside the whole run (a busy machine)")
    args = ap.parse_args()
    with busy_processes(args.busy):
        run(args)


def run(args) -> None:
    rows = []
    with ak.Engine() as engine:
        engine.generate("warm up", max_tokens=2)
        base = engine.stats()
        wall, prompts_per_turn = run_agentkv(engine, args.agents, args.turns, args.new_tokens)
        st = engine.stats()
        computed = st["prefill_tokens_computed"] - base["prefill_tokens_computed"]
        prompt_tokens = st["prompt_tokens"] - base["prompt_tokens"]
        hit = (st["cached_prompt_tokens"] - base["cached_prompt_tokens"]) / prompt_tokens
        rows.append(["agentkv", wall, computed, hit])
    sys_tokens = len(engine.tokenizer.encode(system_prompt()))

    with ak.Engine(enable_radix_cache=False) as engine:
        engine.generate("warm up", max_tokens=2)
        base = engine.stats()["prefill_tokens_computed"]
        wall_off = replay_agentkv(engine, prompts_per_turn, args.new_tokens)
        rows.append(["agentkv, cache off", wall_off, engine.stats()["prefill_tokens_computed"] - base, 0.0])

    if not args.skip_llama_cpp:
        from agentkv.engine.loader import embedded_model_path

        wall_cpp = llama_cpp_peer.call(llama_cpp_peer.agents_wall, str(embedded_model_path()), prompts_per_turn,
                                       args.new_tokens, torch.get_num_threads())
        if wall_cpp is not None:
            flat = [p for ps in prompts_per_turn for p in ps]
            computed = sum(len(p) - _common(a, p) for a, p in zip([[]] + flat, flat))
            reused = 1 - computed / sum(len(p) for p in flat)
            rows.append(["llama.cpp, prefix reuse", wall_cpp, computed, reused])
            print(f"llama.cpp on {llama_cpp_peer.build_of(llama_cpp_peer.agents_wall)}")
        else:
            print("llama.cpp: " + ("its process died (see llama_cpp_peer.py)" if llama_cpp_peer.available()
                                   else "llama-cpp-python not installed"))

    if not args.skip_hf:
        peer = Peer()
        pad = 2
        peer.call(hf_generate, [[1, 2, 3]], 2, pad)  # warm up
        hf_wall = sum(
            peer.call(hf_generate, [p], args.new_tokens, pad)[0] for prompts in prompts_per_turn for p in prompts)
        rows.append(["HF generate, sequential", hf_wall, sum(len(p) for ps in prompts_per_turn for p in ps), 0.0])
        peer.close()

    print(
        f"{args.agents} agents x {args.turns} turns, system prompt {sys_tokens} tokens, "
        f"{args.new_tokens} new tokens per turn, greedy, fp32"
        + (f"; beside {args.busy} busy processes" if args.busy else "")
    )
    ours = rows[0][1]
    print(table([[name, wall, comp, f"{hit:.1%}", wall / ours] for name, wall, comp, hit in rows],
                ["system", "wall s", "prefill tokens computed", "cache hit rate", "time / agentkv"]))


if __name__ == "__main__":
    main()
