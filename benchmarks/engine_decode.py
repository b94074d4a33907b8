"""Decode throughput at batch 1 and 16: agentkv vs HF transformers `generate` (left-padded batch).

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
    return [engine.tokenizer.encode(engine.render([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])) for i in range(batch)]


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

    engine = ak.Engine(dtype=args.dtype, enable_radix_cache=False)  # no cache: measure decode, not reuse
    peer = Peer(args.dtype)
    pad = min(engine.tokenizer.eos_ids)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = prompts_for(engine, batch)
        run_agentkv(engine, prompts, 4)  # warm up both
        peer.call(hf_generate, prompts, 4, pad)
        ours, theirs = [], []
        for _ in range(args.repeats):  # alternate, so drifts in machine speed hit both sides
            ours.append(run_agentkv(engine, prompts, args.new_tokens))
            theirs.append(peer.call(hf_generate, prompts, args.new_tokens, pad)[0])
        tok = batch * args.new_tokens
        rows.append([batch, args.dtype, tok / min(ours), tok / min(theirs), min(theirs) / min(ours)])
    print(f"decode throughput, {args.new_tokens} new tokens per sequence, greedy, {torch.get_num_threads()} threads")
    print(table(rows, ["batch", "dtype", "agentkv tok/s", "HF tok/s", "speedup"]))
    peer.close()
    engine.close()


if __name__ == "__main__":
    main()
