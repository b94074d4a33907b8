"""Our Llama-family network (Llama, Mistral, Phi-3, Qwen2 with QKV bias, Qwen3 with q/k norm, SmolLM3
with layers that do not rotate, Granite with its multipliers), its mixture-of-experts kin (Qwen3-MoE,
Qwen2-MoE with a shared expert, Mixtral, Granite-MoE, GLM-4.5 with DeepSeek-V3's router, gpt-oss with
attention sinks and clamped experts), whose MLP is MoE (mlp.py), the sandwich layer of Gemma 2 and 3
(norms around attention and MLP, GeGLU, scaled embeddings; Gemma 2's soft caps, Gemma 3's rope base per
layer type) and GLM-4, Gemma 4's layer (gemma4.py: per-layer inputs, layers reading earlier layers' KV),
and the layers whose operator is not this attention: DeepSeek-V3's latent attention (latent_attention.py)
and LFM2's short convolutions (short_conv.py).

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
from dataclasses import dataclass, field
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from agentkv.engine.gemma4 import Gemma4Layer, PerLayerInputs
from agentkv.engine.latent_attention import LatentAttention
from agentkv.engine.linear import (
    Linear,
    LogitsProjection,
    QuantEmbedding,
    physical_memory,
    tiled,
)
from agentkv.engine.lora.apply import LoraBatch
from agentkv.engine.mlp import MLP, MoE
from agentkv.engine.model_config import ModelConfig, RopeScaling
from agentkv.engine.model_families import SANDWICH_FAMILIES
from agentkv.engine.rope import RopeTables, RotaryEmbedding
from agentkv.engine.short_conv import ShortConv
from agentkv.kernels.base import AttentionBackend, AttentionMetadata
from agentkv.kernels.cpu_native import NativeKernels
from agentkv.kernels.cpu_quant import QuantWeight

__all__ = ["MLP", "CausalLM", "ForwardContext", "Linear", "LogitsProjection", "MoE", "QuantEmbedding", "RMSNorm"]


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
    backend_meta: AttentionMetadata | None = None  # the pass's slot table and rows (a short convolution reads them)
    conv_taps: tuple[torch.Tensor, torch.Tensor] | None = None  # set by the pass's first short convolution
    # Gemma 4: each KV-writing layer's K/V of this pass, for the layers that read it; the per-layer inputs
    layer_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    per_layer_inputs: torch.Tensor | None = None  # [T, layers, width]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, weighted: bool = True):
        """`weighted` False: no weight of its own (Gemma 4's values'), its ones a buffer the kernels read."""
        super().__init__()
        if weighted:
            self.weight = nn.Parameter(torch.ones(dim))
        else:
            self.register_buffer("weight", torch.ones(dim), persistent=False)
        self.eps = eps
        self.native: NativeKernels | None = None  # set by CausalLM.finalize
        self.fused = None  # kernels/triton_fused.py on a GPU (fused_ops), set by CausalLM.finalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and self.native.handles(x):  # one call; rounds as below
            return self.native.rms_norm(x, self.weight, self.eps)
        if self.fused is not None and self.fused.takes(x):  # one kernel; rounds as below
            return self.fused.rms_norm(x, self.weight, self.eps)
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
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.attention_scale or cfg.head_dim**-0.5
        self.window = cfg.window(layer_id)  # keys a query sees (its own included); 0: all before it
        self.softcap = cfg.attn_softcap
        self.rotates = layer_id not in cfg.nope_layers  # (SmolLM3's every 4th layer attends without rope)
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None  # gpt-oss

    def forward(self, x: torch.Tensor, ctx: ForwardContext, rope: RotaryEmbedding,
                residual: torch.Tensor | None) -> torch.Tensor:
        """residual + attention(x): the residual is added by the output projection (attention(x)
        alone where residual is None)."""
        T = x.shape[0]
        qkv = self.qkv_proj(x, exact_rows=ctx.exact_rows)
        if ctx.lora is not None:
            ctx.lora.add(self.layer_id, "qkv", x, qkv)
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
        if not self.rotates:
            q = qkv[:, : self.q_size].view(T, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
        elif self.q_norm is None:
            # q and k are adjacent in the fused output: rotate them as one run of heads (half the ops)
            qk = qkv[:, : self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
            qk = rope.apply_one(ctx.rope, qk)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        else:
            q = self.q_norm(qkv[:, : self.q_size].view(T, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size : self.q_size + self.kv_size].view(T, self.num_kv_heads, self.head_dim))
            q, k = rope.apply_one(ctx.rope, q), rope.apply_one(ctx.rope, k)
        k_cache, v_cache = ctx.kv_caches[self.layer_id]
        attn = ctx.backend.forward(q, k, v, k_cache, v_cache, self.scale, self.window, self.softcap, self.sinks)
        out = self.o_proj(attn, residual, exact_rows=ctx.exact_rows)
        if ctx.lora is not None:  # (after the residual, as the native step adds it)
            ctx.lora.add(self.layer_id, "o", attn, out)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # (LFM2's short convolution layers: the operator in attention's place; DeepSeek-V3's latent attention)
        self.self_attn = (ShortConv(cfg, layer_id) if cfg.is_conv_layer(layer_id) else
                          LatentAttention(cfg, layer_id, RMSNorm) if cfg.kv_lora_rank else Attention(cfg, layer_id))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(layer_id) else MLP(cfg, layer_id=layer_id)
        # Granite: each output scaled before it joins the residual (else the residual is added in the
        # output projection's matmul)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, x: torch.Tensor, ctx: ForwardContext, rope: RotaryEmbedding) -> torch.Tensor:
        m = self.residual_multiplier
        if m != 1.0:
            x = x + self.self_attn(self.input_layernorm(x), ctx, rope, residual=None) * m
            return x + self._mlp(self.post_attention_layernorm(x), None, ctx) * m
        x = self.self_attn(self.input_layernorm(x), ctx, rope, residual=x)
        return self._mlp(self.post_attention_layernorm(x), x, ctx)

    def _mlp(self, x: torch.Tensor, residual: torch.Tensor | None, ctx: ForwardContext) -> torch.Tensor:
        if isinstance(self.mlp, MoE):  # (adapters' MLP targets are refused on its layers: files.py)
            return self.mlp(x, residual, ctx.exact_rows)
        return self.mlp(x, residual, ctx.exact_rows, ctx.lora)


class SandwichDecoderLayer(nn.Module):
    """Gemma 2 and 3's layer, and GLM-4's: a norm before and after attention and before and after the
    MLP, each output normed before it joins the residual."""

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
        if cfg.family == "gemma4":
            self.layers = nn.ModuleList(Gemma4Layer(cfg, i, RMSNorm) for i in range(cfg.num_layers))
        else:
            layer = SandwichDecoderLayer if cfg.family in SANDWICH_FAMILIES else DecoderLayer
            self.layers = nn.ModuleList(layer(cfg, i) for i in range(cfg.num_layers))
        self.per_layer_inputs = PerLayerInputs(cfg, RMSNorm) if cfg.per_layer_input_size else None
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # (Gemma 4's full layers: their own head width)
        self.rope = RotaryEmbedding(dataclasses.replace(cfg, head_dim=cfg.global_head_dim or cfg.head_dim),
                                    max_positions)
        # Gemma 3's windowed layers rotate with their own base (and no scaling)
        self.local_rope = (
            RotaryEmbedding(
                dataclasses.replace(cfg, rope_theta=cfg.local_rope_theta, rope_scaling=RopeScaling()), max_positions)
            if cfg.local_rope_theta
            else None
        )
        self.embed_scale = cfg.hidden_size**0.5 if cfg.family in ("gemma2", "gemma3", "gemma4") else None
        self.embedding_multiplier = cfg.embedding_multiplier  # Granite's
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
        elif name == "per_layer_inputs.table.weight":  # (Gemma 4's: a row a token, read as an embedding's)
            self.per_layer_inputs.table = QuantEmbedding(weight)
        elif name == "lm_head.weight":
            self.lm_head.weight = None
            self.lm_head.quantized = weight
        else:
            self.get_submodule(name.removesuffix(".weight")).set_quantized(weight)

    def finalize(self, native: NativeKernels | None = None, fused: ModuleType | None = None) -> None:
        """Pack weights for the CPU kernels; call once after loading and dtype casts. With `native`,
        norms, the MLP's activation and the rotation run as its C kernels; with `fused` (a GPU's
        kernels/triton_fused.py), as its Triton kernels."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, MLP, MoE, RotaryEmbedding, QuantEmbedding, Gemma4Layer)):
                module.native = native
            if isinstance(module, (RMSNorm, MLP, RotaryEmbedding, Gemma4Layer)):
                module.fused = fused
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
            else:  # (the blocks as read let go)
                self.lm_head.quantized = weight
        self.logits_proj = LogitsProjection(weight, native)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext, logits_indices: torch.Tensor) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] (fp32) for the selected token positions of the flat run."""
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:  # rounded to the model's dtype first, as HF does
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        if self.per_layer_inputs is not None:
            ctx.per_layer_inputs = self.per_layer_inputs(input_ids, x, ctx.exact_rows)
        tables = self.rope.tables(ctx.positions, x.dtype)
        local = self.local_rope.tables(ctx.positions, x.dtype) if self.local_rope is not None else None
        for layer in self.layers:
            windowed = local is not None and getattr(layer.self_attn, "window", 0)
            ctx.rope = local if windowed else tables
            x = layer(x, ctx, self.local_rope if windowed else self.rope)
        exact = None if ctx.exact_rows is None else ctx.exact_rows[logits_indices]
        logits = self.logits_proj(self.norm(x[logits_indices]), exact).float()
        return finish_logits(logits, self.config)


def finish_logits(logits: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """What a family does to the vocabulary projection's output: Gemma 2's cap, Granite's division (both
    keep the order, so the native step's re-scored best logits stay the best)."""
    if cfg.final_softcap:
        logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    if cfg.logits_scaling != 1.0:
        logits = logits / cfg.logits_scaling
    return logits
