"""Weights kept quantized on CPU: resident weight memory and decode tok/s, in one run, for the embedded
SmolLM2-135M-Instruct Q4_1 GGUF (its embedding Q8_0):

    kept      the default: the Q4_1 / Q8_0 blocks in tiles (csrc/cpu_tiles.c), decode passes as one native
              call each (csrc/cpu_step.c), fp32 activations quantized to int8 once per normed input
    python    the same tiles, each decode pass through the Python path (`native_step=False`)
    bf16      dequantized at load to bf16 (the C bf16 linear kernel where the CPU has AVX512_BF16)
    fp32      dequantized at load to fp32 (the C fp32 kernel)
    llama.cpp the same file through llama-cpp-python, where it is installed (optional), in a process of
              its own, decoding after a one-token prompt (see _llama_cpp_best)

Greedy, a fixed number of new tokens after a short chat prompt, batch 1 and 16; the best of
`--repeats` runs each, the variants interleaved, each in a process of its own. Weight memory counts the model's parameters and
quantized blocks (not the KV pool), against the file's tensor bytes. Beside batch 1, the weight bandwidth
`kept` achieves (its weight bytes, read once a token, over its time a token: the prefill included, so a
lower bound) and the host's read bandwidth measured here (a 1 GiB fp32 tensor summed by torch's threads,
best of 5): how close decode comes to what the memory gives.

    python benchmarks/quantized_decode.py [--new-tokens 64] [--repeats 3] [--batches 1,16]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import torch

import agentkv as ak
from agentkv.engine.loader import embedded_model_path

PROMPT = "Write a short story about a robot learning to paint."


def file_tensor_bytes(path) -> int:
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


_engine = None  # the engine of a variant's process


def _start(opts: dict) -> int:
    global _engine
    _engine = ak.Engine(str(embedded_model_path()), num_slots=8192, **opts)
    return _engine.stats()["weight_bytes"]


def decode_rate(batch: int, new_tokens: int) -> float:
    engine = _engine
    ids = engine.tokenizer.encode(engine.render([{"role": "user", "content": PROMPT}]))
    start = time.perf_counter()
    outs = engine.generate([ids] * batch, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return batch * new_tokens / elapsed


def read_bandwidth() -> float:
    """Bytes a second torch's threads read from a tensor far larger than the caches, best of 5."""
    big = torch.ones(2**28)  # 1 GiB
    big.sum()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - start)
    return big.numel() * 4 / best


def llama_cpp_rate(path, batch: int, new_tokens: int, repeats: int) -> float | None:
    """llama.cpp's batch-1 decode on the same file, in a process of its own (in ours, its OpenMP
    runtime and torch's crash each other), with as many threads as ours."""
    if batch != 1 or importlib.util.find_spec("llama_cpp") is None:
        return None
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_llama_cpp_best, (str(path), new_tokens, repeats, torch.get_num_threads()))


def _llama_cpp_best(path: str, new_tokens: int, repeats: int, threads: int) -> float:
    # A one-token prompt: llama-cpp-python 0.3.36 as built on this project's machines crashes (SIGSEGV)
    # evaluating a multi-token prompt on CPU; its decode is what is compared (ours includes a
    # 40-token prefill, 2-3% of our run)
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=512, n_threads=threads, verbose=False)
    ban_eos = {llm.token_eos(): -1e9}
    llm.create_completion("Hello", max_tokens=8, temperature=0.0, logit_bias=ban_eos)  # warm up
    best = 0.0
    for _ in range(repeats):
        llm.reset()
        start = time.perf_counter()
        out = llm.create_completion("Hello", max_tokens=new_tokens, temperature=0.0, logit_bias=ban_eos)
        best = max(best, out["usage"]["completion_tokens"] / (time.perf_counter() - start))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,16")
    args = ap.parse_args()
    path = embedded_model_path()
    variants = {"kept": dict(dtype="float32"), "python": dict(dtype="float32", native_step=False),
                "bf16": dict(dtype="bfloat16", quantized_weights=False),
                "fp32": dict(dtype="float32", quantized_weights=False)}
    # each variant in a process of its own, as a user runs one engine, and called in turn: engines
    # sharing a process share its cores with one another's OpenMP threads (kept measured 1.39x of
    # bf16 that way in one run, 1.6x with each alone)
    spawn = multiprocessing.get_context("spawn")
    engines = {name: ProcessPoolExecutor(1, mp_context=spawn) for name in variants}
    weight_bytes = {name: engines[name].submit(_start, opts).result() for name, opts in variants.items()}
    tensor_bytes = file_tensor_bytes(path)
    print(f"{path.name}: {tensor_bytes / 2**20:.1f} MiB of tensors; {torch.get_num_threads()} threads")
    print(f"{'weights':8} {'MiB':>8} {'x file':>7}")
    for name, b in weight_bytes.items():
        print(f"{name:8} {b / 2**20:8.1f} {b / tensor_bytes:7.2f}")
    batches = [int(b) for b in args.batches.split(",")]
    for batch in batches:
        for e in engines.values():
            e.submit(decode_rate, batch, 8).result()  # warm up
        best = {name: 0.0 for name in engines}
        for _ in range(args.repeats):
            for name, e in engines.items():
                best[name] = max(best[name], e.submit(decode_rate, batch, args.new_tokens).result())
        peer = llama_cpp_rate(path, batch, args.new_tokens, args.repeats)
        row = "  ".join(f"{n} {r:7.1f}" for n, r in best.items())
        ratios = (f"kept/python {best['kept'] / best['python']:.2f}x  kept/bf16 {best['kept'] / best['bf16']:.2f}x  "
                  f"kept/fp32 {best['kept'] / best['fp32']:.2f}x")
        cpp = f"  llama.cpp {peer:7.1f} (kept/llama.cpp {best['kept'] / peer:.2f}x)" if peer else \
            "  llama.cpp: llama-cpp-python not installed" if batch == 1 else ""
        print(f"batch {batch:2}: tok/s {row}  {ratios}{cpp}")
        if batch == 1:
            achieved = weight_bytes["kept"] * best["kept"]
            print(f"          kept reads its weights at {achieved / 1e9:.1f} GB/s; the host reads {read_bandwidth() / 1e9:.1f} "
                  f"GB/s (a 1 GiB tensor)")
    for e in engines.values():
        e.shutdown()


if __name__ == "__main__":
    main()
