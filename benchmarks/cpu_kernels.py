"""agentkv's C kernels for CPU against the torch ops they replace, with memory as in a decode step.

A step reads every layer's weights and K/V once, so neither is in cache when a layer gets to it. Each
timing here therefore walks 30 layers of distinct tensors (the embedded model's shapes), like a step,
and the two sides alternate so drifts in machine speed hit both:

- linears: the 4 linears of each of 30 layers (qkv, o, gate_up, down) through csrc/cpu_linear.c
  against oneDNN's packed kernel (what the engine ran before) and a plain matmul, at several row counts;
- decode attention: 16 requests (and one with a long context, whose keys the kernel splits across
  threads) through the cpu backend against the torch backend (gather + SDPA), a linear between
  layers as in a step;
- extend attention: one request's new tokens after a cached prefix, the C kernel's tiles as a prompt's
  tokens (the body whose lanes are queries) and as written ones (the cpu
  backend, which takes every token) against SDPA (the torch backend);
- with `--quantized`: the linears of 8 layers of a 1B-class model (2048 wide, 5632 MLP: widths every GGUF
  type's blocks divide) kept in each quantized type the C kernels multiply (random blocks), row-major
  (csrc/cpu_quant.c's types) and in tiles (csrc/cpu_tiles.c, cpu_ktiles.c, where the CPU has AVX-512
  VNNI or AVX2), the tiles also with x in fp32 (`exact`: a prompt's rows), against the same shapes in
  the C bf16 kernel, and each one's bytes; then the embedded model's linears of one batch-1 decode step,
  kept in its file's Q4_1 / Q8_0 blocks, against bf16; and the exact product (a prompt's rows) of each
  type at `--exact-rows` rows against the cores' fp32 FMA peak (csrc/cpu_peak.c) and against each weight
  dequantized and multiplied by torch.

    python benchmarks/cpu_kernels.py [--dtype bfloat16|float32] [--rows 1,16,64,550] [--quantized]
                                     [--exact-rows 1,16,51,128,512]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table  # noqa: E402

from agentkv.engine.linear import _pack, _packed_linear  # noqa: E402
from agentkv.kernels import cpu_native, cpu_quant, get_backend  # noqa: E402
from agentkv.kernels.base import AttentionMetadata  # noqa: E402

LAYERS = 30
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # [in, out] of qkv, o, gate_up, down
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def best(fns: dict, rounds: int) -> dict:
    """The fastest of `rounds` alternating runs of each function (seconds)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(ts) for name, ts in times.items()}


def linears(kernels, dtype, rows_list) -> list:
    layers = []
    for _ in range(LAYERS):
        for k, n in SHAPES:
            w = (torch.randn(k, n) * 0.05).to(dtype)
            layers.append((k, w, _pack(w.t()), kernels.pack_linear(w) if dtype in kernels.linear_dtypes else None))
    out = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k).to(dtype) for k, _ in SHAPES}
        fns = {"onednn": lambda: [_packed_linear(xs[k], p, None, None) for k, w, p, q in layers],
               "plain": lambda: [xs[k] @ w for k, w, p, q in layers]}
        if layers[0][3] is not None:
            fns["agentkv"] = lambda: [kernels.linear(xs[k], q) for k, w, p, q in layers]
        t = best(fns, 5)
        ours = t.get("agentkv", float("nan"))
        out.append([rows, ours * 1e3, t["onednn"] * 1e3, t["plain"] * 1e3, t["onednn"] / ours])
    return out


QUANT_LAYERS = 8
QUANT_SHAPES = [(2048, 2560), (2048, 2048), (2048, 11264), (5632, 2048)]  # [in, out]: qkv (GQA), o, gate_up, down


def quant_blocks(name: str, n: int, k: int, rng) -> cpu_quant.QuantWeight:
    """A random [n, k] weight quantized to a GGUF type by the `gguf` package (not a K-quant: it cannot
    make those)."""
    import gguf
    import numpy as np

    raw = gguf.quants.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32),
                               getattr(gguf.GGMLQuantizationType, name))
    return cpu_quant.QuantWeight(torch.from_numpy(np.ascontiguousarray(raw)), cpu_quant.QUANT_TYPES[name][0], k, n)


def quantized_linears(kernels, rows_list) -> list:
    """ms for QUANT_LAYERS layers' linears per type (random blocks of each; the bf16 kernel's packed
    weights as the reference), and the weights' MiB."""
    import gguf
    import numpy as np

    # random blocks with sane scales of the types the gguf package cannot make
    from tests.kernels.test_quant_kernels import K_QUANTS, k_blocks

    rng = np.random.default_rng(0)
    sets, exact = {}, set()
    for name, (code, block, size) in cpu_quant.QUANT_TYPES.items():
        kind = getattr(gguf.GGMLQuantizationType, name)
        ws = []
        for _ in range(QUANT_LAYERS):
            for k, n in QUANT_SHAPES:
                if name in (*K_QUANTS, "IQ4_NL"):
                    raw = k_blocks(kind, (n, k), rng)
                    ws.append((k, cpu_quant.QuantWeight(torch.from_numpy(np.ascontiguousarray(raw)), code, k, n)))
                else:
                    ws.append((k, quant_blocks(name, n, k, rng)))
        if code in cpu_quant.ROW_MAJOR_TYPES:
            sets[name] = ws
        if kernels.qtile_fast:  # the same blocks in tiles of 16 rows (csrc/cpu_tiles.c, cpu_ktiles.c)
            sets[f"{name} tiles"] = [(k, kernels.tile(w)) for k, w in ws]
            sets[f"{name} exact"] = sets[f"{name} tiles"]
            exact.add(f"{name} exact")
    bf16 = [(k, kernels.pack_linear((torch.randn(k, n) * 0.05).bfloat16())) for _ in range(QUANT_LAYERS)
            for k, n in QUANT_SHAPES] if torch.bfloat16 in kernels.linear_dtypes else []
    out = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k) for k, _ in QUANT_SHAPES}
        xb = {k: x.bfloat16() for k, x in xs.items()}
        fns = {name: (lambda ws=ws, e=name in exact: [kernels.qlinear(xs[k], w, exact=e) for k, w in ws])
               for name, ws in sets.items()}
        if bf16:
            fns["bf16"] = lambda: [kernels.linear(xb[k], w) for k, w in bf16]
        t = best(fns, 3)
        for name in fns:
            mib = (sum(w.nbytes for _, w in sets[name]) if name in sets
                   else 2 * sum(k * n for k, n in QUANT_SHAPES) * QUANT_LAYERS) / 2**20
            out.append([rows, name, mib, t[name] * 1e3, t.get("bf16", float("nan")) / t[name]])
    return out


def exact_products(kernels, rows_list, layers: int = 2) -> list:
    """The exact product (a prompt's rows: csrc/cpu_tgemm.c) of `layers` layers' linears per type, ms and
    FLOPs a second against the cores' fp32 FMA peak (csrc/cpu_peak.c), beside each weight dequantized
    whole and multiplied by torch (what prompts of more than 16 rows did before the kernel)."""
    import gguf
    import numpy as np

    from tests.kernels.test_quant_kernels import K_QUANTS, k_blocks

    peak, rng, out = kernels.fma_peak(), np.random.default_rng(2), []
    for name in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K"):
        code = cpu_quant.QUANT_TYPES[name][0]
        ws = []
        for _ in range(layers):
            for k, n in QUANT_SHAPES:
                if name in K_QUANTS:
                    raw = k_blocks(getattr(gguf.GGMLQuantizationType, name), (n, k), rng)
                    w = cpu_quant.QuantWeight(torch.from_numpy(np.ascontiguousarray(raw)), code, k, n)
                else:
                    w = quant_blocks(name, n, k, rng)
                ws.append((k, kernels.tile(w)))
        for rows in rows_list:
            xs = {k: torch.randn(rows, k) for k, _ in QUANT_SHAPES}
            t = best({"kernel": lambda: [kernels.qlinear(xs[k], w, exact=True) for k, w in ws],
                      "dequantized": lambda: [xs[k] @ kernels.qdequant(w, None, torch.float32).t() for k, w in ws]}, 3)
            flops = 2 * rows * sum(k * n for k, n in QUANT_SHAPES) * layers
            out.append([rows, name, t["kernel"] * 1e3, flops / t["kernel"] / 1e9, 100 * flops / t["kernel"] / peak,
                        t["dequantized"] / t["kernel"]])
    return out, peak


def embedded_step(kernels) -> list:
    """ms for one batch-1 decode step's linears of the embedded model, kept as its file keeps them:
    30 layers of SHAPES in Q4_1 and the vocabulary projection (49152 x 576, Q8_0, x in fp32 as the
    engine runs it), random blocks; against the same shapes in the C bf16 kernel."""
    import numpy as np

    rng = np.random.default_rng(0)
    layers = [(k, quant_blocks("Q4_1", n, k, rng)) for _ in range(LAYERS) for k, n in SHAPES]
    vocab = quant_blocks("Q8_0", 49152, 576, rng)
    xs = {k: torch.randn(1, k) for k, _ in SHAPES}
    fns = {"Q4_1 layers": lambda: [kernels.qlinear(xs[k], w) for k, w in layers],
           "Q8_0 vocabulary": lambda: kernels.qlinear(xs[576], vocab, exact=True)}
    if torch.bfloat16 in kernels.linear_dtypes:
        packed = [(k, kernels.pack_linear((torch.randn(k, n) * 0.05).bfloat16()))
                  for _ in range(LAYERS) for k, n in SHAPES]
        vocab16 = kernels.pack_linear((torch.randn(576, 49152) * 0.05).bfloat16())
        xb = {k: x.bfloat16() for k, x in xs.items()}
        fns["bf16 layers"] = lambda: [kernels.linear(xb[k], w) for k, w in packed]
        fns["bf16 vocabulary"] = lambda: kernels.linear(xb[576], vocab16)
    t = best(fns, 5)
    return [[name, t[name] * 1e3] for name in fns]


def long_inputs(kernels, rows: int = 512) -> list:
    """ms for `rows` rows of x on one large weight (the MLP's gate_up): the kernel 16 rows at a time
    against what qlinear does from QLINEAR_SLICED_MIN_ROWS rows on (slices of the weight dequantized)."""
    import gguf
    import numpy as np

    from tests.kernels.test_quant_kernels import k_blocks

    k, n = QUANT_SHAPES[2]
    rng, out = np.random.default_rng(1), []
    x = torch.randn(rows, k)
    for name in ("Q4_1", "Q4_K"):
        code, _, _ = cpu_quant.QUANT_TYPES[name]
        kind = getattr(gguf.GGMLQuantizationType, name)
        raw = (
            k_blocks(kind, (n, k), rng)
            if name == "Q4_K"
            else gguf.quants.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), kind)
        )
        w = cpu_quant.QuantWeight(torch.from_numpy(np.ascontiguousarray(raw)), code, k, n)
        t = best(
            {"kernel": lambda: [kernels.qlinear(x[i : i + 16], w) for i in range(0, rows, 16)],
             "sliced": lambda: kernels.qlinear(x, w)},
            3,
        )
        out.append([name, rows, f"{n} x {k}", t["kernel"] * 1e3, t["sliced"] * 1e3, t["kernel"] / t["sliced"]])
    return out


def _decode_batch(dtype, batch, length):
    table_ = torch.zeros(64, 4096, dtype=torch.int64)
    for b in range(batch):
        table_[b, :length] = torch.arange(1 + b * length, 1 + (b + 1) * length)
    rows = torch.arange(batch)
    meta = AttentionMetadata(table_, rows, [length] * batch, [1] * batch, batch, table_[rows, length - 1].clone())
    qkv = torch.randn(batch, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
    return meta, _split(qkv)


def _split(qkv):
    h, kvh, d = HEADS, KV_HEADS, HEAD_DIM
    q = qkv[:, : h * d].view(-1, h, d)
    k = qkv[:, h * d : (h + kvh) * d].view(-1, kvh, d)
    v = qkv[:, (h + kvh) * d :].view(-1, kvh, d)
    return q, k, v


def decode_attention(dtype, shapes) -> list:
    slots = max(b * n for b, n in shapes) + 1
    pools = [(torch.randn(slots, KV_HEADS, HEAD_DIM).to(dtype), torch.randn(slots, KV_HEADS, HEAD_DIM).to(dtype))
             for _ in range(LAYERS)]
    weights = [_pack(torch.randn(3072, 576).to(dtype)) for _ in range(LAYERS)]
    out = []
    for batch, length in shapes:
        meta, (q, k, v) = _decode_batch(dtype, batch, length)
        x = torch.randn(batch, 576).to(dtype)
        backends = {name: get_backend(name) for name in ("cpu", "torch")}
        spent = {name: [] for name in backends}
        for _ in range(8):
            for name, be in backends.items():
                be.prepare(meta)
                total = 0.0
                for (kc, vc), w in zip(pools, weights):
                    _packed_linear(x, w, None, None)  # the layer's weights pass through the cache
                    start = time.perf_counter()
                    be.forward(q, k, v, kc, vc, HEAD_DIM**-0.5)
                    total += time.perf_counter() - start
                spent[name].append(total / LAYERS)
        t = {name: sorted(ts)[len(ts) // 2] for name, ts in spent.items()}
        out.append([batch, length, t["cpu"] * 1e6, t["torch"] * 1e6, t["torch"] / t["cpu"]])
    return out


def extend_attention(dtype, sizes) -> list:
    out = []
    kc, vc = torch.randn(8192, KV_HEADS, HEAD_DIM).to(dtype), torch.randn(8192, KV_HEADS, HEAD_DIM).to(dtype)
    for prefix, ext in sizes:
        seq = prefix + ext
        table_ = torch.zeros(2, seq, dtype=torch.int64)
        table_[0] = torch.arange(1, seq + 1)
        written = AttentionMetadata(table_, torch.arange(1), [seq], [ext], 0, table_[0, prefix:].clone())
        prompt = dataclasses.replace(written, prompt_lens=[ext])
        q, k, v = _split(torch.randn(ext, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype))

        def run(name, meta):
            be = get_backend(name)
            be.prepare(meta)
            for _ in range(LAYERS):
                be.forward(q, k, v, kc, vc, HEAD_DIM**-0.5)

        t = best({"prompt": lambda: run("cpu", prompt), "written": lambda: run("cpu", written),
                  "sdpa": lambda: run("torch", written)}, 5)
        flops = 4 * ext * (prefix + (ext + 1) / 2) * HEADS * HEAD_DIM  # (QK and PV: 2 FLOPs a product)
        out.append([prefix, ext, t["prompt"] / LAYERS * 1e6, flops / (t["prompt"] / LAYERS) / 1e9,
                    t["written"] / LAYERS * 1e6, t["sdpa"] / LAYERS * 1e6, t["sdpa"] / t["prompt"]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", default="1,16,64,550")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--quantized", action="store_true", help="only the quantized linears against bf16")
    ap.add_argument("--exact-rows", default="1,16,51,128,512", help="rows of the exact products (--quantized)")
    args = ap.parse_args()
    kernels = cpu_native.load()
    if kernels is None:
        sys.exit(f"the native CPU kernels are unavailable: {cpu_native.unavailable_reason()}")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.quantized:
        print(f"{torch.get_num_threads()} threads; linears of {QUANT_LAYERS} layers {QUANT_SHAPES} ([in, out]), "
              "x in fp32 (bf16 for the bf16 kernel)")
        print(table(quantized_linears(kernels, [int(r) for r in args.rows.split(",") if int(r) <= 16]),
                    ["rows", "weights", "MiB", "ms", "bf16 / this"]))
        rows, peak = exact_products(kernels, [int(r) for r in args.exact_rows.split(",")])
        print(f"\nthe exact product (a prompt's rows), 2 layers; the cores' fp32 FMA peak {peak / 1e9:.0f} GFLOP/s")
        print(table(rows, ["rows", "weights", "ms", "GFLOP/s", "% of peak", "dequantized + torch / this"]))
        print("\nthe embedded model's linears in one batch-1 decode step (ms)")
        print(table(embedded_step(kernels), ["linears", "ms"]))
        print("\na long input on a large weight (ms)")
        print(table(long_inputs(kernels), ["weights", "rows", "weight", "kernel 16 rows at a time",
                                           "slices dequantized", "speedup"]))
        return
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {LAYERS} layers of distinct tensors per timing")
    print("\nlinears of 30 layers (ms)")
    print(table(linears(kernels, dtype, [int(r) for r in args.rows.split(",")]),
                ["rows", "agentkv", "oneDNN packed", "plain matmul", "oneDNN / agentkv"]))
    if not args.skip_decode:
        print("\ndecode attention, a layer (us)")
        print(table(decode_attention(dtype, [(16, 100), (16, 400), (16, 1600), (1, 4000)]),
                    ["requests", "tokens each", "cpu backend", "torch backend", "torch / cpu"]))
    print("\nextend attention after a cached prefix, a layer (us)")
    sizes = [(0, 32), (0, 512), (0, 2048), (256, 64), (400, 51), (512, 32), (512, 256), (2048, 256)]
    print(table(extend_attention(dtype, sizes), ["prefix", "new tokens", "C, prompt tiles", "GFLOP/s",
                                                 "C, written tiles", "SDPA", "SDPA / prompt"]))


if __name__ == "__main__":
    main()
