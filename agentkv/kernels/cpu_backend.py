"""The CPU attention backend: agentkv's C kernel (csrc/cpu_attention.c) reading K/V in place from the pool.

The torch backend gathers each decoding request's K/V into a padded copy every layer and then runs
SDPA, whose CPU kernel is built for long sequences. Measured here (AMD Zen 4, 2 cores) for 16
decoding requests, bf16, 9 query / 3 KV heads of 64, a 30-layer pool with a linear between layers as
in a step (`benchmarks/cpu_kernels.py`): 142 us a layer against 292 at 100 tokens each, 455 against
732 at 400, 1,732 against 3,772 at 1,600. The kernel walks each request's slots and attends every
query head of a KV head with one read of its rows.

Decodes go to the kernel, and so do extends of up to `NATIVE_EXTEND_MAX` new tokens (jump-forward
runs, short turns) or after at most `NATIVE_PREFIX_MAX` cached ones (a fresh prompt's prefill): the
kernel reads the cached keys once per tile of 16 query vectors, and past those sizes SDPA's larger
tiles read them fewer times. In `benchmarks/cpu_kernels.py` (bf16, a layer; these figures move by
10-30% between runs here) the kernel took 0.36x SDPA's time for a 32-token prompt, 0.81x for 2,048,
0.70x for 32 tokens after 512 cached, 1.19x for 256 after 512 and 1.37x for 256 after 2,048 (those
two go to SDPA); in fp32 the crossover comes sooner (0.92x for 32 after 512, 0.81x for 64 after 512:
a few tokens after a long prefix take the slower side there). One C call a layer stores the pass's
new K/V and attends the kernel's tokens.
"""

from __future__ import annotations

import torch

from agentkv.errors import RequestError
from agentkv.kernels import cpu_native
from agentkv.kernels.base import AttentionMetadata
from agentkv.kernels.torch_backend import TorchAttentionBackend

# an extend attends in the C kernel when it has at most this many new tokens...
NATIVE_EXTEND_MAX = 32
# ...or at most this many cached tokens before them; other extends through SDPA
NATIVE_PREFIX_MAX = 256


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
        self.spans: list[tuple[int, int, int, int]] = []  # (first token, new tokens, table row, seq_len)
        longer: list[int] = []  # requests whose extend goes to SDPA
        offset = 0
        for i, (row, seq, ext) in enumerate(zip(meta.rows(), meta.seq_lens, meta.extend_lens)):
            if ext <= NATIVE_EXTEND_MAX or seq - ext <= NATIVE_PREFIX_MAX:
                self.spans.append((offset, ext, row, seq))
            else:
                longer.append(i)
            offset += ext
        self.tiles = None  # built by the first layer, which knows the heads
        self.extends = self._plan_extends(meta, longer)
        self._windowed = {}  # window -> (unused, the extends' plans with it)

    def _tiles(self, heads: int, kv_heads: int) -> torch.Tensor:
        """[n, 4] (first token, tokens, table row, keys of the first token): an extend's tokens in
        tiles of as many as the kernel's query vectors take next to their heads; a decode is one."""
        per_tile = max(1, self.kernels.max_queries // self.kernels.heads_per_task(heads // kv_heads))
        tiles = [(first + j, min(per_tile, ext - j), row, seq - ext + j + 1)
                 for first, ext, row, seq in self.spans for j in range(0, ext, per_tile)]
        return torch.tensor(tiles, dtype=torch.int64).reshape(-1, 4)

    def forward(self, q, k, v, k_cache, v_cache, scale, window=0, softcap=0.0):
        T, H, D = q.shape
        if self.tiles is None:  # the first layer of the pass
            self.native = (self.kernels.handles(q) and k_cache.dtype == q.dtype and D <= self.kernels.max_head_dim)
            if not self.native:
                TorchAttentionBackend.prepare(self, self.meta)
            self.tiles = self._tiles(H, k.shape[1])
        if not self.native:
            return TorchAttentionBackend.forward(self, q, k, v, k_cache, v_cache, scale, window, softcap)
        out = torch.empty(T, H, D, dtype=q.dtype)
        meta = self.meta
        self.kernels.attention(q, k, v, k_cache, v_cache, meta.out_cache_loc, meta.req_to_token, self.tiles, scale,
                               out, generic=self.generic, window=window, softcap=softcap)
        if window and window not in self._windowed:
            self._windowed[window] = (None, self._window_extends(window))
        self._attend_extends(q, k_cache, v_cache, scale, out, self._windowed[window][1] if window else self.extends,
                             softcap)
        return out.view(T, H * D)
