"""The adapters a GPU pass needs, each in a slot of stacked tensors per layer and linear: A [slots, R, K] and
B [slots, R, N] in the model's dtype (vLLM's and S-LoRA's layout), what the Triton kernels gather by a row's
slot (kernels/triton_lora.py).

A slot holds one adapter's pieces of a linear stacked along the rank (q's, k's and v's rows of A one after
another) with B placed at each piece's columns and scaled, zeros elsewhere: one shrink and one expand a
linear. Slots are a cache: an adapter gets one when a pass first needs it, and the least recently used slot
whose adapter the pass does not need is written over (an unloaded adapter's requests still in flight get a
slot back the same way). R grows to the largest rank met.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from agentkv.engine.lora.adapter import TARGETS, LoraAdapter, column_offset, input_size
from agentkv.engine.model_config import ModelConfig


class LoraSlots:
    def __init__(self, cfg: ModelConfig, capacity: int, device: str | torch.device, dtype: torch.dtype):
        self.cfg, self.capacity, self.device, self.dtype = cfg, capacity, device, dtype
        self.rank = 0  # R of the stacked tensors
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        self._slots: OrderedDict[int, tuple[LoraAdapter, int]] = OrderedDict()  # id(adapter) -> (it, slot), LRU

    def slots(self, adapters: list[LoraAdapter]) -> list[int]:
        """Each adapter's slot, written where it has none (adapters of a pass: at most `capacity`, which
        grows where they are more)."""
        if len(adapters) > self.capacity:
            self._resize(len(adapters), self.rank)
        out = []
        for adapter in adapters:
            got = self._slots.get(id(adapter))
            if got is None or got[0] is not adapter:
                got = (adapter, self._free_slot({id(a) for a in adapters}))
                self._write(got[1], adapter)
            self._slots[id(adapter)] = got
            self._slots.move_to_end(id(adapter))
            out.append(got[1])
        return out

    def _free_slot(self, needed: set[int]) -> int:
        used = {slot for _, slot in self._slots.values()}
        free = [s for s in range(self.capacity) if s not in used]
        if free:
            return free[0]
        victim = next(k for k in self._slots if k not in needed)  # least recently used, not in this pass
        return self._slots.pop(victim)[1]

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        ranks = [sum(p.rank for p in layer.get(t, ())) for layer in adapter.layers for t in TARGETS]
        if max(ranks, default=0) > self.rank:
            self._resize(self.capacity, max(ranks))
        for i, layer in enumerate(adapter.layers):
            for target in TARGETS:
                a, b = self.a[(i, target)][slot], self.b[(i, target)][slot]
                a.zero_(), b.zero_()
                r = 0
                for p in layer.get(target, ()):
                    a[r : r + p.rank] = p.a.to(self.device, self.dtype)
                    b[r : r + p.rank, p.n0 : p.n0 + p.bt.shape[1]] = (p.bt.to(self.device, torch.float32)
                                                                      * p.scale).to(self.dtype)
                    r += p.rank

    def _resize(self, capacity: int, rank: int) -> None:
        """Stacked tensors of `capacity` slots and rank `rank`, what the slots held kept."""
        for i in range(self.cfg.num_layers):
            for target in TARGETS:
                k, n = input_size(self.cfg, target), column_offset(self.cfg, target, "all")[1]
                a = torch.zeros(capacity, rank, k, dtype=self.dtype, device=self.device)
                b = torch.zeros(capacity, rank, n, dtype=self.dtype, device=self.device)
                if (i, target) in self.a:
                    old_a, old_b = self.a[(i, target)], self.b[(i, target)]
                    a[: old_a.shape[0], : old_a.shape[1]] = old_a
                    b[: old_b.shape[0], : old_b.shape[1]] = old_b
                self.a[(i, target)], self.b[(i, target)] = a, b
        self.capacity, self.rank = capacity, rank
