"""A pass's LoRA updates: each token row of the flat run adds its request's adapter's update to the
linears it targets, the base product computed once for all rows (SGMV, as Punica and S-LoRA batch it).

On CPU with agentkv's C kernels the update of every row is one call a linear (csrc/cpu_lora.c), a row
at a time in a fixed order, the same bodies the native decode step runs, so a request's numbers never
depend on what else its pass holds. On a GPU the pass's adapters sit in slots of stacked tensors (slots.py)
and two Triton kernels a linear gather each row's (kernels/triton_lora.py). Elsewhere (no C kernels, bf16
on CPU) the rows of each adapter are gathered and multiplied with torch.
"""

from __future__ import annotations

import ctypes

import torch

from agentkv.engine.lora.adapter import TARGETS, LoraAdapter
from agentkv.engine.lora.slots import LoraSlots

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
PIECES = 3  # csrc/cpu_lora.h's LORA_PIECES


class _Piece(ctypes.Structure):
    _fields_ = [("a", _P), ("bt", _P), ("rank", _I64), ("n0", _I64), ("n", _I64), ("bf", _I64),
                ("scale", ctypes.c_float)]


class _Mat(ctypes.Structure):
    _fields_ = [("pieces", _I64), ("rank", _I64), ("piece", _Piece * PIECES)]


class _Layer(ctypes.Structure):
    _fields_ = [("mat", _Mat * len(TARGETS))]


class NativeAdapter(ctypes.Structure):
    """csrc/cpu_lora.h's LoraAdapter: a pointer to its layers' updates (kept alive by `layers`)."""

    _fields_ = [("layer", ctypes.POINTER(_Layer))]


def native_adapter(adapter: LoraAdapter) -> NativeAdapter:
    """The adapter described for the C kernels (made once; the adapter's tensors stay where they are)."""
    if adapter.native is None:
        layers = (_Layer * len(adapter.layers))()
        for i, layer in enumerate(adapter.layers):
            for t, target in enumerate(TARGETS):
                pieces = layer.get(target, [])
                assert len(pieces) <= PIECES
                mat = layers[i].mat[t]
                mat.pieces, mat.rank = len(pieces), sum(p.rank for p in pieces)
                for j, p in enumerate(pieces):
                    mat.piece[j] = _Piece(p.a.data_ptr(), p.bt.data_ptr(), p.rank, p.n0, p.bt.shape[1],
                                          int(p.a.dtype == torch.bfloat16), p.scale)
        native = NativeAdapter(ctypes.cast(layers, ctypes.POINTER(_Layer)))
        native.keep = layers  # the structures the pointer reads
        adapter.native = native
    return adapter.native


class StepLora(ctypes.Structure):
    """csrc/cpu_step.c's StepLora: each token's adapter index and the adapters."""

    _fields_ = [("row_adapter", _P), ("adapters", _P), ("count", _I64)]


class LoraBatch:
    """The adapters of one pass and each token row's (`rows[t]`: an index into `adapters`, -1: none)."""

    def __init__(self, adapters: list[LoraAdapter], rows: torch.Tensor, kernels=None, slots: LoraSlots | None = None):
        self.adapters, self.rows, self.kernels, self.slots = adapters, rows, kernels, slots
        self.target_index = {t: i for i, t in enumerate(TARGETS)}
        self._table = None
        self._groups = None
        self._slot_rows: torch.Tensor | None = None

    def add(self, layer: int, target: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y += each row's update of linear `target` of `layer` from that linear's input x, in place."""
        if self.slots is not None:
            from agentkv.kernels.triton_lora import lora_update  # (triton: only where the slots are, a GPU)

            if self._slot_rows is None:  # each row's slot, once a pass
                table = torch.tensor(self.slots.slots(self.adapters), dtype=torch.int64, device=self.rows.device)
                self._slot_rows = torch.where(self.rows >= 0, table[self.rows.clamp(min=0)], -1).contiguous()
            lora_update(x, y, self._slot_rows, self.slots.a[(layer, target)], self.slots.b[(layer, target)])
            return
        if self.kernels is not None and x.dtype == torch.float32 and y.dtype == torch.float32 \
                and x.device.type == "cpu" and x.stride(-1) == 1 and y.stride(-1) == 1:
            self.kernels.lora_apply(x, y, self.rows, self.table(), layer, self.target_index[target])
            return
        for a, rows in self.groups():
            pieces = self.adapters[a].layers[layer].get(target)
            if not pieces:
                continue
            xs = (x if rows is None else x[rows]).float()
            for p in pieces:
                cols = slice(p.n0, p.n0 + p.bt.shape[1])
                d = (((xs @ p.a.float().t()) @ p.bt.float()) * p.scale).to(y.dtype)
                if rows is None:
                    y[:, cols] += d
                else:
                    y[rows, cols] += d

    def table(self) -> ctypes.Array:
        """The adapters described for the C kernels (made once a pass)."""
        if self._table is None:
            self._table = (NativeAdapter * len(self.adapters))(*(native_adapter(a) for a in self.adapters))
        return self._table

    def step_lora(self) -> StepLora:
        """The pass's adapters as the native decode step takes them (`rows` must stay alive meanwhile)."""
        return StepLora(self.rows.data_ptr(), ctypes.addressof(self.table()), len(self.adapters))

    def groups(self) -> list[tuple[int, torch.Tensor | None]]:
        """(adapter index, its rows: None where every row is that adapter's), once a pass."""
        if self._groups is None:
            host = self.rows.tolist()
            present = sorted(set(host) - {-1})
            if len(present) == 1 and -1 not in host:
                self._groups = [(present[0], None)]
            else:
                self._groups = [(a, (self.rows == a).nonzero().squeeze(1)) for a in present]
        return self._groups
