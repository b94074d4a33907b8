"""A LoRA adapter as the engine runs it: for each layer and each of its four linears (qkv, o, gate_up,
down), the pieces an adapter adds to the linear's output, and a hash of all of it.

A piece is one targeted module of HF's model: PEFT's A [rank, in] and B [out, rank] kept as A and B^T, in the
file's dtype (fp32, or bf16: half the bytes a decode step reads), its scale (alpha / rank, or alpha /
sqrt(rank) with rsLoRA) applied to the product as PEFT does, and the columns of our fused linear its output
lands in (q, k and v side by side in qkv, gate then up in gate_up). The update is never merged into the
weights: a pass mixes requests of many adapters and of none (apply.py).

The hash is of the numbers the engine computes with (each piece's place, A and scaled B), not of a name
or a path: the radix tree, pins, sessions and the disk tier key an adapter's KV by it, so an adapter
reloaded with new weights under the same name never reads KV the old one wrote.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from agentkv.engine.model_config import ModelConfig

TARGETS = ("qkv", "o", "gate_up", "down")  # a layer's linears, in csrc/cpu_lora.h's order
MAX_RANK = 256  # csrc/cpu_lora.h's LORA_MAX_RANK: a row's shrunk vector on the stack


@dataclass(frozen=True)
class Piece:
    """One module's update: y[:, n0 : n0 + B^T's columns] += ((x A^T) B^T) * scale."""

    a: torch.Tensor  # [rank, in] fp32 or bf16, contiguous
    bt: torch.Tensor  # [rank, n], A's dtype, contiguous
    n0: int
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(eq=False)
class LoraAdapter:
    name: str
    source: str  # the file or folder it was read from
    layers: list[dict[str, list[Piece]]]  # per layer: target -> its pieces (a target left alone: absent)
    rank: int  # the largest piece's
    alpha: float
    hash: str = ""  # set at construction: see the module's doc
    native: object = field(default=None, repr=False)  # its ctypes description (apply.NativeAdapter), made once

    def __post_init__(self) -> None:
        if not self.hash:
            h = hashlib.blake2b(digest_size=16)
            for i, layer in enumerate(self.layers):
                for target in TARGETS:
                    for p in layer.get(target, ()):
                        h.update(f"{i}.{target}.{p.n0}.{tuple(p.a.shape)}.{tuple(p.bt.shape)}.{p.a.dtype}."
                                 f"{p.scale!r};".encode())
                        h.update(p.a.view(torch.uint8).numpy().tobytes())
                        h.update(p.bt.view(torch.uint8).numpy().tobytes())
            self.hash = h.hexdigest()

    @property
    def nbytes(self) -> int:
        return sum(p.a.nbytes + p.bt.nbytes for layer in self.layers for ps in layer.values() for p in ps)

    @property
    def targets(self) -> set[str]:
        return {t for layer in self.layers for t in layer}

    def to(self, device: str) -> LoraAdapter:
        """The same adapter with its tensors on `device` (the hash unchanged)."""
        if device == "cpu":
            return self
        layers = [{t: [Piece(p.a.to(device), p.bt.to(device), p.n0, p.scale) for p in ps] for t, ps in layer.items()}
                  for layer in self.layers]
        return LoraAdapter(self.name, self.source, layers, self.rank, self.alpha, self.hash)


# HF's module name -> (our linear, which part of it): the part's column offset is found from the config
MODULES = {
    "q_proj": ("qkv", "q"), "k_proj": ("qkv", "k"), "v_proj": ("qkv", "v"), "qkv_proj": ("qkv", "all"),
    "o_proj": ("o", "all"), "gate_proj": ("gate_up", "gate"), "up_proj": ("gate_up", "up"),
    "gate_up_proj": ("gate_up", "all"), "down_proj": ("down", "all"),
}


def column_offset(cfg: ModelConfig, target: str, part: str) -> tuple[int, int]:
    """Where module `part` of our linear `target` writes: (first column, columns)."""
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    return {
        ("qkv", "q"): (0, q), ("qkv", "k"): (q, kv), ("qkv", "v"): (q + kv, kv), ("qkv", "all"): (0, q + 2 * kv),
        ("o", "all"): (0, cfg.hidden_size), ("gate_up", "gate"): (0, inter), ("gate_up", "up"): (inter, inter),
        ("gate_up", "all"): (0, 2 * inter), ("down", "all"): (0, cfg.hidden_size),
    }[(target, part)]


def input_size(cfg: ModelConfig, target: str) -> int:
    return {"qkv": cfg.hidden_size, "o": cfg.num_heads * cfg.head_dim, "gate_up": cfg.hidden_size,
            "down": cfg.intermediate_size}[target]
