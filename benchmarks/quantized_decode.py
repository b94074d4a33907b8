"""Weights kept quantized on CPU: resident weight memory and decode tok/s, in one run, for the embedded
SmolLM2-135M-Instruct Q4_1 GGUF (its embedding Q8_0):

    kept      the default: the Q4_1 / Q8_0 blocks in tiles (csrc/cpu_tiles.c), decode passes as one native
              call each (csrc/cpu_step.c), fp32 activations quantized to int8 once per normed input
    python    the same tiles, each decode pass through the Python path (`native_step=False`)
    bf16      dequantized at load to bf16 (the C bf16 linear kernel where the CPU has AVX512_BF16)
    fp32      dequantized at load to fp32 (the C fp32 kernel)
    llama.cpp the same file through llama-cpp-python, where it is installed (optional), in a process of
              its own (llama_cpp_peer.py): batch 1 after a one-token prompt, batch 16 as 16 sequences
              of one llama_batch a step, and a prompt evaluated from an empty context

Greedy, a fixed number of new tokens after a short chat prompt already in the radix cache (decode
alone), batch 1 and 16, the prefill of a `--prompt-tokens` prompt, and (`--extend`) an agent turn's
prompt: new tokens after a prefix already cached (kept and llama.cpp, each with its own prefix reuse;
beside ours the FLOPs a second of its products, against the cores' fp32 FMA peak that
csrc/cpu_peak.c measures); the best
of `--repeats` runs each, the variants interleaved (and, for decode, llama.cpp's runs between ours),
each in a process of its own. Weight memory
counts the model's parameters and quantized blocks (not the KV pool), against the file's tensor
bytes. Beside batch 1, the weight bandwidth `kept` achieves (its weight bytes, read once a token,
over its time a token: the engine's own work between steps included, so a lower bound) and the
host's read bandwidth measured here (a 1 GiB fp32 tensor summed by torch's threads, best of 5): how
close decode comes to what the memory gives.

    python benchmarks/quantized_decode.py [--new-tokens 64] [--repeats 3] [--batches 1,16] [--prompt-tokens 256]
                                          [--extend 400,51] [--model FILE.gguf] [--busy N] [--variants kept,...]
                                          (variants: kept, python, bf16, fp32, bf16prompt)

A file larger than the cache (weights that every token reads from memory): benchmarks/random_gguf.py
writes one.

With `--busy N`, N processes spin (`python -c "while 1: pass"`) beside the timed runs, ours and llama.cpp's
alike: a machine busy with other work.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_peer
from common import busy_processes

import agentkv as ak
from agentkv.engine.loader import embedded_model_path

PROMPT = "Write a short story about a robot learning to paint."
TOOL_RESULT = '{"city": "Paris", "temperature_c": 18.5, "conditions": "light rain", "wind_kmh": 12} '


def file_tensor_bytes(path) -> int:
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


def unread_share(path) -> float:
    """The share of the file's tensor bytes a token does not read: a mixture of experts' unchosen experts, and
    the tables a token reads one row of (an embedding beside its own output projection, Gemma 4's per-layer
    table)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    names = {t.name for t in reader.tensors}
    unread = sum(int(t.n_bytes) for t in reader.tensors if t.name == "per_layer_token_embd.weight" or
                 t.name == "token_embd.weight" and "output.weight" in names)
    count, used = (reader.fields.get(f"{arch}.{k}") for k in ("expert_count", "expert_used_count"))
    if count is not None and used is not None:
        experts = sum(int(t.n_bytes) for t in reader.tensors if "_exps." in t.name)
        unread += experts * (1 - used.contents() / count.contents())
    return unread / sum(int(t.n_bytes) for t in reader.tensors)


_engine = None  # the engine of a variant's process


def _start(path: str, opts: dict) -> int:
    global _engine
    _engine = ak.Engine(path, num_slots=8192, **opts)
    return _engine.stats()["weight_bytes"]


def _prompt(engine) -> str:
    """The chat prompt, or the plain text for a file without a chat template."""
    if engine.tokenizer.chat_template:
        return engine.render([{"role": "user", "content": PROMPT}])
    return PROMPT


def decode_rate(batch: int, new_tokens: int) -> float:
    """Decode tok/s after the prompt is in the radix cache (its last token aside), as llama.cpp's runs
    decode after a one-token prompt: the prompt's prefill is timed apart (prompt_rate)."""
    engine = _engine
    ids = engine.tokenizer.encode(_prompt(engine))
    engine.generate([ids], max_tokens=1, temperature=0.0)  # the prompt cached
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


def prompt_rate(tokens: int, repeats: int) -> float:
    """Prefill tok/s of a prompt of `tokens` tokens that shares no prefix with any before it."""
    engine = _engine
    base = engine.tokenizer.encode(PROMPT * (tokens // 8 + 1))
    best = 0.0
    for r in range(repeats + 1):  # (the first one warms up)
        ids = engine.tokenizer.encode(f"{r} {time.time()}")[:4] + base  # a new prefix: nothing cached
        ids = ids[:tokens]
        start = time.perf_counter()
        engine.generate([ids], max_tokens=1, temperature=0.0)
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def extend_rate(prefix_tokens: int, new_tokens: int, repeats: int) -> tuple[float, float]:
    """tok/s of `new_tokens` prompt tokens after a `prefix_tokens` prompt already in the radix cache (an
    agent's next turn: a tool result after its conversation), best of `repeats`; and the FLOPs of that
    pass's products (every linear for each new token, the vocabulary for the last one)."""
    engine = _engine
    prefix_ids, new_ids = _extend_ids(prefix_tokens, new_tokens)
    best = 0.0
    for r in range(repeats + 1):  # (the first one warms up)
        head = engine.tokenizer.encode(f"{r} {time.time()}")[:4]  # a new prefix each time, then cached
        engine.generate([head + prefix_ids], max_tokens=1, temperature=0.0)
        start = time.perf_counter()
        engine.generate([head + prefix_ids + new_ids], max_tokens=1, temperature=0.0)
        best = max(best, new_tokens / (time.perf_counter() - start))
    return best, 2.0 * (new_tokens * _elements("linears") + _elements("vocabulary"))


def _extend_ids(prefix_tokens: int, new_tokens: int) -> tuple[list[int], list[int]]:
    tok = _engine.tokenizer
    prefix = tok.encode(PROMPT * (prefix_tokens // 8 + 1))[:prefix_tokens]
    new = tok.encode(TOOL_RESULT * (new_tokens // 8 + 1))[:new_tokens]
    return prefix, new


def _elements(which: str) -> int:
    """Weights of the model's linears (`linears`) or of its vocabulary projection (`vocabulary`)."""
    from agentkv.engine.linear import Linear, LogitsProjection

    kind = Linear if which == "linears" else LogitsProjection
    total = 0
    for m in _engine._core.runner.model.modules():
        if isinstance(m, kind):
            w = getattr(m, "quantized", None) or m.weight
            total += w.in_features * w.out_features if hasattr(w, "in_features") else w.numel()
    return total


def fma_peak() -> float:
    from agentkv.kernels import cpu_native

    return cpu_native.load().fma_peak()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--extend", default="400,51",
                    help="PREFIX,NEW: NEW prompt tokens after PREFIX ones already cached (0,0: none)")
    ap.add_argument("--model", help="a GGUF file (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning beside the timed runs (a busy machine)")
    ap.add_argument("--variants", default="kept,python,bf16,fp32",
                    help="which of ours to run (kept always; a 1-2B file's fp32 copy takes 7 GB and minutes)")
    args = ap.parse_args()
    path = Path(args.model) if args.model else embedded_model_path()
    variants = {"kept": dict(dtype="float32"), "python": dict(dtype="float32", native_step=False),
                "bf16": dict(dtype="bfloat16", quantized_weights=False),
                "fp32": dict(dtype="float32", quantized_weights=False),
                # the opt-in bf16 body for a prompt's exact rows (AVX512_BF16; decode unchanged)
                "bf16prompt": dict(dtype="float32", prompt_precision="bfloat16")}
    variants = {k: v for k, v in variants.items() if k == "kept" or k in args.variants.split(",")}
    # each variant in a process of its own, as a user runs one engine, and called in turn: engines
    # sharing a process share its cores with one another's OpenMP threads (kept measured 1.39x of
    # bf16 that way in one run, 1.6x with each alone)
    spawn = multiprocessing.get_context("spawn")
    engines = {name: ProcessPoolExecutor(1, mp_context=spawn) for name in variants}
    weight_bytes = {name: engines[name].submit(_start, str(path), opts).result() for name, opts in variants.items()}
    tensor_bytes = file_tensor_bytes(path)
    print(f"{path.name}: {tensor_bytes / 2**20:.1f} MiB of tensors; {torch.get_num_threads()} threads"
          + (f"; beside {args.busy} busy processes" if args.busy else ""))
    with busy_processes(args.busy):
        measure(args, path, engines, weight_bytes, tensor_bytes)
    for e in engines.values():
        e.shutdown()


def measure(args, path, engines, weight_bytes, tensor_bytes) -> None:
    print(f"llama.cpp: batch 1 on {llama_cpp_peer.build_of(llama_cpp_peer.decode_rate)}; batch 16 and the prompt on "
          f"{llama_cpp_peer.build_of(llama_cpp_peer.prompt_rate)}")
    print(f"{'weights':8} {'MiB':>8} {'x file':>7}")
    for name, b in weight_bytes.items():
        print(f"{name:8} {b / 2**20:8.1f} {b / tensor_bytes:7.2f}")
    batches = [int(b) for b in args.batches.split(",")]
    for batch in batches:
        for e in engines.values():
            e.submit(decode_rate, batch, 8).result()  # warm up
        best = {name: 0.0 for name in engines}
        threads, peer = torch.get_num_threads(), None
        for _ in range(args.repeats):  # ours and llama.cpp's alternate: a shared host's swings fall on both
            for name, e in engines.items():
                best[name] = max(best[name], e.submit(decode_rate, batch, args.new_tokens).result())
            one = (
                llama_cpp_peer.call(llama_cpp_peer.decode_rate, str(path), args.new_tokens, 1, threads)
                if batch == 1
                else llama_cpp_peer.call(llama_cpp_peer.batched_rate, str(path), batch, args.new_tokens, 1, threads)
            )
            peer = one if peer is None else peer if one is None else max(peer, one)
        row = "  ".join(f"{n} {r:7.1f}" for n, r in best.items())
        ratios = "  ".join(f"kept/{n} {best['kept'] / best[n]:.2f}x" for n in best if n != "kept")
        print(f"batch {batch:2}: tok/s {row}  {ratios}  {_peer(peer, best['kept'])}")
        if batch == 1:  # (the weights a token reads: a mixture's chosen experts, a table's row)
            achieved = weight_bytes["kept"] * (1 - unread_share(path)) * best["kept"]
            print(
                f"          kept reads the weights a token uses at {achieved / 1e9:.1f} GB/s; "
                f"the host reads {read_bandwidth() / 1e9:.1f} "
                f"GB/s (a 1 GiB tensor)"
            )
    ours = engines["kept"].submit(prompt_rate, args.prompt_tokens, args.repeats).result()
    ids = engines["kept"].submit(_prompt_ids, args.prompt_tokens).result()
    peer = llama_cpp_peer.call(llama_cpp_peer.prompt_rate, str(path), ids, args.repeats, torch.get_num_threads())
    print(f"prompt of {args.prompt_tokens}: tok/s kept {ours:7.1f}  {_peer(peer, ours)}")
    if "bf16prompt" in engines:  # the opt-in bf16 body beside the exact one
        rate = engines["bf16prompt"].submit(prompt_rate, args.prompt_tokens, args.repeats).result()
        print(f"prompt of {args.prompt_tokens}: tok/s bf16prompt {rate:7.1f} ({rate / ours:.2f}x kept)  "
              f"{_peer(peer, rate, 'bf16prompt')}")
    prefix_tokens, new_tokens = (int(v) for v in args.extend.split(","))
    if new_tokens:
        kept = engines["kept"]
        ours, flops = kept.submit(extend_rate, prefix_tokens, new_tokens, args.repeats).result()
        peak = kept.submit(fma_peak).result()
        prefix_ids, new_ids = kept.submit(_extend_ids, prefix_tokens, new_tokens).result()
        peer = llama_cpp_peer.call(llama_cpp_peer.extend_rate, str(path), prefix_ids, new_ids, args.repeats,
                                   torch.get_num_threads())
        achieved = flops * ours / new_tokens
        print(f"{new_tokens} new tokens after {prefix_tokens} cached: tok/s kept {ours:7.1f} "
              f"({new_tokens / ours * 1e3:.1f} ms; its products {achieved / 1e9:.0f} GFLOP/s, "
              f"{achieved / peak:.0%} of the cores' fp32 FMA peak, {peak / 1e9:.0f})  {_peer(peer, ours)}")
        if "bf16prompt" in engines:
            rate, _ = engines["bf16prompt"].submit(extend_rate, prefix_tokens, new_tokens, args.repeats).result()
            print(f"{new_tokens} new tokens after {prefix_tokens} cached: tok/s bf16prompt {rate:7.1f} "
                  f"({new_tokens / rate * 1e3:.1f} ms, {rate / ours:.2f}x kept)  {_peer(peer, rate, 'bf16prompt')}")


def _prompt_ids(tokens: int) -> list[int]:
    return _engine.tokenizer.encode(PROMPT * (tokens // 8 + 1))[:tokens]


def _peer(rate: float | None, ours: float, name: str = "kept") -> str:
    if rate is None:
        return "llama.cpp: " + ("its process died (see llama_cpp_peer.py)" if llama_cpp_peer.available()
                                else "llama-cpp-python not installed")
    return f"llama.cpp {rate:7.1f} ({name}/llama.cpp {ours / rate:.2f}x)"


if __name__ == "__main__":
    main()
