"""The GPU benchmarks' full-size model shapes and the hardware bounds their rows are read against.

Shapes: Llama-3-8B and Qwen3-8B (q/k norms), all their layers, their vocabularies, bf16; written as a config
and a byte tokenizer only and loaded with `load_format="dummy"` (random weights drawn on the device in
seconds: a 16 GB checkpoint neither travels to a lent GPU nor is written there in the time it has).

Bounds (what no engine can beat on the device):
- a decode step reads every weight once (the embedding table only for its rows) and every sequence's KV:
  bytes over the HBM bandwidth;
- a prefill computes 2 FLOPs per weight per token (the vocabulary projection for the last token only) and
  the causal attention's 2 * T^2 * head_dim per head and layer: FLOPs over the dense bf16 peak.
The peaks are the vendors' published figures for the named parts; `measured_peaks` gives what a copy and a
large matmul reach, printed beside them.
"""

from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Shape:
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float
    head_dim: int = 128

    def linear_params(self) -> int:
        """Weights of one layer's linears, times the layers."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * (self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes

    def decode_step_bytes(self, batch: int, context: float, dtype_bytes: int = 2) -> float:
        """Bytes a decode step of `batch` sequences of mean length `context` reads at least."""
        weights = (self.linear_params() + self.vocab * self.hidden) * dtype_bytes  # linears + the vocab projection
        return weights + batch * self.hidden * dtype_bytes + batch * context * self.kv_bytes_per_token(dtype_bytes)

    def prefill_flops(self, tokens: int, cached: int = 0) -> float:
        """FLOPs of a prompt's `tokens` new tokens after `cached` ones (logits for the last token only)."""
        attention = 2 * self.layers * self.heads * self.head_dim * (tokens * cached + tokens * tokens / 2) * 2
        return 2 * self.linear_params() * tokens + 2 * self.vocab * self.hidden + attention


SHAPES = {
    "llama3-8b": Shape("llama", 4096, 32, 32, 8, 14336, 128256, 500000.0),
    "qwen3-8b": Shape("qwen3", 4096, 36, 32, 8, 12288, 151936, 1000000.0),
    "smoke": Shape("qwen3", 64, 2, 4, 2, 128, 512, 10000.0, head_dim=16),  # the CPU's check that the scripts run
}
NAMES = {"llama3-8b": "Llama-3-8B shape", "qwen3-8b": "Qwen3-8B shape", "smoke": "tiny (smoke)"}

# (HBM GB/s, dense bf16 TFLOPS), the vendors' figures; matched in order against torch's device name
PEAKS = [("H200", 4800.0, 989.0), ("H100 NVL", 3900.0, 835.0), ("H100 PCIe", 2000.0, 756.0),
         ("H100", 3350.0, 989.0), ("A100-SXM4-80GB", 2039.0, 312.0), ("A100", 1555.0, 312.0)]


def write_shape(out: Path, name: str, layers: int | None = None, max_positions: int = 16384) -> Path:
    """config.json and a byte tokenizer for the shape `name` (no weights: load it with load_format='dummy')."""
    from agentkv.testing import write_tiny_model

    s = SHAPES[name]
    return write_tiny_model(
        out, s.family, hidden=s.hidden, layers=layers or s.layers, heads=s.heads, kv_heads=s.kv_heads,
        intermediate=s.intermediate, max_positions=max_positions, tie=False, weights=False,
        config={"vocab_size": s.vocab, "head_dim": s.head_dim, "rope_theta": s.rope_theta})


def random_prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[list[int]]:
    """`n` prompts of `length` token ids (the byte tokenizer's specials and the vocabulary's far end left out)."""
    return [[rng.randrange(10, min(vocab, 30000)) for _ in range(length)] for _ in range(n)]


def release(engine) -> None:
    """Close an engine and give its memory back to the device before the next one (two 8B models' draws do
    not fit beside each other)."""
    engine.close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def published_peaks(device_name: str) -> tuple[float, float] | None:
    """(HBM GB/s, dense bf16 TFLOPS) of the named part, or None for a part not in PEAKS."""
    for key, bandwidth, tflops in PEAKS:
        if key in device_name:
            return bandwidth, tflops
    return None


def measured_peaks(device: str) -> tuple[float, float]:
    """(GB/s a 1 GiB device-to-device copy reaches, reading and writing; TFLOPS of a bf16 8192^3 matmul);
    on the CPU (the smoke run) small ones."""
    cuda = device.startswith("cuda")
    x = torch.empty(1 << (29 if cuda else 22), dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    n = 8192 if cuda else 256
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)

    def best(fn, repeats: int = 5) -> float:
        fn()
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return min(times)

    copy = best(lambda: y.copy_(x))
    mm = best(lambda: a @ b)
    return 2 * x.numel() * 2 / copy / 1e9, 2 * n**3 / mm / 1e12
