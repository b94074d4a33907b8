"""The CPU attention backend: agentkv's C kernel (csrc/cpu_attention.c) reading K/V in place from the pool.

The torch backend gathers each decoding request's K/V into a padded copy every layer and then runs
SDPA, whose CPU kernel is built for long sequences. Measured here (AMD Zen 4, 2 cores) for 16
decoding requests, bf16, 9 query / 3 KV heads of 64, a 30-layer pool with a linear between layers as
in a step (`benchmarks/cpu_kernels.py`): 142 us a layer against 292 at 100 tokens each, 455 against
732 at 400, 1,732 against 3,772 at 1,600. The kernel walks each request's slots and attends every
query head of a KV head with one read of its rows.

Every token of a pass goes to the kernel, decodes and extends alike, so a token's attention is
computed the same way whatever its pass holds (a prompt chunk, a batch, a draft being checked, a
forced run): outputs then do not depend on caching, batching or speculation. A prompt's tokens
(`meta.prompt_lens`) go in tiles of their own, whose body computes 16 queries at once (each query's
sums in the same order whatever the others): in `benchmarks/cpu_kernels.py`, fp32, a layer of the
embedded model's heads, 1.3-1.6x the decode body's rate (0.65x its time for 51 tokens after 400
cached, 0.64x for a 2,048-token prompt; 100-125 GFLOP/s). (SDPA's larger tiles
read a long cached prefix fewer times: in `benchmarks/cpu_kernels.py`, bf16, a layer, the kernel took
0.36x SDPA's time for a 32-token prompt and 0.81x for 2,048, but 1.19x for 256 tokens after 512
cached and 1.37x for 256 after 2,048. Routed by size, the embedded model's agent outputs differed
with n-gram speculation on and off.) One C call a layer stores the pass's new K/V and attends.
"""

from __future__ import annotations

import torch

from agentkv.errors import RequestError
from agentkv.kernels import cpu_native
from agentkv.kernels.base import AttentionMetadata
from agentkv.kernels.torch_backend import TorchAttentionBackend


class CpuAttentionBackend(TorchAttentionBackend):
    """Falls back to the torch backend's routes for what the kernel does not take: tensors off the
    CPU, float16, head_dim over the kernel's maximum (256)."""

    name = "cpu"

    def __init__(self):
        kernels = cpu_native.load()
        if kernels is None:
            raise RequestError(f"the cpu attention backend needs agentkv's native CPU kernels: "
                               f"{cpu_native.unavailable_reason()}; use attention_backend='torch'")
        self.kernels = kernels
        self.generic = False  # tests: the plain-C path on CPUs with AVX-512 too

    def prepare(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        # (first token, new tokens, table row, seq_len, prompt tokens among the new)
        self.spans: list[tuple[int, int, int, int, int]] = []
        offset = 0
        prompts = meta.prompt_lens or [0] * len(meta.extend_lens)
        for row, seq, ext, prompt in zip(meta.rows(), meta.seq_lens, meta.extend_lens, prompts):
            self.spans.append((offset, ext, row, seq, prompt))
            offset += ext
        self.tiles: dict[tuple[int, int], torch.Tensor] = {}  # per (heads, KV heads): Gemma 4's layers differ
        self.torch_prepared = False

    def _tiles(self, heads: int, kv_heads: int) -> torch.Tensor:
        """[n, 5] (first token, tokens, table row, keys of the first token, 1 for a prompt's tokens): an
        extend's tokens in tiles of as many as the kernel's query vectors take next to their heads, its
        prompt's and the written ones in tiles of their own; a decode is one."""
        per_tile = max(1, self.kernels.max_queries // self.kernels.heads_per_task(heads // kv_heads))
        tiles = []
        for first, ext, row, seq, prompt in self.spans:
            for lo, hi, kind in ((0, prompt, 1), (prompt, ext, 0)):
                tiles += [(first + j, min(per_tile, hi - j), row, seq - ext + j + 1, kind)
                          for j in range(lo, hi, per_tile)]
        return torch.tensor(tiles, dtype=torch.int64).reshape(-1, 5)

    def forward(self, q, k, v, k_cache, v_cache, scale, window=0, softcap=0.0, sinks=None):
        T, H, D = q.shape
        self.native = self.kernels.handles(q) and self.kernels.handles(k_cache) and D <= self.kernels.max_head_dim
        if not self.native:  # (this layer's: Gemma 4's wide full layers go here beside its windowed ones' kernel)
            if not self.torch_prepared:
                TorchAttentionBackend.prepare(self, self.meta)
                self.torch_prepared = True
            return TorchAttentionBackend.forward(self, q, k, v, k_cache, v_cache, scale, window, softcap, sinks)
        tiles = self.tiles.get((H, k.shape[1]))
        if tiles is None:  # the pass's first layer of these heads
            tiles = self.tiles[H, k.shape[1]] = self._tiles(H, k.shape[1])
        out = torch.empty(T, H, D, dtype=q.dtype)
        meta = self.meta
        self.kernels.attention(q, k, v, k_cache, v_cache, meta.out_cache_loc, meta.req_to_token, tiles, scale,
                               out, generic=self.generic, window=window, softcap=softcap,
                               sinks=None if sinks is None else sinks.float().contiguous())
        return out.view(T, H * D)
