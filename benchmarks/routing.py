"""Cache-aware routing vs round-robin over engine replicas (2 by default), on a multi-tenant agent workload.

Several tenants (distinct system prompts with tool definitions), several conversations each, several
turns per conversation. By default each conversation is a client that sends its next turn when the
previous answer arrives (closed loop, the shape of a multi-turn chat benchmark: requests arrive one by
one, interleaved as the replicas answer); `--arrival waves` sends every conversation's turn k at once
instead. Each replica's KV pool holds about half of the tenants' prompts, as when a deployment scales
out because one engine's memory is not enough: with round-robin every replica must hold every tenant
and the LRU cache thrashes; with cache-aware routing each tenant's conversations stay where their
prefix is. Outputs are constrained to ASCII words so a conversation's history re-tokenizes to exactly
what the replica cached. Closed-loop figures move from run to run (arrival order depends on timing).

Beside the two policies, each run prints the hit rate no routing can beat on its own requests
(`best_hit_rate`: every prompt served from one cache of unbounded memory that holds every earlier
request whole, its output too), and that ceiling over round-robin's hit rate: the largest hit-rate
ratio any routing policy could show on that workload.

    python benchmarks/routing.py [--tenants 16] [--conversations 2] [--turns 8] [--slot-share 0.7] [--replicas 2]
                                 [--arrival closed-loop|waves] [--model DIR]

Without --model, a tiny random-weight Llama with a byte-level tokenizer (one token per character):
the cache counts do not depend on the weights.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table  # noqa: E402

import agentkv as ak  # noqa: E402
from agentkv.server.cluster import CacheAwareRouter, PrefixTree  # noqa: E402

WORDS = "search fetch weather flight hotel email invoice order refund ticket calendar meeting report".split()


def system_prompt(tenant: int, chars: int, rng: random.Random) -> str:
    tools = []
    while sum(map(len, tools)) < chars:
        name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{len(tools)}"
        args = ", ".join(f'"{rng.choice(WORDS)}": "string"' for _ in range(3))
        tools.append(f'{{"name": "{name}", "parameters": {{{args}}}}}\n')
    return f"You are agent {tenant}. Call one of these tools when it helps:\n" + "".join(tools)


def best_hit_rate(requests: list[tuple[str, str]]) -> float:
    """The hit rate no routing can beat on `requests` ((prompt, prompt + output) in the order they
    were sent): each prompt's longest prefix shared with an earlier request's whole text counts as
    cached, as in one engine of unbounded memory that had finished every earlier request; the last
    token of a prompt is always computed (its logits give the first output token). Counted in
    characters: tokens of the default model's byte-level tokenizer (with --model, an estimate)."""
    seen = PrefixTree(max_chars_per_replica=sum(len(whole) for _, whole in requests) + 1)  # (never trims)
    cached = total = 0
    for prompt, whole in requests:
        cached += min(seen.match(prompt).get("all", 0), len(prompt) - 1)
        total += len(prompt)
        seen.insert(whole, "all")
    return cached / total if total else 0.0


class Recorder:
    """Wraps a policy: every request it routes, as (prompt, prompt + output) in the order sent."""

    def __init__(self, policy):
        self.policy, self.requests = policy, []

    def route(self, text: str) -> str:
        self.requests.append([text, text])
        return self.policy.route(text)

    def answered(self, text: str, whole: str) -> None:
        for entry in reversed(self.requests):  # (the latest request with this prompt)
            if entry[0] == text:
                entry[1] = whole
                return

    def started(self, replica: str) -> None:
        self.policy.started(replica)

    def finished(self, replica: str) -> None:
        self.policy.finished(replica)


class RoundRobin:
    def __init__(self, replicas: list[str]):
        self.replicas, self.i = replicas, 0

    def route(self, text: str) -> str:
        self.i += 1
        return self.replicas[self.i % len(self.replicas)]

    def started(self, replica: str) -> None: ...

    def finished(self, replica: str) -> None: ...


def user_turn(turn: int, rng: random.Random) -> str:
    return f"\nUser (turn {turn}): please {rng.choice(WORDS)} the {rng.choice(WORDS)}.\nAgent: "


def waves(args, router, engines, params, histories) -> None:
    """Every conversation takes turn k at once: one wave of concurrent requests per turn."""
    names, rng = list(engines), random.Random(1)
    with ThreadPoolExecutor(len(names)) as pool:
        for turn in range(args.turns):
            texts = {k: h + user_turn(turn, rng) for k, h in histories.items()}
            routed: dict[str, list] = {n: [] for n in names}
            for k in rng.sample(sorted(texts), len(texts)):  # conversations arrive interleaved
                replica = router.route(texts[k])
                router.started(replica)
                routed[replica].append(k)

            def serve(replica: str) -> list:
                keys = routed[replica]
                return list(zip(keys, engines[replica].generate([texts[k] for k in keys], params) if keys else []))

            for replica, done in zip(names, pool.map(serve, names)):
                for k, out in done:
                    router.finished(replica)
                    router.answered(texts[k], texts[k] + out.text)
                    histories[k] = texts[k] + out.text


def closed_loop(args, router, engines, params, histories) -> None:
    """Each conversation is a client that sends its next turn when the previous answer arrives, so
    requests arrive one by one, interleaved as the replicas answer (a multi-turn chat benchmark's shape)."""
    lock = threading.Lock()

    def client(k, seed: int) -> None:
        rng = random.Random(seed)
        time.sleep(rng.random() * 0.5)  # clients do not start in lockstep
        for turn in range(args.turns):
            text = histories[k] + user_turn(turn, rng)
            with lock:
                replica = router.route(text)
                router.started(replica)
            out = engines[replica].generate(text, params)
            with lock:
                router.finished(replica)
                router.answered(text, text + out.text)
            histories[k] = text + out.text

    keys = sorted(histories)
    with ThreadPoolExecutor(len(keys)) as pool:
        list(pool.map(client, keys, range(len(keys))))


def run(policy_name: str, args, model: str, systems: list[str]) -> list:
    names = [f"replica-{i}" for i in range(args.replicas)]
    slots = int(args.slot_share * sum(len(s) for s in systems))
    engines = {n: ak.Engine(model, num_slots=slots, max_running_requests=64) for n in names}
    router = Recorder(CacheAwareRouter(names) if policy_name == "cache-aware" else RoundRobin(names))
    params = ak.SamplingParams(temperature=0.0, max_tokens=args.new_tokens, regex=f"[a-z ]{{{args.new_tokens}}}")
    histories = {(t, c): systems[t] for t in range(len(systems)) for c in range(args.conversations)}
    start = time.perf_counter()
    (closed_loop if args.arrival == "closed-loop" else waves)(args, router, engines, params, histories)
    wall = time.perf_counter() - start
    stats = [e.stats() for e in engines.values()]
    for e in engines.values():
        e.close()
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_prompt_tokens"] for s in stats)
    computed = sum(s["prefill_tokens_computed"] for s in stats)
    return [policy_name, prompt, cached, computed, cached / prompt, best_hit_rate(router.requests), wall]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-chars", type=int, default=1500)
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--slot-share", type=float, default=0.7,
                    help="KV slots per replica, as a share of the tokens of all system prompts together")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--arrival", choices=["closed-loop", "waves"], default="closed-loop",
                    help="closed-loop: each conversation sends its next turn when answered; "
                         "waves: all at once per turn")
    ap.add_argument("--model", help="an HF model directory (default: a tiny random-weight model)")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from tests.tiny import make_tiny_model

        model = str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", max_positions=8192))
    rng = random.Random(0)
    systems = [system_prompt(t, args.system_chars, rng) for t in range(args.tenants)]
    rows = [run(name, args, model, systems) for name in ("round-robin", "cache-aware")]
    rr, ca = rows
    print(
        f"{args.tenants} tenants x {args.conversations} conversations x {args.turns} turns "
        f"over {args.replicas} replicas "
        f"({args.arrival}), "
        f"system prompts ~{args.system_chars} chars, KV slots per replica {args.slot_share:.0%} of all system prompts"
    )
    print(table(rows, ["policy", "prompt tokens", "cached", "prefill computed", "hit rate", "best possible", "wall s"]))
    print(f"\ncache-aware / round-robin: hit rate {ca[4] / rr[4]:.2f}x, prefill computed {ca[3] / rr[3]:.2f}x")
    print(f"best possible / round-robin: hit rate {rr[5] / rr[4]:.2f}x (the most any routing could show here); "
          f"cache-aware reached {ca[4] / ca[5]:.0%} of its best possible")


if __name__ == "__main__":
    main()
