"""Agents on a reasoning model: does thinking at every step cost the radix cache its hits?

A tiny random-weight model with Qwen3's chat template (tests/chat_templates.py) runs the same agent
(two tools, a typed output, tool_choice required first) with reasoning on (a `<think>` block each
step, `max_reasoning_tokens` long; a logit bias makes the random model open it, as a trained one
does by itself) and off (`enable_thinking: false`), in one process, over the same inputs and seeds.
Reported per setting: the share of prompt tokens served from the cache over every step after each
run's first (the first step's prompt is the pinned system prompt plus a new question), steps, and
tokens. What it measures is the mechanism (each step's prompt starting with the last one's, the
reasoning kept as the template keeps it), not a trained model's behaviour.

    python benchmarks/reasoning_agents.py [--runs 12] [--budget 24]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table
from pydantic import BaseModel, Field

import agentkv as ak
from tests.tiny import make_tiny_model


class Answer(BaseModel):
    total: int = Field(ge=0, le=99)


@ak.tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@ak.tool
def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def run(engine, runs: int, budget: int, thinking: bool) -> dict:
    kwargs = {} if thinking else {"enable_thinking": False}
    bias = {engine.tokenizer.token_to_id("<think>"): 100} if thinking else {}
    later_prompt = later_cached = steps = completion = reasoned = 0
    for i in range(runs):
        with ak.Agent("You do arithmetic with the tools.", tools=[add, double], output_type=Answer,
                      tool_choice="required", max_steps=4, engine=engine, temperature=1.0, seed=i, max_tokens=160,
                      max_reasoning_tokens=budget, logit_bias=bias, chat_template_kwargs=kwargs) as agent:
            try:
                result = agent.run_sync(f"What is {i} plus {2 * i}, doubled?")
            except ak.AgentRetriesError:
                continue
        for s in result.steps[1:]:
            later_prompt += s.usage.prompt_tokens
            later_cached += s.usage.cached_tokens
        steps += len(result.steps)
        completion += result.usage.completion_tokens
        reasoned += sum(s.reasoning is not None for s in result.steps)
    return {"setting": "reasoning on" if thinking else "enable_thinking: false", "steps": steps,
            "steps that reasoned": reasoned, "completion tokens": completion,
            "cache hit, steps after the first": f"{later_cached / max(later_prompt, 1):.3f}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--budget", type=int, default=24, help="max_reasoning_tokens")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = ak.Engine(str(make_tiny_model(Path(tmp) / "qwen3", chat="qwen3", max_positions=4096)),
                           num_slots=32768)
        rows = [run(engine, args.runs, args.budget, thinking) for thinking in (True, False)]
        engine.close()
    headers = list(rows[0])
    print(table([[r[h] for h in headers] for r in rows], headers))


if __name__ == "__main__":
    main()
