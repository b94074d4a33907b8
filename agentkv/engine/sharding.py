"""Each tensor-parallel rank's share of a model: its config's shapes, its cut of the checkpoint, and
the layers whose partial sums are all-reduced (engine/parallel.py runs the ranks; the loader cuts a
rank's share with these as it loads).
"""

from __future__ import annotations

import dataclasses

import torch

from agentkv.engine.model_config import ModelConfig
from agentkv.errors import RequestError


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The shapes one rank holds. A mixture of experts shards every expert's width (and the shared
    expert's) as a dense MLP's: each rank runs every expert on its slice, the router replicated."""
    if cfg.conv_layers or cfg.kv_lora_rank or cfg.family == "gemma4":
        raise RequestError(f"tensor_parallel={world}: the short convolution, latent attention or Gemma 4 layers of a "
                           f"{cfg.family} model are not sharded; run it with tensor_parallel=1")
    for what, n in (("attention heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads),
                    ("MLP width", cfg.intermediate_size), ("experts' width", cfg.moe_intermediate_size),
                    ("shared expert's width", cfg.shared_expert_intermediate_size)):
        if n % world:
            raise RequestError(f"tensor_parallel={world} does not divide the model's {n} {what}; "
                               f"choose a tensor_parallel that divides {cfg.num_kv_heads} (the KV heads)")
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // world, num_kv_heads=cfg.num_kv_heads // world,
                               intermediate_size=cfg.intermediate_size // world,
                               moe_intermediate_size=cfg.moe_intermediate_size // world,
                               shared_expert_intermediate_size=cfg.shared_expert_intermediate_size // world)


def shard_state(state: dict[str, torch.Tensor], cfg: ModelConfig, rank: int, world: int) -> dict[str, torch.Tensor]:
    """Cut the fused HF-layout ([out, in]) state down to this rank's share."""
    d, h, kvh = cfg.head_dim, cfg.num_heads // world, cfg.num_kv_heads // world
    q_all, kv_all = cfg.num_heads * d, cfg.num_kv_heads * d

    def qkv(t: torch.Tensor) -> torch.Tensor:  # rows: q heads, then k heads, then v heads
        q, k, v = t[:q_all], t[q_all : q_all + kv_all], t[q_all + kv_all :]
        return torch.cat([q[rank * h * d : (rank + 1) * h * d], k[rank * kvh * d : (rank + 1) * kvh * d],
                          v[rank * kvh * d : (rank + 1) * kvh * d]])

    def width(name: str) -> int:  # the full width of the MLP a gate_up / down belongs to
        if ".experts." in name:
            return cfg.moe_intermediate_size
        return cfg.shared_expert_intermediate_size if ".shared." in name else cfg.intermediate_size

    out = {}
    for name, t in state.items():
        if name.endswith(("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias")):
            t = qkv(t)
        elif name.endswith("self_attn.o_proj.weight"):
            t = t[:, rank * h * d : (rank + 1) * h * d]
        elif name.endswith("gate_up_proj.weight"):
            full = width(name)
            part = full // world
            gate, up = t[:full], t[full:]
            t = torch.cat([gate[rank * part : (rank + 1) * part], up[rank * part : (rank + 1) * part]])
        elif name.endswith("down_proj.weight"):
            part = width(name) // world
            t = t[:, rank * part : (rank + 1) * part]
        out[name] = t.contiguous()
    return out


def mark_reductions(model: torch.nn.Module) -> None:
    """o_proj and down_proj give partial sums on each rank: all-reduce their outputs (a MoE block's
    experts and shared expert: their sum, once)."""
    for layer in model.layers:
        assert layer.self_attn.o_proj.bias is None, "a row-parallel layer with a bias would add it once per rank"
        layer.self_attn.o_proj.all_reduce = True
        if hasattr(layer.mlp, "experts"):
            layer.mlp.all_reduce = True
        else:
            layer.mlp.down_proj.all_reduce = True
