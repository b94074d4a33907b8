"""The server under agent-like load: throughput and time to first token, pins on vs off vs the radix
cache off, through the official `openai` client (AsyncOpenAI) against a live `agentkv` server.

Each of `--clients` concurrent clients holds a multi-turn conversation: the same ~600-token system
prompt (instructions and tool definitions), its own question, then `--turns` - 1 follow-ups that
resend the whole conversation, streaming every reply. Between the clients' turns, unrelated long
prompts pass through a KV pool too small to keep everything, so an unpinned system prompt gets
evicted. "pins on" pins the system prompt + tools with POST /v1/pins before the load.

There is no peer server on this CPU machine (vLLM and SGLang serve on GPUs); the radix-cache-off row
is the request-at-a-time engine's behaviour (every prompt prefilled whole).

    python benchmarks/serve.py [--clients 16] [--turns 3] [--max-tokens 32] [--num-slots 12000]

`--continued` measures instead a conversation continued for 5 turns, in one run: through chat
completions re-sending the whole transcript each turn (without a hint, then with a
`prompt_cache_key`, which keeps the session's conversation pinned between turns), and through
/v1/responses sending only the new message with `previous_response_id` (the stored response keeps
its conversation pinned). The same unrelated traffic passes between turns, each way on a fresh
engine. Reported: time to first token of turn 5, and its cached share of the prompt.

    python benchmarks/serve.py --continued [--clients 8] [--max-tokens 32] [--num-slots 12000]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agents import TOOLS, other_traffic, task
from common import table

import agentkv as ak
from agentkv.server import create_app

SYSTEM = ("You are a travel agent. Answer in two sentences. You can call these tools when needed: "
          + json.dumps([t.definition for t in TOOLS]))
FOLLOW_UPS = ["And what should I pack?", "Thanks. Anything else I should know?", "Summarize in one line."]


def start_server(engine) -> tuple[str, object, threading.Thread]:
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "smollm2"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/v1", server, thread


async def conversation(client, i: int, args, ttfts: list[float], tokens: list[int], cached: list[tuple[int, int]]):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task(i)}]
    for turn in range(args.turns):
        start = time.perf_counter()
        stream = await client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        text, first = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - start
                text += chunk.choices[0].delta.content
            if chunk.usage:
                tokens.append(chunk.usage.completion_tokens)
                cached.append((chunk.usage.prompt_tokens_details.cached_tokens, chunk.usage.prompt_tokens))
        ttfts.append(first if first is not None else time.perf_counter() - start)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UPS[turn % 3]}]


async def load(base: str, args, engine) -> dict:
    import openai

    ttfts, tokens, cached = [], [], []
    async with openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600) as client:
        start = time.perf_counter()
        half = args.clients // 2
        await asyncio.gather(*(conversation(client, i, args, ttfts, tokens, cached) for i in range(half)))
        wall = time.perf_counter() - start
        await asyncio.to_thread(engine.generate, other_traffic(args.traffic), max_tokens=1)  # not timed
        start = time.perf_counter()
        await asyncio.gather(*(conversation(client, i, args, ttfts, tokens, cached)
                               for i in range(half, args.clients)))
        wall += time.perf_counter() - start
    return {"wall": wall, "tokens": sum(tokens), "ttft_p50": statistics.median(ttfts),
            "ttft_p90": statistics.quantiles(ttfts, n=10)[-1],
            "hit": sum(c for c, _ in cached) / sum(p for _, p in cached)}


def run(label: str, args, pin: bool, **options) -> list:
    with ak.Engine(num_slots=args.num_slots, **options) as engine:
        engine.generate("warm up", max_tokens=2)
        base, server, thread = start_server(engine)
        if pin:
            body = json.dumps({"model": "smollm2", "messages": [{"role": "system", "content": SYSTEM}]}).encode()
            req = urllib.request.Request(f"{base}/pins", data=body, headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req).read()
        r = asyncio.run(load(base, args, engine))
        server.should_exit = True
        thread.join(timeout=30)
    return [label, r["wall"], r["tokens"], r["tokens"] / r["wall"], r["ttft_p50"], r["ttft_p90"], f"{r['hit']:.1%}"]


async def continued_chat(client, i: int, args, engine, key: bool = False) -> tuple[float, float]:
    """(TTFT, cached share) of the last of 5 turns, each re-sending the conversation (`key`: with a
    prompt_cache_key, which keeps the session's conversation pinned between its turns)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task(i)}]
    for turn in range(5):
        start, first, text, usage = time.perf_counter(), None, "", None
        stream = await client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True},
            extra_body={"prompt_cache_key": f"conversation-{i}"} if key else None)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - start
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UPS[turn % 3]}]
        await between_turns(engine, args, i)
    return first, usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens


async def continued_responses(client, i: int, args, engine) -> tuple[float, float]:
    """The same conversation through /v1/responses: each turn sends its message and the previous id."""
    previous, text_in = None, task(i)
    for turn in range(5):
        start, first, done = time.perf_counter(), None, None
        stream = await client.responses.create(
            model="smollm2", instructions=SYSTEM, input=text_in, previous_response_id=previous,
            max_output_tokens=args.max_tokens, temperature=0, stream=True)
        async for event in stream:
            if event.type == "response.output_text.delta":
                first = first or time.perf_counter() - start
            elif event.type in ("response.completed", "response.incomplete"):
                done = event.response
        previous, text_in = done.id, FOLLOW_UPS[turn % 3]
        await between_turns(engine, args, i)
    return first, done.usage.input_tokens_details.cached_tokens / done.usage.input_tokens


async def between_turns(engine, args, i: int) -> None:
    """Unrelated prompts through the small pool: what is not pinned may be evicted (not timed)."""
    await asyncio.to_thread(engine.generate, other_traffic(args.traffic)[i % 2::2], max_tokens=1)


def run_continued(args) -> None:
    import openai

    rows = []
    keyed = functools.partial(continued_chat, key=True)
    for label, how in (("chat completions, transcript re-sent", continued_chat),
                       ("chat completions, re-sent with prompt_cache_key", keyed),
                       ("responses, previous_response_id", continued_responses)):
        # each way on an engine of its own: one way's pins (sessions, stored responses) do not hold
        # the pool the next is measured in
        with ak.Engine(num_slots=args.num_slots) as engine:
            engine.generate("warm up", max_tokens=2)
            base, server, thread = start_server(engine)

            async def phase(how=how, base=base, engine=engine) -> list:
                async with openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600) as client:
                    return await asyncio.gather(*(how(client, i, args, engine) for i in range(args.clients)))

            results = asyncio.run(phase())
            server.should_exit = True
            thread.join(timeout=30)
        ttfts = [t for t, _ in results]
        rows.append([label, statistics.median(ttfts), max(ttfts), f"{statistics.mean(h for _, h in results):.1%}"])
    for r in rows:
        r.append(r[1] / rows[0][1])
    print(
        f"{args.clients} concurrent conversations of 5 turns, {args.max_tokens} tokens per reply, greedy, "
        f"{args.traffic // 2} unrelated prompts between turns, embedded SmolLM2-135M, KV pool {args.num_slots} tokens"
    )
    print(table(rows, ["turn 5 through", "TTFT p50 s", "TTFT max s", "cached share", "TTFT / chat"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--traffic", type=int, default=16)
    ap.add_argument("--num-slots", type=int, default=12000)
    ap.add_argument("--continued", action="store_true", help="turn 5 of continued conversations: chat vs responses")
    args = ap.parse_args()
    if args.continued:
        run_continued(args)
        return
    rows = [run("pins on", args, True), run("pins off", args, False),
            run("radix cache off", args, False, enable_radix_cache=False)]
    for r in rows:
        r.append(r[1] / rows[0][1])
    print(f"{args.clients} streaming clients (two halves around unrelated traffic), {args.turns} turns each, "
          f"{args.max_tokens} tokens per reply, greedy, embedded SmolLM2-135M, KV pool {args.num_slots} tokens")
    print(table(rows, ["server", "wall s", "completion tokens", "tokens/s", "TTFT p50 s", "TTFT p90 s",
                       "cache hit", "time / pins on"]))


if __name__ == "__main__":
    main()
