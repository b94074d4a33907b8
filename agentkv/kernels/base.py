"""The attention backend contract (the registry that picks one by name is registry.py).

A forward pass holds a flat run of tokens from several requests: first `num_decodes` requests with
one new token each, then extends (new tokens after a cached prefix). Every request's K/V lives in a
paged pool of token slots; `req_to_token[row, :seq_len]` lists the slots of its whole sequence, the
new tokens' slots last. Backends take tensors only, never requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    req_to_token: torch.Tensor  # [max_requests, max_context] int64 slot table
    req_rows: torch.Tensor  # [B] int64 row of each request in req_to_token
    seq_lens: list[int]  # [B] tokens in the KV after this pass (prefix + new)
    extend_lens: list[int]  # [B] new tokens of each request in this pass
    num_decodes: int  # the first num_decodes requests are decodes (extend_len == 1)
    out_cache_loc: torch.Tensor  # [T] int64 slot where each new token's K/V is written
    # host copies, where a backend plans on the host (reading the device's would wait for the GPU)
    host_table: torch.Tensor | None = None  # the slot table's (the truth: ReqToTokenPool.host)
    host_rows: list[int] | None = None  # req_rows'
    # [B] how many of each request's new tokens, from its first, are its prompt's (None: none are); the
    # cpu backend attends to them in a body of their own (csrc/cpu_attention.c)
    prompt_lens: list[int] | None = None

    def rows(self) -> list[int]:
        return self.host_rows if self.host_rows is not None else self.req_rows.tolist()

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])

    @property
    def prefix_lens(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens, self.extend_lens)]


class AttentionBackend(ABC):
    """Computes attention for one layer, reading and writing K/V through the slot table.

    `prepare` is called once per forward pass (build index tensors shared by all layers);
    `forward` once per layer. `forward` writes the new tokens' K/V into `k_cache`/`v_cache` at
    `meta.out_cache_loc` before attending, and returns [T, num_heads * head_dim]. `window` > 0 is
    sliding-window attention: a token at position p sees positions p - window + 1 .. p. `softcap` > 0
    caps the scaled scores as Gemma 2 does: softcap * tanh(score / softcap), before the mask. `sinks`
    (gpt-oss) add per query head one more term to each softmax's sum, exp(sink), that no value follows.
    """

    name: str
    supports_cuda_graphs = False  # has prepare_graph(meta, rows, lens, max_context) for decode-only passes

    @abstractmethod
    def prepare(self, meta: AttentionMetadata) -> None: ...

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, KVH, D]
        v: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [num_slots, KVH, D]
        v_cache: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,  # [H]: each query head's learned logit in its softmax's sum (gpt-oss)
    ) -> torch.Tensor: ...
