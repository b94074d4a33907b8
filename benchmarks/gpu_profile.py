"""One decode step on the GPU, taken apart: what the host does, what the device does, and the gaps between.

The model is a full-size shape of benchmarks/gpu_models.py (random weights drawn on the device), its prompts
(128 tokens) prefilled and cached first, then `--steps` greedy decode steps recorded at each `--batches` size,
eager (no CUDA graphs, no overlap), with both (the default), and with both and the fused Triton ops
(fused_ops=True: norms, activation and rotation one kernel each). Two recorders run together:
- the host: agentkv.engine.trace times each phase of a step on the thread that runs it (schedule, launch,
  plan, collect and process on the engine thread; forward, masks and sample on the forward worker with
  overlap, on the engine thread without);
- the device: torch's profiler with CUDA activity only (CUPTI sees every thread's kernels): each kernel,
  copy and set, and the CUDA runtime calls (launches, synchronizations) where it reports them.
Printed per case: the step's wall time, the device's busy time in it (the union of its kernels) and its idle
share, the host phases' mean time a step, the kernels a step with the heaviest, and the runtime calls a step.

    python benchmarks/gpu_profile.py --out $OUT/profile.md [--model llama3-8b] [--batches 1,64] [--steps 24]
    python benchmarks/gpu_profile.py --smoke        # the tiny shape on CPU, host phases only (in the suite)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_models import NAMES, SHAPES, random_prompts, release, write_shape  # noqa: E402

import agentkv as ak  # noqa: E402
from agentkv.engine.trace import Span, recording  # noqa: E402

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(prof) -> list[dict]:
    """The trace's events (chrome-trace dicts) of the profiler `prof`."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return [e for e in json.load(open(f.name)).get("traceEvents", []) if e.get("ph") == "X"]


def busy_us(events: list[dict]) -> float:
    """The union of the events' intervals, in microseconds."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize(title: str, spans: list[Span], events: list[dict] | None) -> str:
    starts = sorted(s.start_ns for s in spans if s.name == "schedule")
    steps = max(1, len(starts) - 1)
    wall_ms = statistics.median(b - a for a, b in zip(starts, starts[1:])) / 1e6 if len(starts) > 2 else float("nan")
    lines = [f"### {title}", "", f"- steps recorded: {len(starts)}; wall time a step (median): {wall_ms:.3f} ms"]
    per = defaultdict(int)
    threads = defaultdict(set)
    for s in spans:
        per[s.name] += s.end_ns - s.start_ns
        threads[s.name].add(s.thread.split("_")[0])
    lines.append("- host phases, mean ms a step (thread): " + ", ".join(
        f"{name} {per[name] / steps / 1e6:.3f} ({'/'.join(sorted(threads[name]))})"
        for name in ("schedule", "launch", "plan", "forward", "masks", "sample", "collect", "process") if name in per))
    if events is None:
        lines.append("- device: none (a CPU run)")
        return "\n".join(lines) + "\n"
    work = [e for e in events if e.get("cat") in DEVICE_WORK]
    if not work:
        lines.append("- device: the profiler reported no kernels")
        return "\n".join(lines) + "\n"
    window = max(e["ts"] + e.get("dur", 0) for e in work) - min(e["ts"] for e in work)
    busy = busy_us(work)
    lines.append(f"- device busy a step: {busy / steps / 1e3:.3f} ms of the {window / steps / 1e3:.3f} ms from its "
                 f"first kernel to its last ({100 * busy / window:.0f}% busy, {100 - 100 * busy / window:.0f}% idle); "
                 f"{len(work) / steps:.0f} kernels, copies and sets a step")
    by_name = defaultdict(float)
    for e in work:
        by_name[e["name"]] += e.get("dur", 0)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    lines.append("- heaviest kernels, ms a step: " + "; ".join(f"`{n[:70]}` {d / steps / 1e3:.3f}" for n, d in top))
    runtime = defaultdict(int)
    for e in events:
        if e.get("cat") == "cuda_runtime":
            runtime[e["name"]] += 1
    if runtime:
        lines.append("- CUDA runtime calls a step: " + ", ".join(
            f"{n} {c / steps:.1f}" for n, c in sorted(runtime.items(), key=lambda kv: -kv[1])[:8]))
    return "\n".join(lines) + "\n"


def profile_case(engine: ak.Engine, batch: int, prompt: int, steps: int, vocab: int, cuda: bool):
    rng = random.Random(batch)
    prompts = random_prompts(rng, batch, prompt, vocab)
    greedy = lambda n: ak.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)  # noqa: E731
    engine.generate(prompts, greedy(3))  # prefilled, cached, this batch's graph captured, kernels compiled
    device = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if cuda
              else contextlib.nullcontext())
    if cuda:
        torch.cuda.synchronize()
    with recording() as spans, device as prof:
        engine.generate(prompts, greedy(steps))
        if cuda:
            torch.cuda.synchronize()
    return spans, (device_events(prof) if cuda else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    model = "smoke" if args.smoke else args.model
    batches = (1, 4) if args.smoke else tuple(int(b) for b in args.batches.split(","))
    path = write_shape(Path(tempfile.mkdtemp()) / model, model, layers=args.layers)
    modes = ({"eager": dict(cuda_graphs=False, overlap_schedule=False), "graphs+overlap": {},
              "graphs+overlap+fused ops": dict(fused_ops=True)} if cuda else {"cpu": {}})
    name = torch.cuda.get_device_name() if cuda else "CPU"
    text = [f"## One decode step, taken apart: {NAMES[model]}{f', {args.layers} layers' if args.layers else ''}, "
            f"on {name}\n"]
    for mode, options in modes.items():
        try:
            engine = ak.Engine(str(path), device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
                               load_format="dummy", cuda_graph_max_batch=max(batches), **options)
        except Exception as e:  # noqa: BLE001 - reported; the other mode still runs
            text.append(f"### {mode}: the engine did not load: {type(e).__name__}: {e}\n")
            continue
        try:
            for b in batches:
                try:
                    spans, events = profile_case(engine, b, 128, 8 if args.smoke else args.steps,
                                                  SHAPES[model].vocab, cuda)
                    text.append(summarize(f"{mode}, batch {b}", spans, events))
                except Exception as e:  # noqa: BLE001
                    text.append(f"### {mode}, batch {b}: {type(e).__name__}: {e}\n")
                print(text[-1], flush=True)
                if args.out:
                    args.out.write_text("\n".join(text))
        finally:
            release(engine)


if __name__ == "__main__":
    main()
