"""LFM2's gated short convolution, over the paged KV pool.

The operator: in_proj gives B, C and x per token; the causal depthwise convolution of `conv_kernel`
taps runs over B * x; C gates its output; out_proj brings it back. A recurrent state (the last taps'
inputs) cannot be cut at an arbitrary token, which is why vLLM and SGLang keep snapshots of it at
block boundaries and lose the prefix hits between them. Here there is no state to cut: each token's
B * x is written to its own slot of the layer's K buffer, as attention writes its K, and a token's
convolution reads its predecessors' entries through the slot table. A cached prefix therefore ends
with everything the next token needs, at any length; the radix tree, pins, sessions and the disk tier
keep it as they keep attention's KV, and recompute nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from agentkv.engine.linear import Linear
from agentkv.engine.model_config import ModelConfig

__all__ = ["ShortConv", "lfm2_name", "short_conv_state"]


class ShortConv(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id, self.hidden, self.taps = layer_id, cfg.hidden_size, cfg.conv_kernel
        self.in_proj = Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.conv_bias)
        self.conv_weight = nn.Parameter(torch.empty(cfg.hidden_size, cfg.conv_kernel))  # [channel, tap]
        self.conv_bias = nn.Parameter(torch.empty(cfg.hidden_size)) if cfg.conv_bias else None
        self.out_proj = Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.conv_bias)

    def forward(self, x: torch.Tensor, ctx, rope, residual: torch.Tensor | None) -> torch.Tensor:
        """residual + conv(x) (conv(x) where residual is None); `rope` unused (the signature is
        Attention's, so a layer takes either)."""
        b, c, inp = self.in_proj(x, exact_rows=ctx.exact_rows).split(self.hidden, dim=-1)
        bx = b * inp
        cache = ctx.kv_caches[self.layer_id][0].view(-1, self.hidden)
        cache[ctx.backend_meta.out_cache_loc] = bx.to(cache.dtype)  # written first: a token reads those before it
        if ctx.conv_taps is None:  # (the same for every convolution layer of the pass)
            ctx.conv_taps = self._taps(ctx)
        slots, inside = ctx.conv_taps
        earlier = cache[slots].to(bx.dtype) * inside  # (before the sequence: zeros)
        window = torch.cat([earlier, bx[:, None]], dim=1)  # [T, taps, hidden]
        conv = (window * self.conv_weight.t()[None]).sum(dim=1)
        if self.conv_bias is not None:
            conv = conv + self.conv_bias
        return self.out_proj(c * conv, residual, exact_rows=ctx.exact_rows)

    def _taps(self, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's predecessors' slots [T, taps - 1] (oldest first), through its request's row of the
        slot table, and [T, taps - 1, 1] whether each lies inside the sequence."""
        meta = ctx.backend_meta
        rows = meta.req_rows
        if rows.shape[0] != ctx.positions.shape[0]:
            rows = rows.repeat_interleave(torch.tensor(meta.extend_lens, device=rows.device))
        back = torch.arange(self.taps - 1, 0, -1, device=ctx.positions.device)
        before = ctx.positions[:, None] - back[None]
        return meta.req_to_token[rows[:, None], before.clamp(min=0)], (before >= 0)[..., None]


# LFM2's names for what the other families name so (the short convolutions' own are read as they are)
_LFM2_NAMES = (("model.embedding_norm.", "model.norm."), (".operator_norm.", ".input_layernorm."),
               (".ffn_norm.", ".post_attention_layernorm."), (".self_attn.out_proj.", ".self_attn.o_proj."),
               (".self_attn.q_layernorm.", ".self_attn.q_norm."), (".self_attn.k_layernorm.", ".self_attn.k_norm."),
               (".feed_forward.w1.", ".mlp.gate_proj."), (".feed_forward.w3.", ".mlp.up_proj."),
               (".feed_forward.w2.", ".mlp.down_proj."))


def lfm2_name(name: str) -> str:
    for theirs, ours in _LFM2_NAMES:
        name = name.replace(theirs, ours)
    return name


def short_conv_state(take, matrix, p: str, o: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """One convolution layer's tensors (HF names under `p`conv.) as ShortConv's (under `o`self_attn.):
    its projections through `matrix` (kept in a GGUF's blocks where the kernels take them), its taps
    [hidden, taps]."""
    out = {o + "self_attn.in_proj.weight": matrix(p + "conv.in_proj.weight"),
           o + "self_attn.out_proj.weight": matrix(p + "conv.out_proj.weight"),
           o + "self_attn.conv_weight": take(p + "conv.conv.weight").reshape(cfg.hidden_size, cfg.conv_kernel)}
    if cfg.conv_bias:
        for name in ("in_proj.bias", "out_proj.bias"):
            out[o + "self_attn." + name] = take(p + "conv." + name)
        out[o + "self_attn.conv_bias"] = take(p + "conv.conv.bias")
    return out
