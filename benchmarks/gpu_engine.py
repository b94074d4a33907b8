"""End-to-end engine throughput on a GPU: the embedded SmolLM2-135M and a random-weight model with
Llama-3-8B's layer shapes (hidden 4096, 32 heads, 8 KV heads, MLP 14336; `--layers` of them, a
byte-level vocabulary), bf16, greedy, `ignore_eos`, random prompts as token ids. The 135M model also
runs with CUDA graphs and overlap scheduling off (both are on by default on CUDA), and each row says
whether its greedy tokens equal those of the row with both off.

    python benchmarks/gpu_engine.py --out $OUT/engine.md
    python benchmarks/gpu_engine.py --smoke          # tiny model on CPU: the script runs
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

import agentkv as ak  # noqa: E402
from agentkv.kernels.registry import auto_backend  # noqa: E402

MODES = {"eager": dict(cuda_graphs=False, overlap_schedule=False), "graphs": dict(overlap_schedule=False),
         "graphs+overlap": {}}
_reference: dict[tuple, list] = {}  # (model, batch) -> token ids of the eager run


def throughput(name, model, device, dtype, batch, prompt_len, new_tokens, vocab, mode="graphs+overlap") -> list:
    opts = dict(MODES[mode]) if device == "cuda" else {}
    try:
        engine = ak.Engine(
            model, device=device, dtype=dtype, num_slots=batch * (prompt_len + new_tokens) + 1024, **opts)
    except Exception as e:  # noqa: BLE001 - reported in the table, the other rows still run
        return [name, mode, batch, f"load error: {type(e).__name__}: {e}"[:80], "", "", ""]
    try:
        rng = random.Random(batch)
        prompts = [[rng.randrange(10, vocab) for _ in range(prompt_len)] for _ in range(batch)]
        params = ak.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        engine.generate(prompts[:1], ak.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
        t = time.perf_counter()
        outs = engine.generate(prompts, params)
        dt = time.perf_counter() - t
        made = sum(len(o.token_ids) for o in outs)
        ids = [o.token_ids for o in outs]
        ref = _reference.setdefault((name, batch), ids) if mode == "eager" else _reference.get((name, batch))
        same = "" if ref is None else ("yes" if ids == ref else f"{sum(a == b for a, b in zip(ids, ref))}/{len(ids)}")
        return [name, mode, batch, f"{dt:.2f}", made, f"{made / dt:.0f}", same]
    except Exception as e:  # noqa: BLE001
        return [name, mode, batch, f"error: {type(e).__name__}: {e}"[:80], "", "", ""]
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from tests.tiny import make_tiny_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tmp = Path(tempfile.mkdtemp())
    rows = []
    if args.smoke:
        tiny = make_tiny_model(tmp / "tiny")
        for b in (1, 4):
            rows.append(throughput("tiny random", str(tiny), device, "float32", b, 16, 8, 259))
    else:
        for b in (1, 16, 64):
            for mode in MODES:
                rows.append(throughput("SmolLM2-135M", None, device, "bfloat16", b, 512, 128, 49152, mode))
        big = make_tiny_model(tmp / "llama8b", hidden=4096, layers=args.layers, heads=32, kv_heads=8,
                              intermediate=14336, max_positions=8192, tie=False)
        for b in (1, 16, 64):
            rows.append(throughput(f"Llama-3-8B shape, {args.layers} layers", str(big), device, "bfloat16", b,
                                   512, 128, 259))
    text = (f"engine throughput, {device}, attention backend {auto_backend()}, greedy, 512-token prompts "
            f"(smoke: 16), 128 new tokens (smoke: 8)\n\n```\n"
            + table(rows, ["model", "mode", "batch", "wall s", "tokens", "tok/s", "same tokens as eager"]) + "\n```\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
