"""DeepSeek-V3's multi-head latent attention (MLA), with the compressed latent as what the KV pool
and the radix tree hold.

Each token writes one entry per layer: its normed latent c (kv_lora_rank) and the rotated part of its
key that every head shares (qk_rope_head_dim). Keys and values per head are never made: kv_b_proj's
key half is absorbed into the query (q_nope W_UK per head, so q . k = (q_nope W_UK) . c + q_rope .
k_rope) and its value half applied after attention (the heads' weighted sums of c, times W_UV). So the
attention is multi-query attention over the entries, the entries serving as both keys and values (the
backend reads one buffer for both; the rotated tail of its output is dropped): any attention backend
runs it, and a cached prefix costs kv_lora_rank + qk_rope_head_dim values a token per layer, not
2 x heads x head_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from agentkv.engine.linear import Linear
from agentkv.engine.model_config import ModelConfig
from agentkv.engine.rope_config import rotated_rows_in_half_split
from agentkv.errors import ModelLoadError

__all__ = ["LatentAttention", "latent_attention_state"]


class LatentAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, norm):
        """`norm`: the RMSNorm class (model.py's, which the native kernels take)."""
        super().__init__()
        self.layer_id = layer_id
        self.heads, self.rank, self.rope_dim = cfg.num_heads, cfg.kv_lora_rank, cfg.head_dim
        self.nope, self.v_dim = cfg.qk_nope_head_dim, cfg.v_head_dim
        q_width = cfg.num_heads * (self.nope + self.rope_dim)
        if cfg.q_lora_rank:
            self.q_a_proj = Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = norm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_proj = Linear(cfg.q_lora_rank, q_width)  # (the checkpoint's q_b_proj)
        else:
            self.q_a_proj = self.q_a_layernorm = None
            self.q_proj = Linear(cfg.hidden_size, q_width)
        self.kv_a_proj = Linear(cfg.hidden_size, self.rank + self.rope_dim, bias=cfg.attention_bias)
        self.kv_a_layernorm = norm(self.rank, cfg.rms_norm_eps)
        # kv_b_proj's halves per head: W_UK [heads, nope, rank] (absorbed into q), W_UV [heads, v, rank]
        self.w_uk = nn.Parameter(torch.empty(cfg.num_heads, self.nope, self.rank))
        self.w_uv = nn.Parameter(torch.empty(cfg.num_heads, self.v_dim, self.rank))
        self.o_proj = Linear(cfg.num_heads * self.v_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.scale = cfg.attention_scale
        self.window = 0

    def forward(self, x: torch.Tensor, ctx, rope, residual: torch.Tensor | None) -> torch.Tensor:
        """residual + attention(x) (attention(x) where residual is None)."""
        T = x.shape[0]
        q_in = x if self.q_a_proj is None else self.q_a_layernorm(self.q_a_proj(x, exact_rows=ctx.exact_rows))
        q = self.q_proj(q_in, exact_rows=ctx.exact_rows).view(T, self.heads, self.nope + self.rope_dim)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)  # (the rotated part last, as HF splits it)
        latent, k_rope = self.kv_a_proj(x, exact_rows=ctx.exact_rows).split([self.rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_rope = rope.apply_one(ctx.rope, q_rope.contiguous())
        k_rope = rope.apply_one(ctx.rope, k_rope.contiguous().view(T, 1, self.rope_dim))
        query = torch.cat([torch.einsum("thn,hnr->thr", q_nope, self.w_uk), q_rope], dim=-1)
        entry = torch.cat([latent.view(T, 1, self.rank), k_rope], dim=-1)
        cache = ctx.kv_caches[self.layer_id][0]
        out = ctx.backend.forward(query, entry, entry, cache, cache, self.scale)  # (the entries are the values too)
        heads = out.view(T, self.heads, self.rank + self.rope_dim)[..., : self.rank]
        attn = torch.einsum("thr,hvr->thv", heads, self.w_uv).reshape(T, self.heads * self.v_dim)
        return self.o_proj(attn, residual, exact_rows=ctx.exact_rows)


def latent_attention_state(take, matrix, p: str, o: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """One layer's attention tensors (HF names under `p`self_attn.) as LatentAttention's (under
    `o`self_attn.): kv_b_proj split per head into W_UK and W_UV; where the checkpoint rotates adjacent
    pairs (rope_interleave), the rotated rows of q's and of the latent's projection reordered evens
    first (rope_config.rotated_rows_in_half_split), for the half-split rotation (a GGUF's are reordered in
    its conversion, in their blocks). `take(name)` gives a tensor, `matrix(name)` a linear's weight (a GGUF's
    kept in its blocks)."""
    a, b = p + "self_attn.", o + "self_attn."
    heads, nope, rope, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.head_dim, cfg.kv_lora_rank

    def rotated(name: str, blocks: int, kept: int):
        if not cfg.rope_interleaved:
            return matrix(name)
        return take(name)[torch.tensor(rotated_rows_in_half_split(blocks, kept, rope))]

    out = {b + "q_proj.weight": rotated(a + ("q_b_proj.weight" if cfg.q_lora_rank else "q_proj.weight"), heads, nope)}
    if cfg.q_lora_rank:
        out[b + "q_a_proj.weight"] = matrix(a + "q_a_proj.weight")
        out[b + "q_a_layernorm.weight"] = take(a + "q_a_layernorm.weight")
    out[b + "kv_a_proj.weight"] = rotated(a + "kv_a_proj_with_mqa.weight", 1, r)
    out[b + "kv_a_layernorm.weight"] = take(a + "kv_a_layernorm.weight")
    if cfg.attention_bias:
        out[b + "q_a_proj.bias"] = take(a + "q_a_proj.bias")
        kv_bias = take(a + "kv_a_proj_with_mqa.bias")
        out[b + "kv_a_proj.bias"] = kv_bias[torch.tensor(rotated_rows_in_half_split(1, r, rope))] \
            if cfg.rope_interleaved else kv_bias
        out[b + "o_proj.bias"] = take(a + "o_proj.bias")
    try:
        kv_b = take(a + "kv_b_proj.weight").view(heads, nope + cfg.v_head_dim, r)
    except ModelLoadError:  # (a GGUF for MLA's absorption: k_b [heads, rank, nope] and v_b [heads, v, rank])
        kv_b = torch.cat([take(a + "k_b_proj.weight").transpose(1, 2), take(a + "v_b_proj.weight")], dim=1)
    out[b + "w_uk"], out[b + "w_uv"] = kv_b[:, :nope].contiguous(), kv_b[:, nope:].contiguous()
    out[b + "o_proj.weight"] = matrix(a + "o_proj.weight")
    return out
