"""Executes a scheduled batch on the model: builds the flat token run, runs the forward pass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from agentkv.engine.batch import ScheduledBatch
from agentkv.engine.lora.adapter import LoraAdapter
from agentkv.engine.lora.apply import LoraBatch
from agentkv.engine.lora.slots import LoraSlots
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.model import CausalLM, ForwardContext, finish_logits
from agentkv.kernels.base import AttentionBackend, AttentionMetadata


@dataclass
class ForwardInputs:
    """One pass's inputs, read from the requests when it is scheduled: with overlap the requests move
    on (and the slot table is written for the next pass) while this one waits or runs. Host-side:
    `forward` copies them to the device in one upload."""

    ids: list[int]  # flat run of new tokens; 0 where `placeholder_rows` fills in a token in flight
    positions: list[int]
    meta: AttentionMetadata  # req_rows and out_cache_loc on the host
    select: list[int]  # rows of the run whose logits are returned
    placeholder_at: list[int]  # indices into `ids` whose token the previous pass samples...
    placeholder_rows: list[int]  # ...in this sampling row of its output
    table_writes: torch.Tensor | None = None  # [2, N] slot-table writes (ReqToTokenPool.take_writes) made first
    prompt_rows: list[int] = dataclasses.field(default_factory=list)  # indices into `ids` of prompt tokens
    # LoRA: the pass's adapters and each row's index into them (-1: none); None where no request has one
    adapters: list[LoraAdapter] | None = None
    adapter_rows: list[int] | None = None


@dataclass
class OnDevice:
    """A pass's inputs where the model runs (ForwardInputs after `upload`)."""

    ids: torch.Tensor
    positions: torch.Tensor
    select: torch.Tensor
    meta: AttentionMetadata
    placeholder_at: torch.Tensor
    placeholder_rows: torch.Tensor
    table_writes: torch.Tensor | None
    exact_rows: torch.Tensor | None = None  # bool [T]: the prompt's tokens (None: no token of a prompt)
    lora: LoraBatch | None = None


class ModelRunner:
    def __init__(self, model: CausalLM, pool: KVPool, req_pool: ReqToTokenPool, backend: AttentionBackend, device: str):
        self.model, self.pool, self.req_pool, self.backend, self.device = model, pool, req_pool, backend, device
        self.graphs = None  # DecodeGraphs when CUDA graphs are on: decode-only passes replay one
        self.native_step = None  # NativeStep on CPU where the model qualifies: passes of up to 16 tokens are one C call
        # the last pass's final normed rows [len(select), hidden] where its logits were the int8
        # projection's (only the top ones exact); None where every logit was exact
        self.approx_rows: torch.Tensor | None = None
        self.tp = None  # TensorParallel when tensor_parallel > 1: each pass goes to the other ranks first
        self.kernels = None  # NativeKernels where the engine runs them (CPU): the sampler's grammar masks too
        self.lora_slots: LoraSlots | None = None  # on a GPU: the LoRA adapters passes need, in stacked slots

    def prepare(self, batch: ScheduledBatch, all_logits: bool = False) -> ForwardInputs:
        """Logits come back for the requests that sample from this pass, one row each (a request
        checking a draft: a row for its last token and one for each draft token), then for the
        batch's `score_positions`; or for every new token with `all_logits` (tests compare them to
        a reference)."""
        ids: list[int] = []
        positions: list[int] = []
        last: list[int] = []
        first_row: dict[int, int] = {}  # request id -> the row of its position 0 in the flat run
        ends: list[int] = []
        prompt_rows: list[int] = []
        prompt_lens: list[int] = []
        for i, (r, start, n, samples) in enumerate(zip(batch.reqs, batch.starts, batch.extend_lens, batch.sampling)):
            first_row[r.rid] = len(ids) - start
            draft = batch.drafts.get(i, [])
            known = r.all_ids[start : start + n - len(draft)]
            prompt_lens.append(max(0, min(n, len(r.prompt_ids) - start)))
            prompt_rows.extend(range(len(ids), len(ids) + prompt_lens[-1]))
            ids.extend(known + [0] * (n - len(draft) - len(known)) + draft)
            positions.extend(range(start, start + n))
            ends.append(len(ids) - 1)
            if samples:
                last.extend(range(len(ids) - 1 - len(draft), len(ids)))
        rows = [r.row for r in batch.reqs]
        meta = AttentionMetadata(
            req_to_token=self.req_pool.table,
            req_rows=torch.tensor(rows, dtype=torch.int64),
            seq_lens=[s + n for s, n in zip(batch.starts, batch.extend_lens)],
            extend_lens=batch.extend_lens,
            num_decodes=batch.num_decodes,
            out_cache_loc=batch.out_cache_loc,
            host_table=self.req_pool.host,
            host_rows=rows,
            prompt_lens=prompt_lens,
        )
        last += [first_row[r.rid] + p for r, p in batch.score_positions]
        adapters, adapter_rows = _adapter_rows(batch)
        return ForwardInputs(
            ids, positions, meta, list(range(len(ids))) if all_logits else last,
            [ends[i] for i, _ in batch.placeholders], [row for _, row in batch.placeholders],
            self.req_pool.take_writes(), prompt_rows, adapters, adapter_rows,
        )

    def upload(self, inputs: ForwardInputs) -> OnDevice:
        """The pass's index tensors on the device, in one copy (pinned and non-blocking on CUDA)."""
        m = inputs.meta
        lists = (inputs.ids, inputs.positions, inputs.select, inputs.placeholder_at, inputs.placeholder_rows,
                 inputs.prompt_rows, inputs.adapter_rows or [])
        tensors = [m.req_rows, m.out_cache_loc] + (
            [inputs.table_writes.view(-1)] if inputs.table_writes is not None else [])
        host = torch.cat(
            [torch.tensor([x for part in lists for x in part], dtype=torch.int64)]
            + [t.to(torch.int64) for t in tensors]
        )
        if torch.device(self.device).type != "cpu":
            host = host.pin_memory().to(self.device, non_blocking=True)
        sizes = [len(p) for p in lists] + [len(t) for t in tensors]
        ids, positions, select, at, rows, prompt, adapter_rows, req_rows, loc, *writes = host.split(sizes)
        meta = dataclasses.replace(m, req_rows=req_rows, out_cache_loc=loc)
        exact = None
        if len(inputs.prompt_rows):
            exact = torch.zeros(len(inputs.ids), dtype=torch.bool, device=ids.device).index_fill_(0, prompt, True)
        lora = None
        if inputs.adapters:
            if self.lora_slots is None and ids.device.type == "cuda":
                self.lora_slots = LoraSlots(self.model.config, 2 * len(inputs.adapters) + 6, ids.device,
                                            self.model.norm.weight.dtype)
            lora = LoraBatch(inputs.adapters, adapter_rows, self.kernels, self.lora_slots)
        return OnDevice(ids, positions, select, meta, at, rows, writes[0].view(2, -1) if writes else None, exact,
                        lora)

    @torch.inference_mode()
    def forward(self, inputs: ForwardInputs, prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (fp32) of `inputs.select`. `prev_tokens` [rows] holds the previous pass's sampled
        tokens (overlap), on the device: placeholders are resolved from it here."""
        dev = self.upload(inputs)
        if dev.table_writes is not None:  # the slot table as this pass reads it (after the passes before it)
            self.req_pool.apply(dev.table_writes)
        ids = dev.ids
        if len(dev.placeholder_at):
            if prev_tokens is None:  # the previous pass failed: its requests are failed too
                prev_tokens = torch.zeros(max(inputs.placeholder_rows) + 1, dtype=torch.int64, device=ids.device)
            ids = ids.index_put((dev.placeholder_at,), prev_tokens[dev.placeholder_rows])
        self.approx_rows = None
        if self.tp is not None:
            self.tp.send(inputs, ids, self.req_pool.host)
        elif self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(dev, ids)
        elif self.native_step is not None and self.native_step.can_run(inputs):
            logits, self.approx_rows = self.native_step.run(dev, ids)
            return logits
        logits = self.forward_ids(dev, ids)
        self.approx_rows = self.model.logits_proj.approx_rows
        return logits

    def exact_logits(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The exact logits [n, R] of tokens `ids` [n, R] (-1: none) from rows of a pass's `approx_rows`
        (the final normed states of a pass whose logits were the int8 projection's)."""
        proj = self.model.logits_proj
        exact = proj.native.qrescore(proj.weight, hidden, ids)
        return finish_logits(exact, self.model.config)  # (Gemma 2's cap, Granite's scale: as the pass's logits)

    @torch.inference_mode()
    def forward_ids(self, dev: OnDevice, ids: torch.Tensor) -> torch.Tensor:
        """The model over `ids` (placeholders resolved): the whole pass on a single rank, this rank's
        share of it with tensor parallelism."""
        self.backend.prepare(dev.meta)
        ctx = ForwardContext(positions=dev.positions, backend=self.backend, kv_caches=self.pool.kv_caches,
                             exact_rows=dev.exact_rows, lora=dev.lora, backend_meta=dev.meta)
        return self.model(ids, ctx, dev.select)

    def close(self) -> None:
        if self.tp is not None:
            self.tp.close()
            self.tp = None

    def run(self, batch: ScheduledBatch, all_logits: bool = False) -> torch.Tensor:
        """prepare + forward, for a batch with no token in flight."""
        return self.forward(self.prepare(batch, all_logits))


def _adapter_rows(batch: ScheduledBatch) -> tuple[list[LoraAdapter] | None, list[int] | None]:
    """The pass's LoRA adapters (each once) and each token row's index into them (-1: none); None, None where
    no request of the pass has one."""
    if all(r.adapter is None for r in batch.reqs):
        return None, None
    adapters: list[LoraAdapter] = []
    index: dict[int, int] = {}
    rows: list[int] = []
    for r, n in zip(batch.reqs, batch.extend_lens):
        a = -1
        if r.adapter is not None:
            a = index.setdefault(id(r.adapter), len(adapters))
            if a == len(adapters):
                adapters.append(r.adapter)
        rows.extend([a] * n)
    return adapters, rows
