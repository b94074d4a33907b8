"""The engine's host time per step, by phase, as the number of running requests and their context
length grow: a tiny random-weight model (so the forward pass costs little and the host's share
shows), streaming on and stop strings set, as agent traffic runs.

Each setting runs `running` requests that share one long prompt (prefilled once, through the radix
cache) plus a few tokens of their own, to `--context` tokens, and times `--decode-steps` steps once
every request is running and before any finishes (the steady step: a request's admission and its
end, once each, are not per-step costs). The engine's phases are timed by wrapping them: schedule
(Scheduler.schedule), prepare (ModelRunner.prepare and .upload), forward (ModelRunner.forward: the model, not
host work), sample (the sampler), detokenize (Request._update_text) and process (Scheduler.process
less detokenize). Reported per step and per request per step, over the decode steps.

Targets (issue 40), same run: host time per step at 8,192-token contexts at most 1.2x that at 512,
and per request per step at 256 running at most 1.2x that at 64.

    python benchmarks/step_overhead.py [--running 64 256] [--context 512 8192] [--decode-steps 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table

import agentkv as ak
import agentkv.engine.passes as passes
from agentkv.engine.request import Request
from agentkv.engine.runner import ModelRunner
from agentkv.engine.scheduler import Scheduler
from tests.tiny import make_tiny_model

PHASES = ("schedule", "prepare", "sample", "process", "detokenize", "forward")


class Timers:
    """Wraps the engine's phases; `on` only while the decode steps are measured."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.on = self.done = False

    def wrap(self, owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)
        timers = self

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if timers.on:
                    timers.seconds[phase] += time.perf_counter() - start

        setattr(owner, name, timed)


def measure(model_dir: str, running: int, context: int, steps: int, temperature: float, timers: Timers) -> dict:
    shared = [(k * 7919) % 200 + 20 for k in range(context - 16)]  # one long prompt, as token ids
    with ak.Engine(model_dir, num_slots=context * running // 4 + running * (steps + 64) + 4096,
                   max_running_requests=running + 1, context_length=context + steps + 64) as engine:
        engine.prefill(shared)  # once: every request starts from it
        timers.done = False
        # long enough that no request finishes inside the measured steps: what is measured is the
        # steady step (admission and finishing are once per request, not per step)
        params = ak.SamplingParams(max_tokens=3 * steps + 16, temperature=temperature, seed=0, ignore_eos=True,
                                   stop=["\n\n\n\n"])
        core = engine._core

        def count_steps(inner=core.step):
            def step():
                if timers.on:
                    timers.steps += 1
                    if timers.steps > steps:
                        timers.on, timers.steps, timers.done = False, steps, True
                inner()
            return step

        core.step = count_steps()
        import asyncio

        async def one(i: int) -> None:
            ids = shared + [(i * 31 + j) % 200 + 20 for j in range(8)]
            async for _ in engine.stream(ids, params):
                if not timers.on and not timers.done and engine.stats()["running"] == running:
                    timers.seconds.clear()
                    timers.steps, timers.on = 0, True

        async def all_runs() -> None:
            await asyncio.gather(*(one(i) for i in range(running)))

        asyncio.run(all_runs())
        timers.on = False
    n = max(timers.steps, 1)
    per_step = {p: timers.seconds[p] / n * 1e3 for p in PHASES}
    per_step["process"] -= per_step["detokenize"]  # (process calls it)
    host = sum(v for p, v in per_step.items() if p != "forward")
    return {"running": running, "context": context, "steps": timers.steps, **per_step, "host": host,
            "host per request us": host / running * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[512, 8192])
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0, help="0: greedy (argmax only)")
    args = ap.parse_args()
    timers = Timers()
    timers.wrap(Scheduler, "schedule", "schedule")
    timers.wrap(ModelRunner, "prepare", "prepare")
    timers.wrap(ModelRunner, "upload", "prepare")  # host work inside forward: counted in both (forward is not host)
    timers.wrap(ModelRunner, "forward", "forward")
    timers.wrap(passes, "sample", "sample")
    timers.wrap(Request, "_update_text", "detokenize")
    timers.wrap(Scheduler, "process", "process")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_model(Path(tmp) / "m", layers=1, max_positions=max(args.context) + 256))
        for running in args.running:
            for context in args.context:
                rows.append(measure(model, running, context, args.decode_steps, args.temperature, timers))
    headers = ["running", "context", "steps", *(f"{p} ms" for p in PHASES), "host ms", "host per request us"]
    print(f"host time per decode step, by phase (a tiny random model, temperature {args.temperature}; forward is the "
          "model, not host work)")
    print(table([[r["running"], r["context"], r["steps"], *(r[p] for p in PHASES), r["host"],
                  r["host per request us"]] for r in rows], headers))
    by = {(r["running"], r["context"]): r for r in rows}
    lo, hi = min(args.context), max(args.context)
    few, many = min(args.running), max(args.running)
    for running in args.running:
        print(f"host per step, context {hi} / {lo}, {running} running: "
              f"{by[(running, hi)]['host'] / by[(running, lo)]['host']:.2f}x (target <= 1.2x)")
    for context in args.context:
        print(f"host per request per step, {many} / {few} running, context {context}: "
              f"{by[(many, context)]['host per request us'] / by[(few, context)]['host per request us']:.2f}x "
              "(target <= 1.2x)")


if __name__ == "__main__":
    main()
