"""Gemma 4's text model: Gemma 3's sandwich layer with what Gemma 4 adds.

- Its full-attention layers have their own head width and KV heads (ModelConfig.attention_config), a
  "proportional" rope (the first quarter of the head's frequency pairs rotating), and where
  `k_eq_v` their values are the keys' projection. Values are RMS-normed (without a weight) and scores
  unscaled (the q/k norms set their size).
- The last `kv_shared_layers` layers compute no K/V: each attends over the KV the last earlier layer
  of its kind wrote in this pass and before (ModelConfig.kv_source). Its pool entry is empty; the
  backend is given the producer's K/V and cache, and writes the same values to the same slots again,
  so every attention backend runs it unchanged.
- Per-layer inputs: each token gets a small vector per layer (a table lookup by token plus a projection
  of its embedding), which gates a projection added to the residual after the MLP.
- A mixture of experts beside the dense MLP (the 26B-A4B), routed from the residual by a softmax over
  all experts, the top k renormalized and scaled per expert, each branch normed before the sum.
- Each layer's output is scaled by its `layer_scalar`.
Norm weights multiply as they are (Gemma 3's are 1 + weight).
"""

from __future__ import annotations

import torch
from torch import nn

from agentkv.engine.linear import Linear
from agentkv.engine.mlp import MLP, MoE, gated
from agentkv.engine.model_config import ModelConfig

__all__ = ["Gemma4Layer", "PerLayerInputs", "gemma4_state"]


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, norm):
        """`norm`: the RMSNorm class (model.py's, which the native kernels take)."""
        super().__init__()
        own = cfg.attention_config(layer_id)
        self.layer_id, self.source = layer_id, cfg.kv_source(layer_id)
        self.num_heads, self.num_kv_heads, self.head_dim = own.num_heads, own.num_kv_heads, own.head_dim
        self.q_size, self.kv_size = own.num_heads * own.head_dim, own.num_kv_heads * own.head_dim
        self.window = cfg.window(layer_id)
        self.k_eq_v = cfg.k_eq_v and not self.window
        self.scale = cfg.attention_scale
        self.q_norm = norm(own.head_dim, cfg.rms_norm_eps)
        if self.source == layer_id:
            self.qkv_proj = Linear(cfg.hidden_size, self.q_size + self.kv_size * (1 if self.k_eq_v else 2))
            self.k_norm = norm(own.head_dim, cfg.rms_norm_eps)
            self.v_norm = norm(own.head_dim, cfg.rms_norm_eps, weighted=False)
        else:  # (reads layer `source`'s K/V)
            self.q_proj = Linear(cfg.hidden_size, self.q_size)
        self.o_proj = Linear(self.q_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, ctx, rope, residual: torch.Tensor | None) -> torch.Tensor:
        T = x.shape[0]
        if self.source != self.layer_id:
            q = self.q_proj(x, exact_rows=ctx.exact_rows)
            k, v = ctx.layer_kv[self.source]
        else:
            qkv = self.qkv_proj(x, exact_rows=ctx.exact_rows)
            q = qkv[:, : self.q_size]
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, self.num_kv_heads, self.head_dim)
            v = k if self.k_eq_v else qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
            v = self.v_norm(v)  # (k_eq_v: the projection before k's norm)
            k = rope.apply_one(ctx.rope, self.k_norm(k))
            ctx.layer_kv[self.layer_id] = (k, v)  # for the shared layers that read this one's
        q = rope.apply_one(ctx.rope, self.q_norm(q.reshape(T, self.num_heads, self.head_dim)))
        k_cache, v_cache = ctx.kv_caches[self.source]
        attn = ctx.backend.forward(q, k, v, k_cache, v_cache, self.scale, self.window)
        return self.o_proj(attn, residual, exact_rows=ctx.exact_rows)


class Gemma4Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, norm):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer_id = layer_id
        self.input_layernorm = norm(h, eps)
        self.self_attn = Gemma4Attention(cfg, layer_id, norm)
        self.post_attention_layernorm = norm(h, eps)
        self.pre_feedforward_layernorm = norm(h, eps)
        wide = cfg.double_wide_mlp and cfg.kv_source(layer_id) != layer_id
        self.mlp = MLP(cfg, cfg.intermediate_size * (2 if wide else 1))
        self.post_feedforward_layernorm = norm(h, eps)
        self.moe = MoE(cfg) if cfg.num_experts else None
        if self.moe is not None:
            # the router reads the residual normed, times its scale and hidden^-0.5 (one weight here)
            self.router_norm = norm(h, eps)
            self.pre_feedforward_layernorm_2 = norm(h, eps)
            self.post_feedforward_layernorm_1 = norm(h, eps)
            self.post_feedforward_layernorm_2 = norm(h, eps)
        self.per_layer = cfg.per_layer_input_size
        if self.per_layer:
            self.per_layer_gate_proj = Linear(h, self.per_layer)
            self.per_layer_out_proj = Linear(self.per_layer, h)
            self.post_per_layer_input_norm = norm(h, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.native = self.fused = None  # the activation's kernels (mlp.gated), set by CausalLM.finalize

    def forward(self, x: torch.Tensor, ctx, rope) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), ctx, rope, residual=None))
        mlp = self.mlp(self.pre_feedforward_layernorm(x), None, ctx.exact_rows)
        if self.moe is not None:
            experts = self.moe(self.pre_feedforward_layernorm_2(x), None, ctx.exact_rows,
                               route_input=self.router_norm(x))
            mlp = self.post_feedforward_layernorm_1(mlp) + self.post_feedforward_layernorm_2(experts)
        x = x + self.post_feedforward_layernorm(mlp)
        if self.per_layer:
            gate = self.per_layer_gate_proj(x, exact_rows=ctx.exact_rows)
            gate = gated(torch.cat([gate, ctx.per_layer_inputs[:, self.layer_id]], 1), True, self.native, self.fused)
            x = x + self.post_per_layer_input_norm(self.per_layer_out_proj(gate, exact_rows=ctx.exact_rows))
        return x * self.layer_scalar


class PerLayerInputs(nn.Module):
    """Each token's input to each layer [T, layers, width]: its row of a table (times sqrt(width)) and a
    projection of its embedding (times hidden^-0.5, normed), summed and scaled by 2^-0.5."""

    def __init__(self, cfg: ModelConfig, norm):
        super().__init__()
        self.layers, self.width, self.hidden = cfg.num_layers, cfg.per_layer_input_size, cfg.hidden_size
        wide = self.layers * self.width
        self.table = nn.Embedding(cfg.per_layer_vocab, wide, _weight=torch.empty(cfg.per_layer_vocab, wide))
        self.per_layer_model_proj = Linear(cfg.hidden_size, wide)
        self.norm = norm(self.width, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, embeds: torch.Tensor, exact_rows: torch.Tensor | None) -> torch.Tensor:
        T = input_ids.shape[0]
        tokens = self.table(input_ids) * torch.tensor(self.width**0.5, dtype=embeds.dtype)
        context = self.per_layer_model_proj(embeds, exact_rows=exact_rows) * self.hidden**-0.5
        context = self.norm(context.view(T, self.layers, self.width))
        return (context + tokens.view(T, self.layers, self.width)) * 2**-0.5


def gemma4_state(names: set[str], take, matrix, experts, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our tensors from a Gemma 4 checkpoint's: Gemma4ForCausalLM's `model.*`, or the multimodal
    checkpoint's language model (`model.language_model.*`; its vision and audio towers are not read),
    or a GGUF's converted to those names. `take(name)` gives a tensor, `matrix(*names)` a linear's weight
    of those stacked (a GGUF's blocks where kept: the per-layer table's too, whose rows are read as an
    embedding's), `experts(name)` each expert's weight of a tensor stacking them."""
    p = "model.language_model." if "model.language_model.embed_tokens.weight" in names else "model."
    out = {"embed_tokens.weight": matrix(p + "embed_tokens.weight"), "norm.weight": take(p + "norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = matrix("lm_head.weight")
    if cfg.per_layer_input_size:
        out.update({"per_layer_inputs.table.weight": matrix(p + "embed_tokens_per_layer.weight"),
                    "per_layer_inputs.per_layer_model_proj.weight": matrix(p + "per_layer_model_projection.weight"),
                    "per_layer_inputs.norm.weight": take(p + "per_layer_projection_norm.weight")})
    for i in range(cfg.num_layers):
        src, o = f"{p}layers.{i}.", f"layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        if cfg.num_experts:
            norms += ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]
        if cfg.per_layer_input_size:
            norms.append("post_per_layer_input_norm")
        out.update({o + n + ".weight": take(src + n + ".weight") for n in norms})
        out[o + "layer_scalar"] = take(src + "layer_scalar")
        a = src + "self_attn."
        out[o + "self_attn.q_norm.weight"] = take(a + "q_norm.weight")
        if cfg.kv_source(i) == i:
            parts = "qk" if cfg.k_eq_v and not cfg.window(i) else "qkv"
            out[o + "self_attn.qkv_proj.weight"] = matrix(*(a + f"{x}_proj.weight" for x in parts))
            out[o + "self_attn.k_norm.weight"] = take(a + "k_norm.weight")
        else:
            out[o + "self_attn.q_proj.weight"] = matrix(a + "q_proj.weight")
        out[o + "self_attn.o_proj.weight"] = matrix(a + "o_proj.weight")
        out[o + "mlp.gate_up_proj.weight"] = matrix(src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight")
        out[o + "mlp.down_proj.weight"] = matrix(src + "mlp.down_proj.weight")
        if cfg.per_layer_input_size:
            out[o + "per_layer_gate_proj.weight"] = matrix(src + "per_layer_input_gate.weight")
            out[o + "per_layer_out_proj.weight"] = matrix(src + "per_layer_projection.weight")
        if cfg.num_experts:
            out[o + "router_norm.weight"] = take(src + "router.scale") * cfg.hidden_size**-0.5
            out[o + "moe.router.weight"] = take(src + "router.proj.weight")
            out[o + "moe.expert_scale"] = take(src + "router.per_expert_scale")
            gate_up, down = experts(src + "experts.gate_up_proj"), experts(src + "experts.down_proj")
            for e in range(cfg.num_experts):
                out[o + f"moe.experts.{e}.gate_up_proj.weight"] = gate_up[e]
                out[o + f"moe.experts.{e}.down_proj.weight"] = down[e]
    return out
