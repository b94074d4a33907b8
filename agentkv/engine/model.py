"""Our Llama-family network (Llama, Mistral, Phi-3, Qwen2 with QKV bias, Qwen3 with q/k norm), its
mixture-of-experts kin (Qwen3-MoE, Qwen2-MoE with a shared expert, Mixtral), whose MLP is MoE, and
Gemma 2 and 3 (norms around attention and MLP, GeGLU, scaled embeddings; Gemma 2's soft caps, Gemma
3's rope base per layer type).

Tokens of all requests in a step are one flat run [T]; attention reads and writes the paged KV pool
through the backend, so the model never sees requests or the scheduler. q/k/v and gate/up are fused
into single matmuls: on CPU, per-op overhead dominates a small model's decode step.

The linears (linear.py) add the residual inside the o and down projections' matmuls. On CPU, when
`finalize` is given agentkv's C kernels (kernels/cpu_native.py), the linears run on weights packed
for them (or a GGUF's quantized blocks) and the element-wise steps (RMSNorm, silu * up, the
rotation) are one call each instead of 3-8 torch ops.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from agentkv.engine.linear import (
    Linear,
    LogitsProjection,
    QuantEmbedding,
    physical_memory,
    tiled,
)
from agentkv.engine.lora.apply import LoraBatch
from agentkv.engine.model_config import ModelConfig, RopeScaling
from agentkv.engine.rope import RopeTables, RotaryEmbedding
from agentkv.kernels.base import AttentionBackend
from agentkv.kernels.cpu_native import NativeKernels
from agentkv.kernels.cpu_quant import QuantWeight

__all__ = ["CausalLM", "ForwardContext", "Linear", "LogitsProjection", "QuantEmbedding", "RMSNorm"]


@dataclass
class ForwardContext:
    """What one forward pass needs besides token ids: positions, the backend, the KV buffers."""

    positions: torch.Tensor  # [T] int64
    backend: AttentionBackend  # already prepared for this pass
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: [num_slots, KVH, D] each
    rope: RopeTables | None = None  # set once per pass
    # bool [T]: the prompt's tokens, which tiled quantized weights compute exactly (linear.by_row_kind)
    exact_rows: torch.Tensor | None = None
    lora: LoraBatch | None = None  # the pass's LoRA adapters, each row's update added to the linears' outputs


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.native: NativeKernels | None = None  # set by CausalLM.finalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and self.native.handles(x):  # one call; rounds as below
            return self.native.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:  # one fused op; same math as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # normalized in fp32 and cast back before the weight, as HF does, so bf16 outputs match it
        # bit for bit (rms_norm without a weight computes in fp32 and rounds once: 2 ops, not 8)
        return self.weight * F.rms_norm(x, self.weight.shape, None, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.attention_scale or cfg.head_dim**-0.5
        self.window = cfg.window(layer_id)  # keys a query sees (its own included); 0: all before it
        self.softcap = cfg.attn_softcap

    def forward(self, x: torch.Tensor, ctx: ForwardContext, rope: RotaryEmbedding,
                residual: torch.Tensor | None) -> torch.Tensor:
        """residual + attention(x): the residual is added by the output projection (attention(x)
        alone where residual is None)."""
        T = x.shape[0]
        qkv = self.qkv_proj(x, exact_rows=ctx.exact_rows)
        if ctx.lora is not None:
            ctx.lora.add(self.layer_id, "qkv", x, qkv)
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:
            # q and k are adjacent in the fused output: rotate them as one run of heads (half the ops)
            qk = qkv[:, : self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
            qk = rope.apply_one(ctx.rope, qk)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        else:
            q = self.q_norm(qkv[:, : self.q_size].view(T, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size : self.q_size + self.kv_size].view(T, self.num_kv_heads, self.head_dim))
            q, k = rope.apply_one(ctx.rope, q), rope.apply_one(ctx.rope, k)
        k_cache, v_cache = ctx.kv_caches[self.layer_id]
        attn = ctx.backend.forward(q, k, v, k_cache, v_cache, self.scale, self.window, self.softcap)
        out = self.o_proj(attn, residual, exact_rows=ctx.exact_rows)
        if ctx.lora is not None:  # (after the residual, as the native step adds it)
            ctx.lora.add(self.layer_id, "o", attn, out)
        return out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, width: int | None = None, layer_id: int | None = None):
        super().__init__()
        self.layer_id = layer_id  # None: an expert (LoRA adapters do not target experts)
        self.intermediate = width or cfg.intermediate_size
        self.gelu = cfg.hidden_act == "gelu_tanh"  # GeGLU (Gemma) instead of SwiGLU
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.intermediate)
        self.down_proj = Linear(self.intermediate, cfg.hidden_size)
        self.native: NativeKernels | None = None  # set by CausalLM.finalize

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                exact_rows: torch.Tensor | None = None, lora: LoraBatch | None = None) -> torch.Tensor:
        """residual + mlp(x) (mlp(x) where residual is None); `lora`: the pass's adapters' updates."""
        gate_up = self.gate_up_proj(x, exact_rows=exact_rows)
        if lora is not None:
            lora.add(self.layer_id, "gate_up", x, gate_up)
        if self.native is not None and self.native.handles(gate_up):  # (the native step's own body)
            act = self.native.glu_mul(gate_up, self.gelu)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            act = (F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up
        out = self.down_proj(act, residual, exact_rows)
        if lora is not None:
            lora.add(self.layer_id, "down", act, out)
        return out


class MoE(nn.Module):
    """A routed mixture of experts: each token goes to the `experts_per_token` experts its router
    scores highest (softmax over all experts, top-k, renormalized where the family does), and its
    output is their weighted sum (plus Qwen2-MoE's shared expert, gated by a sigmoid).

    The experts run grouped: the step's (token, expert) pairs are sorted by expert and each expert
    that has tokens runs once on all of them (one gate_up and one down matmul per expert with work),
    then its rows are added back where they came from. Each expert is an `MLP` of `Linear`s, so its
    weights are packed for the CPU kernels like any other linear."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.experts_per_token, cfg.norm_topk_prob
        self.router = Linear(cfg.hidden_size, cfg.num_experts)
        self.experts = nn.ModuleList(MLP(cfg, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))
        shared = cfg.shared_expert_intermediate_size
        self.shared = MLP(cfg, shared) if shared else None
        self.shared_gate = Linear(cfg.hidden_size, 1) if shared else None
        self.all_reduce = False  # tensor parallelism: each rank's experts hold a slice of their width

    def forward(self, x: torch.Tensor, residual: torch.Tensor, exact_rows: torch.Tensor | None = None) -> torch.Tensor:
        """residual + moe(x)."""
        probs = torch.softmax(self.router(x, exact_rows=exact_rows).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype).flatten()
        pairs = chosen.flatten()
        order = pairs.argsort(stable=True)  # the (token, expert) pairs grouped by expert
        counts = torch.bincount(pairs, minlength=len(self.experts)).tolist()  # one read of the routing per layer
        out = torch.zeros_like(residual)  # the experts summed first, then the residual, as HF rounds in bf16
        start = 0
        for expert, n in zip(self.experts, counts):
            if n:
                picked = order[start : start + n]
                rows = picked // self.top_k
                kinds = None if exact_rows is None else exact_rows[rows]
                out.index_add_(0, rows, expert(x[rows], None, kinds) * weights[picked, None])
                start += n
        if self.shared is not None:
            out += torch.sigmoid(self.shared_gate(x, exact_rows=exact_rows)) * self.shared(x, None, exact_rows)
        if self.all_reduce:  # the experts' partial sums, once for the block (routing is the same on every rank)
            torch.distributed.all_reduce(out)
        return residual + out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(layer_id) else MLP(cfg, layer_id=layer_id)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, rope: RotaryEmbedding) -> torch.Tensor:
        x = self.self_attn(self.input_layernorm(x), ctx, rope, residual=x)
        if isinstance(self.mlp, MoE):  # (adapters' MLP targets are refused on its layers: files.py)
            return self.mlp(self.post_attention_layernorm(x), x, ctx.exact_rows)
        return self.mlp(self.post_attention_layernorm(x), x, ctx.exact_rows, ctx.lora)


class SandwichDecoderLayer(nn.Module):
    """Gemma 2 and 3's layer: a norm before and after attention and before and after the MLP, each
    output normed before it joins the residual."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layer_id=layer_id)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, rope: RotaryEmbedding) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), ctx, rope, residual=None))
        mlp = self.mlp(self.pre_feedforward_layernorm(x), None, ctx.exact_rows, ctx.lora)
        return x + self.post_feedforward_layernorm(mlp)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.config = cfg
        # uninitialized (`_weight`): the checkpoint overwrites it, and a random init of a large table is slow
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        layer = SandwichDecoderLayer if cfg.family in ("gemma2", "gemma3") else DecoderLayer
        self.layers = nn.ModuleList(layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg, max_positions)
        # Gemma 3's windowed layers rotate with their own base (and no scaling)
        self.local_rope = (
            RotaryEmbedding(
                dataclasses.replace(cfg, rope_theta=cfg.local_rope_theta, rope_scaling=RopeScaling()), max_positions)
            if cfg.local_rope_theta
            else None
        )
        self.embed_scale = cfg.hidden_size**0.5 if cfg.family in ("gemma2", "gemma3") else None
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.logits_proj: LogitsProjection | None = None  # built by finalize() once weights are loaded

    def weight_bytes(self) -> int:
        """Bytes the weights take: parameters, quantized blocks, and packed copies (each tensor once)."""
        seen: set[int] = set()

        def size(t) -> int:
            t = getattr(t, "data", t)  # a QuantWeight or PackedLinear holds its tensor in .data
            if not isinstance(t, torch.Tensor):
                return 0
            key = t.data_ptr() if t.layout == torch.strided else id(t)  # oneDNN's packed weights have no data_ptr
            if key in seen:
                return 0
            seen.add(key)
            return t.numel() * t.element_size()

        total = sum(size(p) for p in self.parameters())
        for m in self.modules():  # (a parameter met again here is counted once: `seen`)
            total += sum(size(getattr(m, name, None)) for name in ("quantized", "packed", "native_weight", "weight"))
        return total

    def set_quantized(self, name: str, weight: QuantWeight) -> None:
        """The weight `name` kept in its quantized blocks (the loader, for a GGUF's quantized matrices)."""
        if name == "embed_tokens.weight":
            self.embed_tokens = QuantEmbedding(weight)
        elif name == "lm_head.weight":
            self.lm_head.weight = None
            self.lm_head.quantized = weight
        else:
            self.get_submodule(name.removesuffix(".weight")).set_quantized(weight)

    def finalize(self, native: NativeKernels | None = None) -> None:
        """Pack weights for the CPU kernels; call once after loading and dtype casts. With `native`,
        norms, the MLP's activation and the rotation run as its C kernels."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, MLP, RotaryEmbedding, QuantEmbedding)):
                module.native = native
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        # the batch-1 copy of the weights (see Linear) when it costs at most 1/8 of the machine's memory
        plain_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears if m.weight is not None)
        keep_plain = plain_bytes <= physical_memory() // 8
        for module in linears:
            module.pack(keep_plain, native)
        weight = (
            self.embed_tokens.weight
            if self.lm_head is None
            else getattr(self.lm_head, "quantized", None) or self.lm_head.weight
        )
        if isinstance(weight, QuantWeight) and native is not None:
            weight = tiled(native, weight)  # its only copy: a tied embedding reads its rows from the tiles
            if self.lm_head is None:
                self.embed_tokens.weight = weight
        self.logits_proj = LogitsProjection(weight, native)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext, logits_indices: torch.Tensor) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] (fp32) for the selected token positions of the flat run."""
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:  # rounded to the model's dtype first, as HF does
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        tables = self.rope.tables(ctx.positions, x.dtype)
        local = self.local_rope.tables(ctx.positions, x.dtype) if self.local_rope is not None else None
        for layer in self.layers:
            windowed = local is not None and layer.self_attn.window
            ctx.rope = local if windowed else tables
            x = layer(x, ctx, self.local_rope if windowed else self.rope)
        exact = None if ctx.exact_rows is None else ctx.exact_rows[logits_indices]
        logits = self.logits_proj(self.norm(x[logits_indices]), exact).float()
        if self.config.final_softcap:  # Gemma 2
            logits = torch.tanh(logits / self.config.final_softcap) * self.config.final_softcap
        return logits
