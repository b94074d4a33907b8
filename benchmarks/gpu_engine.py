"""End-to-end engine throughput on a GPU, each row beside the hardware's bound (benchmarks/gpu_models.py).

Models (`--models`): Llama-3-8B's and Qwen3-8B's shapes, all their layers and vocabularies, bf16, random
weights drawn on the device (`load_format="dummy"`), CUDA graphs and overlap scheduling on (the defaults).
Rows, in this order for each model (each written to `--out` as it ends, so a time limit keeps the ones before):
- decode at batch 1, 64, 16, 256: 512-token prompts prefilled first (and one decode step, which captures the
  batch's graph), then `--new-tokens` greedy tokens timed over the cached prompts. Bound: the weights and every
  sequence's KV read once a step, over the HBM bandwidth;
- prefill of 8,192 and 512 tokens (batch 1, one pass: max_step_tokens 8192). Bound: FLOPs over dense bf16 peak;
- agent sessions: a 2,048-token system prompt shared (prefilled first: a server's steady state), 64 sessions
  of a 64-token task, 3 turns of a 32-token user message and 32 new tokens. Bound: its uncached prompt tokens'
  FLOPs over the peak plus its decode steps' bytes over the bandwidth;
- greedy parity: eager (no graphs, no overlap) against graphs + overlap, batch 16, 32 tokens (first model).
"% of bound" = bound time / measured time against the part's published peaks; the copy and matmul rates
measured on the device are printed above the table.

    python benchmarks/gpu_engine.py --out $OUT/engine.md [--fused-ops] [--models llama3-8b] [--layers 8]
    python benchmarks/gpu_engine.py --smoke          # the tiny shape on CPU: the script runs (in the suite)
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table  # noqa: E402
from gpu_models import (  # noqa: E402
    NAMES,
    SHAPES,
    Shape,
    measured_peaks,
    published_peaks,
    random_prompts,
    release,
    write_shape,
)

import agentkv as ak  # noqa: E402

HEADERS = ["model", "row", "batch", "tokens", "seconds", "tok/s", "bound tok/s", "% of bound", "note"]


class Run:
    def __init__(self, args):
        self.smoke, self.args = args.smoke, args
        self.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
        self.dtype = "bfloat16" if self.device == "cuda" else "float32"
        self.bytes = 2 if self.device == "cuda" else 4
        name = torch.cuda.get_device_name() if self.device == "cuda" else "CPU"
        bandwidth, tflops = measured_peaks(self.device)
        published = published_peaks(name)
        self.bandwidth, self.tflops = published or (bandwidth, tflops)  # (GB/s, TFLOPS) the bounds use
        self.header = (f"engine throughput on {name}, {self.dtype}, greedy; bounds from "
                       f"{'the published' if published else 'the measured'} {self.bandwidth:.3g} GB/s and "
                       f"{self.tflops:.3g} TFLOPS (measured here: a copy {bandwidth:.3g} GB/s, a bf16 matmul "
                       f"{tflops:.3g} TFLOPS)")
        self.rows: list[list] = []
        self.tmp = Path(tempfile.mkdtemp())

    def add(self, row: list) -> None:
        self.rows.append(row)
        text = f"{self.header}\n\n```\n{table(self.rows, HEADERS)}\n```\n"
        print(table([row], HEADERS).splitlines()[-1], flush=True)
        if self.args.out:
            self.args.out.write_text(text)

    def engine(self, shape: str, mode: str = "graphs+overlap", **options) -> ak.Engine:
        path = write_shape(self.tmp / shape, shape, layers=self.args.layers)
        if self.device == "cuda":
            options.update(cuda_graph_max_batch=256, fused_ops=self.args.fused_ops)
            if mode == "eager":
                options.update(cuda_graphs=False, overlap_schedule=False)
        return ak.Engine(str(path), device=self.device, dtype=self.dtype, load_format="dummy",
                         max_running_requests=256, max_step_tokens=8192, **options)


def _greedy(n: int) -> ak.SamplingParams:
    return ak.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _timed(engine: ak.Engine, prompts, n: int):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = engine.generate(prompts, _greedy(n))
    return outs, time.perf_counter() - t


def decode_row(run: Run, engine: ak.Engine, model: str, s: Shape, batch: int, prompt: int, new: int) -> list:
    prompts = random_prompts(random.Random(batch), batch, prompt, s.vocab)
    engine.generate(prompts, _greedy(2))  # prefilled, cached, and this batch size's graph captured
    outs, dt = _timed(engine, prompts, new)
    made = sum(len(o.token_ids) for o in outs)
    step = s.decode_step_bytes(batch, prompt + new / 2, run.bytes) / (run.bandwidth * 1e9)
    return [NAMES[model], "decode", batch, made, f"{dt:.2f}", f"{made / dt:.0f}", f"{batch / step:.0f}",
            f"{100 * (made / dt) / (batch / step):.0f}", f"{prompt}-token prompts cached"]


def prefill_row(run: Run, engine: ak.Engine, model: str, s: Shape, tokens: int) -> list:
    rng = random.Random(tokens)
    engine.generate(random_prompts(rng, 1, tokens, s.vocab), _greedy(1))  # warm: this length's kernels compiled
    outs, dt = _timed(engine, random_prompts(rng, 1, tokens, s.vocab), 1)
    bound = s.prefill_flops(tokens) / (run.tflops * 1e12)
    return [NAMES[model], "prefill", 1, tokens, f"{dt:.3f}", f"{tokens / dt:.0f}", f"{tokens / bound:.0f}",
            f"{100 * bound / dt:.0f}", f"uncached: {outs[0].usage.prompt_tokens - outs[0].usage.cached_tokens}"]


def agent_row(run: Run, engine: ak.Engine, model: str, s: Shape, system: int, sessions: int, turns: int,
              user: int, new: int) -> list:
    rng = random.Random(7)
    head = random_prompts(rng, 1, system, s.vocab)[0]
    engine.generate([head], _greedy(1))  # the system prompt prefilled: a server's steady state
    history = [random_prompts(rng, 1, 64, s.vocab)[0] for _ in range(sessions)]
    made = prompt_tokens = cached = 0
    bound = dt = 0.0
    for _ in range(turns):
        prompts = [head + h + random_prompts(rng, 1, user, s.vocab)[0] for h in history]
        outs, t = _timed(engine, prompts, new)
        dt += t
        context = sum(len(p) for p in prompts) / sessions
        bound += (new - 1) * s.decode_step_bytes(sessions, context + new / 2, run.bytes) / (run.bandwidth * 1e9)
        for p, o in zip(prompts, outs):
            fresh = o.usage.prompt_tokens - o.usage.cached_tokens
            bound += s.prefill_flops(fresh, o.usage.cached_tokens) / (run.tflops * 1e12)
            made += len(o.token_ids)
            prompt_tokens += o.usage.prompt_tokens
            cached += o.usage.cached_tokens
        history = [p[system:] + o.token_ids for p, o in zip(prompts, outs)]
    return [NAMES[model], "agent sessions", sessions, made, f"{dt:.2f}", f"{made / dt:.0f}",
            f"{made / bound:.0f}", f"{100 * bound / dt:.0f}",
            f"{system}-token system prompt, {turns} turns; cache hit {100 * cached / prompt_tokens:.0f}%"]


def parity_row(run: Run, engine: ak.Engine, model: str, s: Shape, batch: int, new: int) -> list:
    """Graphs + overlap (`engine`) against a second engine, eager, drawing the same weights (seeded)."""
    prompts = random_prompts(random.Random(99), batch, 128, s.vocab)
    try:
        fast = [o.token_ids for o in engine.generate(prompts, _greedy(new))]
    finally:
        release(engine)  # (two 8B models do not fit beside each other's fp32 draws)
    eager = run.engine(model, "eager")
    try:
        slow = [o.token_ids for o in eager.generate(prompts, _greedy(new))]
    finally:
        release(eager)
    same = sum(a == b for a, b in zip(fast, slow))
    return [NAMES[model], "greedy parity", batch, batch * new, "", "", "", "",
            f"graphs+overlap against eager: {same}/{batch} sequences the same"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--models", default="llama3-8b,qwen3-8b")
    ap.add_argument("--layers", type=int, help="fewer layers than the shape's (a quick look)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--fused-ops", action="store_true", help="norms, activation and rotation as fused Triton ops")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    run = Run(args)
    if args.smoke:
        plan = dict(models=["smoke"], batches=(1, 4), prompt=32, prefills=(64,), agent=(48, 4, 2, 8, 8), parity=4)
        args.new_tokens = 8
    else:
        plan = dict(models=args.models.split(","), batches=(1, 64), more_batches=(16, 256), prompt=512,
                    prefills=(8192, 512), agent=(2048, 64, 3, 32, 32), parity=16)
    print(run.header, flush=True)
    for i, model in enumerate(plan["models"]):
        s = SHAPES[model]
        if args.layers:
            s = Shape(**{**s.__dict__, "layers": args.layers})
        try:
            engine = run.engine(model)
        except Exception as e:  # noqa: BLE001 - reported, the next model still runs
            run.add([NAMES[model], "load", "", "", "", "", "", "", f"{type(e).__name__}: {e}"[:120]])
            continue
        steps = [("decode", b) for b in plan["batches"]] + [("prefill", t) for t in plan["prefills"]]
        steps += [("agent", None)] + [("decode", b) for b in plan.get("more_batches", ())]
        steps += [("parity", None)] if i == 0 else []
        for kind, arg in steps:
            try:
                if kind == "decode":
                    row = decode_row(run, engine, model, s, arg, plan["prompt"], args.new_tokens)
                elif kind == "prefill":
                    row = prefill_row(run, engine, model, s, arg)
                elif kind == "agent":
                    row = agent_row(run, engine, model, s, *plan["agent"])
                else:
                    current, engine = engine, None  # (parity_row closes it)
                    row = parity_row(run, current, model, s, plan["parity"], 32)
            except Exception as e:  # noqa: BLE001
                row = [NAMES[model], kind, arg or "", "", "", "", "", "", f"{type(e).__name__}: {e}"[:120]]
            run.add(row)
        if engine is not None:
            release(engine)


if __name__ == "__main__":
    main()
