"""Executes a scheduled batch on the model: builds the flat token run, runs the forward pass."""

from __future__ import annotations

import torch

from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.model import CausalLM, ForwardContext
from agentkv.engine.scheduler import ScheduledBatch
from agentkv.kernels.base import AttentionBackend, AttentionMetadata


class ModelRunner:
    def __init__(self, model: CausalLM, pool: KVPool, req_pool: ReqToTokenPool, backend: AttentionBackend, device: str):
        self.model, self.pool, self.req_pool, self.backend, self.device = model, pool, req_pool, backend, device

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, all_logits: bool = False) -> torch.Tensor:
        """Logits (fp32) of the requests that sample from this pass, one row each, then of the
        batch's `score_positions()`; or of every new token with `all_logits` (tests compare them
        to a reference)."""
        ids: list[int] = []
        positions: list[int] = []
        last: list[int] = []
        starts: dict[int, int] = {}  # request id -> its first row in the flat run
        for r, n, samples in zip(batch.reqs, batch.extend_lens, batch.sampling):
            starts[r.rid] = len(ids) - r.kv_len
            ids.extend(r.all_ids[r.kv_len : r.kv_len + n])
            positions.extend(range(r.kv_len, r.kv_len + n))
            if samples:
                last.append(len(ids) - 1)
        meta = AttentionMetadata(
            req_to_token=self.req_pool.table,
            req_rows=torch.tensor([r.row for r in batch.reqs], dtype=torch.int64),
            seq_lens=[r.kv_len + n for r, n in zip(batch.reqs, batch.extend_lens)],
            extend_lens=batch.extend_lens,
            num_decodes=batch.num_decodes,
            out_cache_loc=batch.out_cache_loc,
        )
        self.backend.prepare(meta)
        ctx = ForwardContext(
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            backend=self.backend,
            kv_caches=self.pool.kv_caches,
        )
        last += [starts[r.rid] + p for r, p in batch.score_positions()]
        select = torch.arange(len(ids)) if all_logits else torch.tensor(last, dtype=torch.int64)
        return self.model(torch.tensor(ids, dtype=torch.int64, device=self.device), ctx, select)
