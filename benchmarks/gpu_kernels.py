"""Attention kernels on a GPU: the Triton and FlashInfer backends checked against the torch backend
(slot gather + torch SDPA), and all timed (a backend that cannot run says why in its column); Triton's decode
twice: its stage 1 a program per KV head's group (the default with GQA) and a program per query head.

Shapes are Llama-3-8B's attention (32 query heads, 8 KV heads, head size 128), bf16. Decode: batch
1 / 16 / 64 at 1k and 8k context. Extend: one 2k-token prompt, and 8 requests of 512 new tokens
after a 2k cached prefix each. Prints markdown tables (and writes them to --out).

    python benchmarks/gpu_kernels.py --out $OUT/kernels.md
    python benchmarks/gpu_kernels.py --sweep --out $OUT/sweep.md    # the grouped decode's launch options
    TRITON_INTERPRET=1 python benchmarks/gpu_kernels.py --smoke    # tiny shapes on CPU: the script runs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402

from agentkv.kernels import get_backend  # noqa: E402
from agentkv.kernels.base import AttentionMetadata  # noqa: E402


def make_batch(lens, exts, H, KVH, D, dtype, device, seed=0):
    """Random caches, a slot table with shuffled slots, the new tokens' q/k/v and the metadata."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(lens) + 1
    k_cache = torch.randn(total, KVH, D, generator=g).to(dtype).to(device)
    v_cache = torch.randn(total, KVH, D, generator=g).to(dtype).to(device)
    perm = torch.randperm(total - 1, generator=g) + 1
    table_ = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    at = 0
    for i, n in enumerate(lens):
        table_[i, :n] = perm[at:at + n]
        at += n
    T = sum(exts)
    q = torch.randn(T, H, D, generator=g).to(dtype).to(device)
    k = torch.randn(T, KVH, D, generator=g).to(dtype).to(device)
    v = torch.randn(T, KVH, D, generator=g).to(dtype).to(device)
    table_ = table_.to(device)
    out_loc = torch.cat([table_[i, n - e:n] for i, (n, e) in enumerate(zip(lens, exts))])
    decodes = len(exts) if all(e == 1 for e in exts) else 0
    meta = AttentionMetadata(table_, torch.arange(len(lens), device=device), list(lens), list(exts), decodes, out_loc)
    return meta, q, k, v, k_cache, v_cache


def clock(fn, iters: int, device) -> float:
    """Milliseconds per call (CUDA events on a GPU)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / iters
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) * 1e3 / iters


def run_case(name, lens, exts, H, KVH, D, dtype, device, iters):
    meta, q, k, v, kc, vc = make_batch(lens, exts, H, KVH, D, dtype, device)
    scale = D ** -0.5
    outs, times = {}, {}
    for backend_name in ("torch", "triton", "triton per-head", "flashinfer"):
        try:
            backend = get_backend(backend_name.split()[0])
            if backend_name == "triton per-head":  # decode's stage 1 a program per query head
                backend.decode_grouped = False
            backend.prepare(meta)
            outs[backend_name] = backend.forward(q, k, v, kc, vc, scale).float()
            times[backend_name] = f"{clock(lambda b=backend: b.forward(q, k, v, kc, vc, scale), iters, device):.3f}"
        except Exception as e:  # noqa: BLE001 - reported in the table, the other backends still run
            times[backend_name] = f"{type(e).__name__}: {e}"[:60]
    errs = [f"{(outs[n] - outs['torch']).abs().max().item():.2e}" if n in outs else "-"
            for n in ("triton", "flashinfer")]
    return [name, *errs, times["torch"], times["triton"], times["triton per-head"], times["flashinfer"]]


def sweep(smoke: bool, device: str) -> str:
    """Triton's grouped decode over a small space of tile widths, warps, pipeline stages and split counts (the
    default's and 4x it), against the default: the data for choosing the defaults on the device."""
    from agentkv.kernels.triton_decode import decode_attention, split_count

    if smoke:
        H, KVH, D, dtype, iters, cases = 4, 2, 32, torch.float32, 1, [("decode b2 ctx40", 2, 40)]
        space = [(16, 4, 1), (32, 4, 1)]
    else:
        H, KVH, D, dtype, iters = 32, 8, 128, torch.bfloat16, 20
        cases = [(f"decode b{b} ctx{c}", b, c) for c in (8192, 1024) for b in (1, 64)]
        space = [(n, w, st) for n in (32, 64) for w in (4, 8) for st in (2, 3)]
    rows = []
    for name, b, c in cases:
        meta, q, _, _, kc, vc = make_batch([c] * b, [1] * b, H, KVH, D, dtype, device)
        lens = torch.tensor([c] * b, device=device)
        base = split_count(b * KVH, c, 32, torch.device(device))
        ref = decode_attention(q, kc, vc, meta.req_to_token, meta.req_rows, lens, c, D**-0.5).float()
        timed = []
        for block_n, warps, stages in space:
            for splits in sorted({base, 4 * base}):
                run = lambda: decode_attention(q, kc, vc, meta.req_to_token, meta.req_rows, lens, c,  # noqa: E731
                                               D**-0.5, num_splits=splits, block_n=block_n,
                                               launch=dict(num_warps=warps, num_stages=stages))
                try:
                    err = (run().float() - ref).abs().max().item()
                    timed.append([name, block_n, warps, stages, splits, f"{clock(run, iters, device):.4f}",
                                  f"{err:.1e}"])
                except Exception as e:  # noqa: BLE001 - reported, the other points still run
                    timed.append([name, block_n, warps, stages, splits, f"{type(e).__name__}: {e}"[:60], ""])
        best = min((r for r in timed if r[6]), key=lambda r: float(r[5]), default=None)
        rows += [r + (["best"] if r is best else [""]) for r in timed]
    return ("grouped decode sweep, ms per layer call (default: block_n 32, num_warps 4, Triton's stages, "
            "split_count's splits)\n\n```\n" + table(rows, ["case", "block_n", "warps", "stages", "splits", "ms",
                                                            "max err vs default", ""]) + "\n```\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--sweep", action="store_true", help="the grouped decode's launch space instead")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.sweep:
        text = sweep(args.smoke, device)
        print(text)
        if args.out:
            args.out.write_text(text)
        return
    if args.smoke:
        H, KVH, D, dtype, iters = 4, 2, 32, torch.float32, 1
        cases = [("decode b2 ctx40", [40, 23], [1, 1]), ("extend 1x24", [24], [24]),
                 ("extend 2x8 after 16", [24, 24], [8, 8])]
    else:
        H, KVH, D, dtype, iters = 32, 8, 128, torch.bfloat16, 20
        cases = [(f"decode b{b} ctx{c}", [c] * b, [1] * b) for c in (1024, 8192) for b in (1, 16, 64)]
        cases += [("extend 1x2048", [2048], [2048]), ("extend 8x512 after 2048", [2560] * 8, [512] * 8)]
    rows = [run_case(name, lens, exts, H, KVH, D, dtype, device, iters) for name, lens, exts in cases]
    head = f"attention kernels, {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}), " \
           f"H={H} KVH={KVH} D={D} {str(dtype).removeprefix('torch.')}, ms per layer call"
    text = head + "\n\n```\n" + table(rows, ["case", "max err triton", "max err flashinfer", "torch ms",
                                             "triton ms", "triton per-head ms", "flashinfer ms"]) + "\n```\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
