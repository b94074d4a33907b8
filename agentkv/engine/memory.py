"""KV memory: a pool of token slots (per layer K and V), the request-to-slot table, and how many slots
the memory there is affords (memory_fraction).

Slot 0 is never handed out: padded index tensors point at it, so a stray write lands in a slot no
request reads.
"""

from __future__ import annotations

import math

import torch

from agentkv.engine.model_config import ModelConfig
from agentkv.errors import RequestError


class KVPool:
    """Per-layer K/V buffers [num_slots, KVH, D] and a free list of slot indices. A hybrid's short
    convolution layer keeps in its K buffer [num_slots, 1, hidden] each token's convolution input
    (its V buffer holds nothing): the state at any token is its last few tokens' entries, so a cached
    prefix resumes a convolution exactly wherever it ends."""

    def __init__(self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device: str = "cpu"):
        self.num_slots = num_slots
        # Uninitialized: a slot is always written before it is read, and pages never touched cost no
        # memory. Slot 0 (the padding target) is read under a -inf mask, so it must hold finite values.
        self.kv_caches = [
            (torch.empty((num_slots, *ks), dtype=dtype, device=device),
             torch.empty((num_slots, *vs), dtype=dtype, device=device))
            for ks, vs in layer_shapes(cfg)
        ]
        for k, v in self.kv_caches:
            k[0].zero_()
            v[0].zero_()
        self.token_shape = token_shape(cfg)
        self._places = self._layer_places()
        # The free slots as a stack: stack[:top] (on the CPU, as the radix tree's slot ids and the
        # scheduler's are). Allocating and freeing cost what they move, not the size of the pool.
        self._stack = torch.arange(1, num_slots, dtype=torch.int64)
        self._top = num_slots - 1

    @property
    def capacity(self) -> int:
        """Slots a request can ever use (all but the padding slot)."""
        return self.num_slots - 1

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_caches)

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` free slots, or None when fewer are free (the caller evicts or retracts, then retries)."""
        if n > self._top:
            return None
        self._top -= n
        return self._stack[self._top:self._top + n].clone()  # (a copy: the stack's memory is reused)

    def free(self, slots: torch.Tensor) -> None:
        k = slots.numel()
        if k:
            if self._top + k > self._stack.shape[0]:
                raise AssertionError(f"{k} slots freed into a pool with {self.capacity - self._top} in use")
            self._stack[self._top:self._top + k] = slots.to("cpu", torch.int64)
            self._top += k

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """A copy of the K and V of `slots`, [len(slots), *token_shape] on the CPU: [layers, 2, kv_heads,
        head_dim] a token, or a hybrid's every layer's entries one after another."""
        idx = slots.to(self.kv_caches[0][0].device)
        k0 = self.kv_caches[0][0]
        out = torch.empty((len(slots), *self.token_shape), dtype=k0.dtype)
        for at, (k, v) in zip(self._places, self.kv_caches):  # (one copy each: a stack of stacks was 4x slower)
            out[at[0]] = k[idx].reshape(out[at[0]].shape)
            out[at[1]] = v[idx].reshape(out[at[1]].shape)
        return out

    def scatter(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Write `kv` (as `gather` returns it) into `slots`."""
        idx = slots.to(self.kv_caches[0][0].device)
        kv = kv.to(self.kv_caches[0][0].device)
        for at, (k, v) in zip(self._places, self.kv_caches):
            k[idx] = kv[at[0]].reshape(len(idx), *k.shape[1:])
            v[idx] = kv[at[1]].reshape(len(idx), *v.shape[1:])

    def _layer_places(self) -> list:
        """Per layer, where its K and V sit in a row of `gather`'s output (index tuples)."""
        if len(self.token_shape) > 1:  # [layers, 2, ...]
            return [((slice(None), layer, 0), (slice(None), layer, 1)) for layer in range(len(self.kv_caches))]
        places, at = [], 0
        for k, v in self.kv_caches:
            kw, vw = k[0].numel(), v[0].numel()
            places.append(((slice(None), slice(at, at + kw)), (slice(None), slice(at + kw, at + kw + vw))))
            at += kw + vw
        return places

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
        return sum(math.prod(k) + math.prod(v) for k, v in layer_shapes(cfg)) * torch.finfo(dtype).bits // 8


def layer_shapes(cfg: ModelConfig) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each layer's K and V shapes for one token: (kv_heads, head_dim) each (Gemma 4's full layers their
    own; its layers that read an earlier layer's KV nothing); for a short convolution layer its input
    (1, hidden) and nothing; for latent attention (DeepSeek-V3) its latent and rotated key part
    (1, kv_lora_rank + qk_rope_head_dim), which serve as the values too, and nothing."""
    if cfg.kv_lora_rank:
        return [((1, cfg.kv_lora_rank + cfg.head_dim), (1, 0))] * cfg.num_layers
    shapes = []
    for i in range(cfg.num_layers):
        attention = cfg.attention_config(i)
        if cfg.is_conv_layer(i):
            shapes.append(((1, cfg.hidden_size), (1, 0)))
        elif cfg.kv_source(i) != i:
            shapes.append(((1, 0), (1, 0)))
        else:
            shapes.append(((attention.num_kv_heads, attention.head_dim),) * 2)
    return shapes


def token_shape(cfg: ModelConfig) -> tuple[int, ...]:
    """One token's KV as the pool gathers it (and the disk tier stores it): [layers, 2, kv_heads,
    head_dim], or where layers differ (a hybrid, latent attention, Gemma 4) its layers' entries flat."""
    shapes = layer_shapes(cfg)
    if all(k == v == (cfg.num_kv_heads, cfg.head_dim) for k, v in shapes):
        return (cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim)
    return (sum(math.prod(k) + math.prod(v) for k, v in shapes),)


class ReqToTokenPool:
    """Rows of slot indices, one row per running request: row[:seq_len] are its KV slots in order.

    `host` (on the CPU) is the truth: the scheduler writes and reads it. `table` is the copy the
    attention kernels read on the device; on a CPU it is `host` itself. Where they differ, each write
    is logged and a pass takes the log (`take_writes`) and applies it to `table` before it computes
    (`apply`): the host never reads the device's copy, and the device's copy changes only in the
    order of the passes, never under a pass in flight.
    """

    def __init__(self, max_requests: int, max_context: int, device: str = "cpu"):
        self.host = torch.zeros(max_requests, max_context, dtype=torch.int64)
        self.table = self.host if torch.device(device).type == "cpu" else self.host.to(device)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self._log: list[tuple[torch.Tensor, torch.Tensor]] = []  # (flat indices, slots) not yet on the device

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        assert row not in self._free_rows, f"row {row} freed twice"
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Row `row` from position `start` on holds `slots`."""
        self.host[row, start : start + len(slots)] = slots
        if self.table is not self.host:
            first = row * self.host.shape[1] + start
            self._log.append((torch.arange(first, first + len(slots), dtype=torch.int64), slots))

    def write_cells(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        """One slot per (row, column) pair: a decode token for each of several requests, in one write."""
        self.host[rows, cols] = slots
        if self.table is not self.host:
            self._log.append((rows * self.host.shape[1] + cols, slots))

    def take_writes(self) -> torch.Tensor | None:
        """The writes logged since the last call as one [2, N] tensor (flat indices, slots), or None."""
        if not self._log:
            return None
        log, self._log = self._log, []
        return torch.stack([torch.cat([i for i, _ in log]), torch.cat([s.to(torch.int64) for _, s in log])])

    def apply(self, writes: torch.Tensor) -> None:
        """On the device, in the pass's order: `writes` from take_writes, already uploaded."""
        self.table.view(-1).index_copy_(0, writes[0], writes[1])


MAX_POOL_CONTEXTS = 256  # a pool holds at most this many full contexts, however much memory there is


def kv_slots(mc, dtype: torch.dtype, context: int, device: str, fraction: float | None) -> int:
    """The KV pool's size in tokens: `fraction` of the memory there is once the weights are loaded
    (see CacheConfig.memory_fraction), at most MAX_POOL_CONTEXTS contexts; a RequestError where not
    even one context fits."""
    per_token = KVPool.bytes_per_token(mc, dtype)
    budget = kv_budget(device, fraction)
    slots = min(budget // per_token, MAX_POOL_CONTEXTS * context)
    if slots < context:
        raise RequestError(f"the KV pool gets {budget / 2**30:.2f} GiB ({slots} tokens at {per_token} bytes each), "
                           f"less than one {context}-token context: raise memory_fraction, lower context_length, or "
                           "give num_slots")
    return int(slots)


def kv_budget(device: str, fraction: float | None) -> int:
    """Bytes the KV pool may take: on CUDA `fraction` (0.85) of the device's memory less what is in
    use; on the CPU `fraction` (0.2) of the RAM available now."""
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return max(0, int((0.85 if fraction is None else fraction) * total) - (total - free))
    return int((0.2 if fraction is None else fraction) * free_memory(device))


def free_memory(device: str) -> int:
    """Bytes free where the KV pool lives: the CUDA device's, or the RAM available."""
    return torch.cuda.mem_get_info(torch.device(device))[0] if device.startswith("cuda") else available_ram()


def available_ram() -> int:
    """MemAvailable (Linux), else what psutil says, else 8 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return 8 << 30
