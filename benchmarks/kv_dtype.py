"""The KV pool's dtype on CPU: fp32 against bf16 KV under the same fp32 activations (the embedded Q4_1
model, weights in tiles, the native decode step), decode tok/s at a long context.

Each variant runs in a process of its own, called in turn, best of `--repeats`. A prompt of
`--context` tokens is cached first (its prefill is not timed), then `--new-tokens` greedy tokens are
decoded for `--batches` copies of it: at 2k tokens a step's attention reads as many bytes of fp32 KV
as the step reads of weights, and bf16 halves them. Also printed: the pool's bytes a token, and how
many of the greedy outputs are the same tokens with both dtypes (bf16 KV rounds K and V to 8 bits of
mantissa, so a near-tie may go the other way).

    python benchmarks/kv_dtype.py [--context 2048] [--new-tokens 64] [--batches 1,16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

import agentkv as ak

_engine = None  # the engine of a variant's process


def _start(kv_dtype: str) -> int:
    global _engine
    _engine = ak.Engine(num_slots=40_000, kv_dtype=kv_dtype)
    st = _engine.stats()
    return st["kv_bytes"] // (st["total_slots"] + 1)


def _prompt(context: int, i: int) -> list[int]:
    text = " ".join(f"Note {j}: the agent read record {j * 7 % 101} and kept its summary." for j in range(context))
    return _engine.tokenizer.encode(f"Batch row {i}. " + text)[:context]


def decode(context: int, batch: int, new_tokens: int) -> tuple[float, list[list[int]]]:
    """tok/s decoding `batch` prompts of `context` tokens each (cached first), and the outputs."""
    prompts = [_prompt(context, i) for i in range(batch)]
    _engine.generate(prompts, max_tokens=1, temperature=0.0)  # cached
    start = time.perf_counter()
    outs = _engine.generate(prompts, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return batch * new_tokens / (time.perf_counter() - start), [o.token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spawn = multiprocessing.get_context("spawn")
    variants = ("float32", "bfloat16")
    procs = {v: ProcessPoolExecutor(1, mp_context=spawn) for v in variants}
    per_token = {v: procs[v].submit(_start, v).result() for v in variants}
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        best, outs = {v: 0.0 for v in variants}, {}
        for v in variants:
            procs[v].submit(decode, args.context, batch, 4).result()  # warm up
        for _ in range(args.repeats):
            for v in variants:
                rate, outs[v] = procs[v].submit(decode, args.context, batch, args.new_tokens).result()
                best[v] = max(best[v], rate)
        same = sum(a == b for a, b in zip(outs["float32"], outs["bfloat16"]))
        rows.append([batch, best["float32"], best["bfloat16"], best["bfloat16"] / best["float32"], f"{same}/{batch}"])
    print(f"embedded Q4_1 model, {args.context}-token context, {args.new_tokens} new tokens, best of {args.repeats}; "
          f"KV bytes a token: fp32 {per_token['float32']}, bf16 {per_token['bfloat16']}")
    print(table(rows, ["batch", "fp32 KV tok/s", "bf16 KV tok/s", "bf16 / fp32", "same greedy outputs"]))
    for p in procs.values():
        p.shutdown()


if __name__ == "__main__":
    main()
