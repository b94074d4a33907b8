"""Speculative decoding (n-gram drafts) on vs off on the embedded model, batch 1, in one run.

Three workloads, each run once with `speculative="ngram"` and once without, on two engines built
the same way (the outputs must be equal: the script checks them):

- agent: benchmarks/agents.py's travel agent (four tools, a required call, then an answer from the
  tool's result, which the answer quotes), one task at a time, each task new to the engine;
- agent again: the first repeat's agent tasks asked once more (what the radix tree holds drafts the
  answers: the same question asked again);
- json edit: "return this object with one field changed" under the object's JSON schema;
- chat: plain questions whose answers repeat nothing of the prompt.

No task is run twice except in "agent again" (a warm-up run, then `--repeats` rounds of `--tasks` new
tasks), so drafts come from the request itself and from what earlier, different requests wrote.

Printed per workload (totals over the repeats): output tokens, seconds, output tok/s, forward passes
per output token, draft tokens kept / checked, and the speedup (tok/s on / off). Targets (issue 37):
>= 1.5x on agent and json edit, >= 0.95x on chat.

`--by-pass` also prints where each run's forward time went, by kind of pass: decode (one token per
request), draft (a request checks a draft), jump (computes a grammar's forced tokens), prefill; and a
decode pass under a grammar against a free one at the same context (the agent's instructions and tool
definitions, 64 tokens free, in an open JSON string, and in a regex of words; target (issue 79): <= 1.15x
the free pass).

    python benchmarks/speculative.py [--tasks 4] [--repeats 2] [--draft-tokens N] [--by-pass]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agents import INSTRUCTIONS, TOOLS, task
from common import table

import agentkv as ak
from agentkv.engine import passes

# --by-pass: per (workload, speculative) and kind of pass, [passes, seconds, tokens computed]
PASS_TIMES: dict = defaultdict(lambda: [0, 0.0, 0])
measuring = None  # the (workload, speculative) being timed, or None


def time_passes() -> None:
    """Time each forward pass (its compute and sampling) by its kind (only while `measuring`)."""
    compute = passes.PassRunner._compute

    def timed(self, p):
        start = time.perf_counter()
        out = compute(self, p)
        if measuring is not None:
            b, n = p.batch, sum(p.batch.extend_lens)
            kind = ("draft" if b.drafts else "decode" if n == len(b.reqs)
                    else "jump" if b.num_decodes + b.num_jumps == len(b.reqs) else "prefill")
            t = PASS_TIMES[(*measuring, kind)]
            t[0], t[1], t[2] = t[0] + 1, t[1] + time.perf_counter() - start, t[2] + n
        return out

    passes.PassRunner._compute = timed

RECORDS = [
    {"id": "ord-20931", "customer": "Marta Silva", "email": "marta.silva@example.com", "city": "Lisbon",
     "items": [{"sku": "BK-1142", "title": "The Name of the Rose", "qty": 1, "price": 14.9},
               {"sku": "BK-2210", "title": "Invisible Cities", "qty": 2, "price": 11.5}],
     "status": "paid", "notes": "leave the parcel with the neighbour at number 12"},
    {"id": "usr-7781", "name": "Kenji Watanabe", "role": "editor", "team": "travel desk", "timezone": "Asia/Tokyo",
     "languages": ["ja", "en", "fr"], "active": True, "manager": "usr-1002",
     "bio": "Writes the weekly city guides and checks every hotel review before it is published"},
    {"id": "evt-5520", "title": "Quarterly planning", "room": "Atlas 3", "start": "2026-04-14T09:30:00",
     "end": "2026-04-14T11:00:00", "attendees": ["ana@example.com", "li@example.com", "omar@example.com"],
     "agenda": "budget review, hiring plan for the support team, the new booking flow"},
]
EDITS = [["set status to shipped", "change the city to Porto", "set the quantity of Invisible Cities to 3",
          "make the email marta@example.org"],
         ["make the role admin", "set active to false", "change the timezone to Europe/Paris",
          "move him to the news desk team"],
         ["move it to room Orion 1", "start it at 10:00 instead", "add budget approval to the agenda",
          "rename it to Planning, second quarter"]]
CHAT = ["Give me three tips for sleeping well on a long flight.",
        "Why is the sky blue? Answer in two sentences.",
        "Write a short poem about autumn in the mountains.",
        "What are the pros and cons of working from home?",
        "How do I make a simple tomato sauce?",
        "Explain what a black hole is to a ten-year-old.",
        "Suggest a name for a small bakery by the sea.",
        "What should I know before adopting a cat?",
        "Describe a quiet morning in a busy city.",
        "List four ways to save water at home.",
        "Why do leaves change colour in autumn?",
        "Give me a short pep talk before an exam."]


def schema_of(record: dict) -> dict:
    def of(v):
        if isinstance(v, bool):
            return {"type": "boolean"}
        if isinstance(v, int):
            return {"type": "integer"}
        if isinstance(v, float):
            return {"type": "number"}
        if isinstance(v, str):
            return {"type": "string"}
        if isinstance(v, list):
            return {"type": "array", "items": of(v[0])}
        return {"type": "object", "properties": {k: of(x) for k, x in v.items()}, "required": list(v),
                "additionalProperties": False}
    return of(record)


def agent_runs(engine, tasks: range) -> tuple[list, int, int]:
    agent = ak.Agent(INSTRUCTIONS, tools=TOOLS, engine=engine, tool_choice="required", max_steps=2, max_tokens=96,
                     parallel_tool_calls=False)
    outs, tokens, passes = [], 0, 0
    with agent:
        for i in tasks:
            r = agent.run_sync(task(i))
            outs.append([s.text for s in r.steps])
            tokens += sum(s.usage.completion_tokens for s in r.steps)
            passes += sum(s.usage.forward_passes for s in r.steps)
    return outs, tokens, passes


def json_runs(engine, tasks: range) -> tuple[list, int, int]:
    outs, tokens, passes = [], 0, 0
    for i in tasks:
        record, edit = RECORDS[i % len(RECORDS)], EDITS[i % len(RECORDS)][i // len(RECORDS) % 4]
        ask = [{"role": "user", "content": f"Here is a JSON object:\n{json.dumps(record)}\n\nReturn this object "
                                           f"with one field changed: {edit}. Keep every other field as it is."}]
        out = engine.generate(engine.render(ask), json_schema=schema_of(record), temperature=0.0, max_tokens=256)
        outs.append(out.text)
        tokens += out.usage.completion_tokens
        passes += out.usage.forward_passes
    return outs, tokens, passes


def chat_runs(engine, tasks: range) -> tuple[list, int, int]:
    outs, tokens, passes = [], 0, 0
    for i in tasks:
        out = engine.generate(engine.render([{"role": "user", "content": CHAT[i % len(CHAT)]}]), temperature=0.0,
                              max_tokens=128)
        outs.append(out.text)
        tokens += out.usage.completion_tokens
        passes += out.usage.forward_passes
    return outs, tokens, passes


SAME_CONTEXT = {  # --by-pass: decode passes at the same context, free and under a grammar
    "free": {"ignore_eos": True},
    "json string": {"json_schema": {"type": "object", "properties": {"description": {"type": "string"}},
                                    "required": ["description"]}},
    # (64 words at least, cut at max_tokens: as many passes as the free run, so the first pass, which takes
    # the prompt's last token exactly, weighs the same in each row)
    "regex words": {"regex": r"([a-z]+ ){64,}", "budget_closing": False},
}


def same_context(engine, repeats: int) -> list[list]:
    """Per SAME_CONTEXT case: decode passes (ms of compute and sampling each) and the whole step (ms of
    wall time a forward pass, the engine loop's host work included), in turn, `repeats` rounds."""
    global measuring
    system = INSTRUCTIONS + "\n\nTools:\n" + json.dumps([t.definition for t in TOOLS])  # (~500 tokens, as the agent's)
    prompt = engine.render([{"role": "system", "content": system},
                            {"role": "user", "content": "Describe Lisbon for a traveller in one long paragraph."}])
    wall: dict = defaultdict(lambda: [0, 0.0])
    for case, kw in SAME_CONTEXT.items():
        engine.generate(prompt, temperature=0.0, max_tokens=8, **{**kw, "budget_closing": False})  # warm
    for _ in range(repeats):
        for case, kw in SAME_CONTEXT.items():
            measuring = ("same context", case)
            start = time.perf_counter()
            out = engine.generate(prompt, temperature=0.0, max_tokens=64, **kw)
            wall[case][0] += out.usage.forward_passes
            wall[case][1] += time.perf_counter() - start
            measuring = None
    rows = []
    for case in SAME_CONTEXT:
        n, sec, _ = PASS_TIMES[("same context", case, "decode")]
        free_n, free_sec, _ = PASS_TIMES[("same context", "free", "decode")]
        steps = wall[case][1] / wall[case][0]
        rows.append([case, n, 1000 * sec / n, (sec / n) / (free_sec / free_n), 1000 * steps,
                     steps / (wall["free"][1] / wall["free"][0])])
    return rows


WORKLOADS = {"agent": agent_runs, "agent again": agent_runs, "json edit": json_runs, "chat": chat_runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4, help="runs per workload and repeat")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats (each of new tasks; totals are printed)")
    ap.add_argument("--draft-tokens", type=int, default=None, help="Engine(speculative_tokens=...): the longest draft")
    ap.add_argument("--by-pass", action="store_true", help="time the forward passes by kind")
    args = ap.parse_args()
    global measuring
    if args.by_pass:
        time_passes()
    more = {"speculative_tokens": args.draft_tokens} if args.draft_tokens else {}
    engines = {None: ak.Engine(), "ngram": ak.Engine(speculative="ngram", **more)}
    rows, summary = [], []
    for name, run in WORKLOADS.items():
        result = {}
        for spec, engine in engines.items():
            if name != "agent again":
                run(engine, range(1))  # warm: compile the grammars, cache the system prompt
            seconds, outs, tokens, passes, stats0 = 0.0, [], 0, 0, engine.stats()
            for rep in range(args.repeats):
                first = 1 if name == "agent again" else 1 + rep * args.tasks
                measuring = (name, spec or "off")
                start = time.perf_counter()
                o, t, p = run(engine, range(first, first + args.tasks))
                seconds += time.perf_counter() - start
                measuring = None
                outs, tokens, passes = outs + o, tokens + t, passes + p
            st = engine.stats()
            drafted = st["draft_tokens"] - stats0["draft_tokens"]
            kept = st["accepted_draft_tokens"] - stats0["accepted_draft_tokens"]
            result[spec] = (outs, tokens, passes, seconds, drafted, kept)
        assert result[None][0] == result["ngram"][0], f"{name}: outputs differ with speculation on"
        for spec in (None, "ngram"):
            outs, tokens, passes, seconds, drafted, kept = result[spec]
            rows.append([name, spec or "off", tokens, seconds, tokens / seconds, passes / tokens, f"{kept}/{drafted}"])
        speedup = (result["ngram"][1] / result["ngram"][3]) / (result[None][1] / result[None][3])
        summary.append(f"{name}: {speedup:.2f}x output tok/s with speculation on")
    if args.by_pass:
        same = same_context(engines[None], args.repeats * 2)
    for engine in engines.values():
        engine.close()
    print(f"speculative decoding on the embedded model, batch 1, {args.repeats} x {args.tasks} runs per workload "
          f"(outputs equal on and off)")
    print(table(rows, ["workload", "speculative", "output tokens", "seconds", "tok/s", "passes per token",
                       "drafts kept/checked"]))
    print("\n".join(summary))
    print("targets: >= 1.5x on agent and json edit, >= 0.95x on chat")
    if args.by_pass:
        print("\nforward passes by kind (totals over the repeats; seconds of compute and sampling)")
        print(
            table(
                [
                    [w, spec, kind, n, sec, toks, 1000 * sec / n]
                    for (w, spec, kind), (n, sec, toks) in PASS_TIMES.items()
                ],
                ["workload", "speculative", "pass", "passes", "seconds", "tokens computed", "ms per pass"],
            )
        )
        print("\na decode pass under a grammar against a free one at the same context (the agent's instructions and "
              "tools, up to 64 tokens)")
        print(table(same, ["grammar", "decode passes", "ms per pass", "x free", "ms per step (wall)", "x free"]))
        print("target: a constrained decode pass <= 1.15x a free one")


if __name__ == "__main__":
    main()
