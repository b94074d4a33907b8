"""Executes a scheduled batch on the model: builds the flat token run, runs the forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.model import CausalLM, ForwardContext
from agentkv.engine.scheduler import ScheduledBatch
from agentkv.kernels.base import AttentionBackend, AttentionMetadata


@dataclass
class ForwardInputs:
    """One pass's inputs, read from the requests when it is scheduled: with overlap the requests move
    on (and the slot table is written for the next pass) while this one waits or runs."""

    ids: list[int]  # flat run of new tokens; 0 where `placeholder_rows` fills in a token in flight
    positions: list[int]
    meta: AttentionMetadata
    select: list[int]  # rows of the run whose logits are returned
    placeholder_at: list[int]  # indices into `ids` whose token the previous pass samples...
    placeholder_rows: list[int]  # ...in this sampling row of its output


class ModelRunner:
    def __init__(self, model: CausalLM, pool: KVPool, req_pool: ReqToTokenPool, backend: AttentionBackend, device: str):
        self.model, self.pool, self.req_pool, self.backend, self.device = model, pool, req_pool, backend, device
        self.graphs = None  # DecodeGraphs when CUDA graphs are on: decode-only passes replay one
        self.tp = None  # TensorParallel when tensor_parallel > 1: each pass goes to the other ranks first

    def prepare(self, batch: ScheduledBatch, all_logits: bool = False) -> ForwardInputs:
        """Logits come back for the requests that sample from this pass, one row each, then for the
        batch's `score_positions()`; or for every new token with `all_logits` (tests compare them to
        a reference)."""
        ids: list[int] = []
        positions: list[int] = []
        last: list[int] = []
        first_row: dict[int, int] = {}  # request id -> the row of its position 0 in the flat run
        ends: list[int] = []
        for r, start, n, samples in zip(batch.reqs, batch.starts, batch.extend_lens, batch.sampling):
            first_row[r.rid] = len(ids) - start
            known = r.all_ids[start : start + n]
            ids.extend(known + [0] * (n - len(known)))
            positions.extend(range(start, start + n))
            ends.append(len(ids) - 1)
            if samples:
                last.append(len(ids) - 1)
        meta = AttentionMetadata(
            req_to_token=self.req_pool.table,
            req_rows=torch.tensor([r.row for r in batch.reqs], dtype=torch.int64),
            seq_lens=[s + n for s, n in zip(batch.starts, batch.extend_lens)],
            extend_lens=batch.extend_lens,
            num_decodes=batch.num_decodes,
            out_cache_loc=batch.out_cache_loc.to(self.device),  # the free list lives on the CPU
        )
        last += [first_row[r.rid] + p for r, p in batch.score_positions()]
        return ForwardInputs(
            ids, positions, meta, list(range(len(ids))) if all_logits else last,
            [ends[i] for i, _ in batch.placeholders], [row for _, row in batch.placeholders],
        )

    @torch.inference_mode()
    def forward(self, inputs: ForwardInputs, prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (fp32) of `inputs.select`. `prev_tokens` [rows] holds the previous pass's sampled
        tokens (overlap): placeholders are resolved from it here, on the device."""
        ids = torch.tensor(inputs.ids, dtype=torch.int64, device=self.device)
        if inputs.placeholder_at:
            if prev_tokens is None:  # the previous pass failed: its requests are failed too
                prev_tokens = torch.zeros(max(inputs.placeholder_rows) + 1, dtype=torch.int64, device=self.device)
            at = torch.tensor(inputs.placeholder_at, dtype=torch.int64, device=self.device)
            rows = torch.tensor(inputs.placeholder_rows, dtype=torch.int64, device=self.device)
            ids[at] = prev_tokens[rows]
        if self.tp is not None:
            self.tp.send(inputs, ids)
        elif self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(inputs, ids)
        return self.forward_ids(inputs, ids)

    @torch.inference_mode()
    def forward_ids(self, inputs: ForwardInputs, ids: torch.Tensor) -> torch.Tensor:
        """The model over `ids` (placeholders resolved): the whole pass on a single rank, this rank's
        share of it with tensor parallelism."""
        self.backend.prepare(inputs.meta)
        ctx = ForwardContext(
            positions=torch.tensor(inputs.positions, dtype=torch.int64, device=self.device),
            backend=self.backend,
            kv_caches=self.pool.kv_caches,
        )
        return self.model(ids, ctx, torch.tensor(inputs.select, dtype=torch.int64))

    def close(self) -> None:
        if self.tp is not None:
            self.tp.close()
            self.tp = None

    def run(self, batch: ScheduledBatch, all_logits: bool = False) -> torch.Tensor:
        """prepare + forward, for a batch with no token in flight."""
        return self.forward(self.prepare(batch, all_logits))
