"""The KV tiers on the embedded model: time to first token of a ~2,000-token agent prompt (system +
tools) cold, from the pool, from the disk tier after an eviction, and from it after a restart; then
an agent workload whose prefixes do not fit in the pool, with and without the disk tier.

Then the ways a server ends (`--restart-rounds`): `agentkv serve --kv-dir` on the embedded model, the
prompt asked once, stopped with SIGTERM, started again on the same folder and asked again (TTFT of a
one-token request over HTTP, and whether a 16-token greedy reply is the one the first server gave);
and the prompt asked twice (a hit: written through), the server killed with SIGKILL, started again.

Time to first token is the wall time of a one-token greedy generate. Each TTFT round uses its own
prompt (a round number at its start) and its own kv_dir, so "cold" is cold; the median of the
rounds is printed. The workload: `--agents` agents, each with its own system prompt and tools
(different from their first token), take turns round-robin, `--turns` turns each, `--new-tokens`
greedy tokens a turn, on a pool of `--num-slots` slots, which holds about two agents' conversations:
without the tier each turn recomputes its agent's prefix, with it the prefix is read back. Both runs
are in this process, one after the other, each on a fresh engine and a fresh kv_dir.

    python benchmarks/kv_tiers.py [--rounds 3] [--agents 6] [--turns 4] [--new-tokens 32] [--num-slots 4096]
                                  [--restart-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table
from engine_agents import TASKS, TOOLS

import agentkv as ak


def agent_system(name: str, tools: list, repeat: int = 1) -> str:
    defs = [{"type": "function", "function": {
        "name": f"{tool}_{i}" if i else tool, "description": desc,
        "parameters": {"type": "object", "properties": {k: ({"type": "string", "enum": v} if isinstance(v, list)
                                                            else {"type": v}) for k, v in params.items()},
                       "required": list(params)}}} for i in range(repeat) for tool, desc, params in tools]
    return (f"{name}. You plan and act for the user. Keep answers short, and call a tool when it helps by "
            'writing <tool_call>{"name": ..., "arguments": ...}</tool_call>. Never invent tool results. '
            "Your tools:\n" + json.dumps(defs))


def ttft(engine: ak.Engine, messages: list[dict]) -> tuple[float, ak.RequestOutput]:
    start = time.perf_counter()
    out = engine.chat(messages, max_tokens=1, temperature=0.0)
    return time.perf_counter() - start, out


def ttft_rounds(rounds: int) -> tuple[list[list], int]:
    rows: dict[str, list[float]] = {"cold": [], "from the pool": [], "from disk, after eviction": [],
                                    "from disk, after a restart": []}
    disk_tokens, prompt_tokens = [], 0
    for r in range(rounds):
        messages = [{"role": "system", "content": agent_system(f"Round {r}: you are the travel desk's agent",
                                                                TOOLS, repeat=3)},
                    {"role": "user", "content": TASKS[r % len(TASKS)]}]
        with tempfile.TemporaryDirectory() as kv_dir:
            with ak.Engine(kv_dir=kv_dir) as engine:
                engine.generate("warm up", max_tokens=2)
                t, out = ttft(engine, messages)
                rows["cold"].append(t)
                prompt_tokens = out.usage.prompt_tokens
                rows["from the pool"].append(ttft(engine, messages)[0])
                engine.flush_cache()
                t, out = ttft(engine, messages)
                rows["from disk, after eviction"].append(t)
                disk_tokens.append(out.usage.disk_cached_tokens)
            with ak.Engine(kv_dir=kv_dir) as engine:
                engine.generate("warm up", max_tokens=2)
                t, out = ttft(engine, messages)
                rows["from disk, after a restart"].append(t)
                disk_tokens.append(out.usage.disk_cached_tokens)
    cold = statistics.median(rows["cold"])
    print(f"TTFT, a {prompt_tokens}-token agent prompt (system + tools), median of {rounds} rounds; "
          f"tokens read from disk: {sorted(set(disk_tokens))}")
    return [[name, statistics.median(ts) * 1e3, cold / statistics.median(ts)] for name, ts in rows.items()], \
        prompt_tokens


class Server:
    """`agentkv serve` on the embedded model in a process of its own, on a free loopback port."""

    def __init__(self, kv_dir: str):
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-c", "from agentkv.cli.main import app; app()", "serve",
                                      "--port", str(self.port), "--kv-dir", kv_dir],
                                     stderr=subprocess.DEVNULL)

    def ask(self, messages: list[dict], max_tokens: int) -> tuple[float, dict]:
        """(seconds, the response) of one greedy request, waiting for the server to come up first."""
        import httpx

        body = {"model": "SmolLM2-135M-Instruct", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("agentkv serve did not come up") from None
                time.sleep(0.2)
        start = time.perf_counter()
        r = httpx.post(f"http://127.0.0.1:{self.port}/v1/chat/completions", json=body, timeout=300)
        return time.perf_counter() - start, r.raise_for_status().json()

    def stop(self, sig) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)


def restart_rounds(rounds: int) -> list[list]:
    """TTFT of a prompt a server served before it ended, after a restart: by SIGTERM (asked once), by
    SIGKILL (asked twice), against the first server's cold TTFT; and whether the replies are equal."""
    import signal

    rows: dict[str, list[float]] = {"cold (server)": [], "after SIGTERM, a restart": [],
                                    "after SIGKILL (asked twice), a restart": []}
    equal, cached = [], []
    for r in range(rounds):
        messages = [{"role": "system", "content": agent_system(f"Restart {r}: you are the travel desk's agent",
                                                                TOOLS, repeat=3)},
                    {"role": "user", "content": TASKS[r % len(TASKS)]}]
        for ending in ("SIGTERM", "SIGKILL"):
            with tempfile.TemporaryDirectory() as kv_dir:
                first = Server(kv_dir)
                t, _ = first.ask(messages, 1)
                if ending == "SIGTERM":
                    rows["cold (server)"].append(t)
                _, reply = first.ask(messages, 16)  # (a hit: written through)
                if ending == "SIGKILL":
                    time.sleep(1.0)  # (the writer's few milliseconds)
                first.stop(getattr(signal, ending))
                second = Server(kv_dir)
                t, out = second.ask(messages, 1)
                rows[f"after {ending}" + (" (asked twice)" if ending == "SIGKILL" else "") + ", a restart"].append(t)
                cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
                _, again = second.ask(messages, 16)
                equal.append(again["choices"][0]["message"] == reply["choices"][0]["message"])
                second.stop(signal.SIGTERM)
    cold = statistics.median(rows["cold (server)"])
    print(f"agentkv serve --kv-dir, {rounds} rounds: cached tokens after the restarts {sorted(set(cached))}; "
          f"replies equal to the first server's: {sum(equal)} of {len(equal)}")
    return [[name, statistics.median(ts) * 1e3, cold / statistics.median(ts)] for name, ts in rows.items()]


def workload(kv_dir: str | None, agents: int, turns: int, new_tokens: int, num_slots: int):
    """Returns (wall seconds, prefill tokens computed, disk tokens read, the replies)."""
    systems = [agent_system(f"You are agent {i}, {TASKS[i % len(TASKS)].lower()}",
                            TOOLS[i % len(TOOLS):] + TOOLS[: i % len(TOOLS)], repeat=2) for i in range(agents)]
    convs = [[{"role": "system", "content": s}, {"role": "user", "content": TASKS[i % len(TASKS)]}]
             for i, s in enumerate(systems)]
    replies, disk = [], 0
    options = {"kv_dir": kv_dir} if kv_dir else {}
    with ak.Engine(num_slots=num_slots, **options) as engine:
        engine.generate("warm up", max_tokens=2)
        base = engine.stats()["prefill_tokens_computed"]
        start = time.perf_counter()
        for t in range(turns):
            for conv in convs:
                out = engine.chat(conv, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
                disk += out.usage.disk_cached_tokens
                replies.append(out.text)
                conv += [{"role": "assistant", "content": out.text}, {"role": "user", "content": "Go on."}]
        wall = time.perf_counter() - start
        computed = engine.stats()["prefill_tokens_computed"] - base
    return wall, computed, disk, replies, len(engine.tokenizer.encode(systems[0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agents", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--num-slots", type=int, default=4096)
    ap.add_argument("--restart-rounds", type=int, default=3, help="0 leaves the server restarts out")
    args = ap.parse_args()

    rows, _ = ttft_rounds(args.rounds)
    print(table(rows, ["prompt served", "TTFT ms", "x cold"]))
    print()
    if args.restart_rounds:
        print(table(restart_rounds(args.restart_rounds), ["prompt served", "TTFT ms", "x cold"]))
        print()
    without = workload(None, args.agents, args.turns, args.new_tokens, args.num_slots)
    with tempfile.TemporaryDirectory() as kv_dir:
        with_tier = workload(kv_dir, args.agents, args.turns, args.new_tokens, args.num_slots)
    same = sum(a == b for a, b in zip(without[3], with_tier[3]))
    print(f"{args.agents} agents (system prompts of ~{with_tier[4]} tokens, each its own) x {args.turns} turns "
          f"round-robin, {args.new_tokens} tokens a turn, pool of {args.num_slots} slots; replies equal: "
          f"{same} of {len(without[3])}")
    print(table([["pool only", without[0], without[1], without[2], 1.0],
                 ["pool + disk tier", with_tier[0], with_tier[1], with_tier[2], without[0] / with_tier[0]]],
                ["KV tiers", "wall s", "prefill tokens computed", "tokens read from disk", "x pool only"]))


if __name__ == "__main__":
    main()
