"""Decode throughput at batch 1 and 16: agentkv (overlap scheduling off and on) vs HF transformers
`generate` (left-padded batch).

Same model (the embedded SmolLM2-135M-Instruct), same dtype, greedy, a fixed number of new tokens
per sequence (the prefill of the chat-templated prompts is included on both sides). The peer runs in
a worker process of this run (see common.py), alternating with ours. Prints tok/s and the ratio.

    python benchmarks/engine_decode.py [--dtype float32|bfloat16] [--new-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Peer, hf_generate, table

import agentkv as ak

PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how photosynthesis works.",
    "What are the benefits of regular exercise?",
    "Describe the water cycle in simple terms.",
    "Give me three tips for learning a new language.",
    "Why is the sky blue?",
    "Summarize the plot of a heist movie you invent.",
    "How do vaccines train the immune system?",
]


def prompts_for(engine: ak.Engine, batch: int) -> list[list[int]]:
    return [
        engine.tokenizer.encode(engine.render([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]))
        for i in range(batch)
    ]


def run_agentkv(engine: ak.Engine, prompts: list[list[int]], new_tokens: int) -> float:
    start = time.perf_counter()
    outs = engine.generate(prompts, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batches", default="1,16")
    args = ap.parse_args()

    peer = Peer(args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    ours: dict[tuple[bool, int], list[float]] = {}
    theirs: dict[int, list[float]] = {b: [] for b in batches}
    # one engine at a time: each engine's computing thread keeps its own OpenMP pool, and two pools
    # spinning on 2 cores slow both
    for overlap in (False, True):
        engine = ak.Engine(dtype=args.dtype, enable_radix_cache=False, overlap_schedule=overlap)  # decode, not reuse
        pad = min(engine.tokenizer.eos_ids)
        for batch in batches:
            prompts = prompts_for(engine, batch)
            run_agentkv(engine, prompts, 4)  # warm up both
            peer.call(hf_generate, prompts, 4, pad)
            for _ in range(args.repeats):  # alternate, so drifts in machine speed hit both sides
                ours.setdefault((overlap, batch), []).append(run_agentkv(engine, prompts, args.new_tokens))
                theirs[batch].append(peer.call(hf_generate, prompts, args.new_tokens, pad)[0])
        engine.close()
    rows = []
    for batch in batches:
        tok = batch * args.new_tokens
        off, on, hf = min(ours[False, batch]), min(ours[True, batch]), min(theirs[batch])
        rows.append([batch, args.dtype, tok / off, tok / on, tok / hf, hf / off, off / on])
    print(f"decode throughput, {args.new_tokens} new tokens per sequence, greedy, {torch.get_num_threads()} threads")
    print(
        table(rows, ["batch", "dtype", "agentkv tok/s", "overlap tok/s", "HF tok/s", "speedup vs HF", "overlap / off"]))
    peer.close()


if __name__ == "__main__":
    main()
