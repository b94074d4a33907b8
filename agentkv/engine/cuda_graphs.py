"""CUDA graphs for decode passes: the whole model forward of a decode-only pass, captured once per
bucketed batch size and replayed, so a decode step costs one graph launch instead of hundreds of
kernel launches from Python.

A graph reads and writes fixed addresses, so every input lives in a static buffer: token ids,
positions, output slots, and the attention backend's per-request rows and lengths. A pass of `n`
decodes runs in the smallest bucket >= n; the padding rows decode token 0 at position 0 from a slot
table row of their own that points at slot 0 only, write their K/V to slot 0 (the pool's padding
slot, never read unmasked), and their logits are dropped. Rows are independent in every layer, so
padding never changes a real row's values.

Only backends with `prepare_graph` (Triton) can be captured: the torch backend picks shapes from
the data. Extends, mixed passes and scoring passes run eagerly. Without CUDA (`capture=False`), the
same buffers, padding and bucket choice run eagerly: the tests check them that way on CPU.
"""

from __future__ import annotations

import bisect

import torch

from agentkv.engine.model import ForwardContext
from agentkv.errors import RequestError
from agentkv.kernels.base import AttentionMetadata


def cuda_graphs_wanted(cfg, backend) -> bool:
    """Whether an engine with `cfg` (EngineConfig) and this attention backend replays decode graphs."""
    if cfg.cuda_graphs is None:
        return cfg.device.startswith("cuda") and backend.supports_cuda_graphs
    if cfg.cuda_graphs and not backend.supports_cuda_graphs:
        raise RequestError(f"the {backend.name} attention backend cannot be captured in CUDA graphs; "
                           "use attention_backend='triton' or cuda_graphs=False")
    return cfg.cuda_graphs


def default_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to `max_batch` (and `max_batch` itself)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


class DecodeGraphs:
    def __init__(self, runner, max_batch: int, max_context: int, capture: bool = True):
        """`runner` is the engine's ModelRunner (its model, pool, slot table and backend);
        `max_context` bounds every sequence (the slot table's width)."""
        if not runner.backend.supports_cuda_graphs:
            raise ValueError(f"the {runner.backend.name} attention backend cannot be captured in a CUDA graph")
        self.runner, self.max_context = runner, max_context
        self.buckets = default_buckets(max_batch)
        dev = runner.device
        self.ids = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.out_loc = torch.zeros(max_batch, dtype=torch.int64, device=dev)  # padding rows write slot 0
        self.rows = torch.zeros(max_batch, dtype=torch.int64, device=dev)  # set to the padding row below
        self.lens = torch.ones(max_batch, dtype=torch.int64, device=dev)
        self.select = torch.arange(max_batch, dtype=torch.int64, device=dev)
        # a slot-table row no request owns: zeros, i.e. slot 0 at position 0
        self.pad_row = runner.req_pool.alloc()
        assert self.pad_row is not None, "no free slot-table row for the CUDA graph padding"
        runner.req_pool.table[self.pad_row].zero_()  # (the host copy's row is zero already)
        self.rows.fill_(self.pad_row)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0
        if capture:
            self._capture_all()

    def can_run(self, inputs) -> bool:
        """A decode-only pass whose logits are its rows in order, within the largest bucket."""
        meta = inputs.meta
        n = meta.num_decodes
        return (0 < n <= self.buckets[-1] and n == len(meta.extend_lens) and len(inputs.select) == n
                and inputs.select[-1] == n - 1 and not inputs.adapters)  # (graphs are captured without LoRA)

    @torch.inference_mode()
    def run(self, dev, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of a decode-only pass (`dev`: its inputs on the device, runner.OnDevice);
        `ids` [n] on the device (placeholders resolved)."""
        n = len(ids)
        bs = self.buckets[bisect.bisect_left(self.buckets, n)]
        self.ids[:n].copy_(ids)
        self.positions[:n].copy_(dev.positions)
        self.out_loc[:n].copy_(dev.meta.out_cache_loc)
        self.rows[:n].copy_(dev.meta.req_rows)
        self.lens[:n].copy_(dev.positions + 1)  # a decode's length is its position + 1
        if bs > n:
            for buf, value in ((self.ids, 0), (self.positions, 0), (self.out_loc, 0), (self.rows, self.pad_row),
                               (self.lens, 1)):
                buf[n:bs].fill_(value)
        self.replays += 1
        if self.graphs:  # every bucket is captured
            self.graphs[bs].replay()
            return self.outputs[bs][:n]
        return self._forward(bs)[:n]

    def _forward(self, bs: int) -> torch.Tensor:
        """The captured region: the model over the static buffers' first `bs` rows."""
        r = self.runner
        meta = AttentionMetadata(
            req_to_token=r.req_pool.table, req_rows=self.rows[:bs], seq_lens=[1] * bs, extend_lens=[1] * bs,
            num_decodes=bs, out_cache_loc=self.out_loc[:bs],
        )
        r.backend.prepare_graph(meta, self.rows[:bs], self.lens[:bs], self.max_context)
        ctx = ForwardContext(positions=self.positions[:bs], backend=r.backend, kv_caches=r.pool.kv_caches,
                             backend_meta=meta)
        return r.model(self.ids[:bs], ctx, self.select[:bs])

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for bs in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # compile the kernels and settle the allocator outside capture
                    for _ in range(2):
                        self._forward(bs)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bs] = self._forward(bs)
                self.graphs[bs] = graph
        torch.cuda.synchronize()
