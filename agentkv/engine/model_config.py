"""What the network is: `ModelConfig`, read from an HF `config.json` (GGUF metadata is turned into one
by engine/gguf_convert.py), frozen and passed down to the model code, the KV pool and the loader."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from agentkv.engine.model_families import (
    ARCHITECTURE_OF,
    MODEL_TYPES,
    MOE_FAMILIES,
    SUPPORTED_ARCHITECTURES,
    family_fields,
    layer_windows,
)
from agentkv.engine.rope_config import RopeScaling, rope_params, rope_scaling, rotary_dim
from agentkv.errors import ModelLoadError

__all__ = ["MOE_FAMILIES", "SUPPORTED_ARCHITECTURES", "ModelConfig", "RopeScaling"]

@dataclass(frozen=True)
class ModelConfig:
    family: Literal["llama", "phi3", "gemma2", "gemma3", "gemma4", "qwen2", "qwen3", "smollm3", "granite", "glm4",
                    "lfm2", "qwen3_moe", "qwen2_moe", "mixtral", "granitemoe", "glm4_moe", "gpt_oss", "deepseek_v3"]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # RMSNorm on q and k per head (Qwen3)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rotary_dim: int = 0  # the leading dims of each head that rotate (partial_rotary_factor); 0: all of head_dim
    # a mixture of experts (0 experts: a dense model): each token's MLP is the weighted sum of the
    # `experts_per_token` experts its router scores highest (softmax, then top-k, renormalized where
    # `norm_topk_prob`), plus a shared expert (in Qwen2-MoE gated by a sigmoid). The "sigmoid_groups"
    # router (DeepSeek-V3's, GLM-4.5's) scores by sigmoid, chooses by the scores plus a correction bias
    # among the experts of the `expert_groups_chosen` best of `expert_groups` groups, and scales the
    # chosen weights by `routed_scaling_factor`
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    shared_expert_gated: bool = False
    router: Literal["softmax", "sigmoid_groups", "gemma4"] = "softmax"
    expert_groups: int = 1
    expert_groups_chosen: int = 1
    routed_scaling_factor: float = 1.0
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead (Qwen's mlp_only_layers, decoder_sparse_step)
    # sliding-window attention: per layer, how many keys (the query's own included) a query sees;
    # 0 (or no entry) is full attention. Mistral v0.1 and Mixtral window every layer; Qwen2 with
    # use_sliding_window the layers from max_window_layers on; `layer_types` says it per layer.
    layer_windows: tuple[int, ...] = ()
    hidden_act: str = "silu"  # the MLP's gate activation: "silu", "gelu_tanh" (Gemma's GeGLU), "swiglu_clamped"
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    local_rope_theta: float = 0.0  # the windowed layers' own rope base (Gemma 3), default rope; 0: as the others
    attn_softcap: float = 0.0  # > 0: attention scores capped to c * tanh(s / c) (Gemma 2)
    final_softcap: float = 0.0  # > 0: the logits capped the same way (Gemma 2)
    nope_layers: tuple[int, ...] = ()  # layers whose attention does not rotate (SmolLM3's every 4th)
    rope_interleaved: bool = False  # the checkpoint rotates adjacent pairs (GLM-4); the loader reorders q/k for it
    # Granite's multipliers: embeddings times the first, each attention and MLP output times the second
    # before it joins the residual, logits divided by the third (the score scale is attention_scale)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # a hybrid (LFM2): these layers are gated short convolutions of `conv_kernel` taps instead of
    # attention; each token's convolution input is what the KV pool keeps for it there
    conv_layers: tuple[int, ...] = ()
    conv_kernel: int = 0
    conv_bias: bool = False
    # gpt-oss: a learned logit per query head in each softmax's sum; biases on o_proj, the router and
    # the MLPs (its experts); the "swiglu_clamped" activation's limit and alpha
    attention_sinks: bool = False
    o_proj_bias: bool = False
    router_bias: bool = False
    mlp_bias: bool = False
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    # multi-head latent attention (DeepSeek-V3) where kv_lora_rank > 0: head_dim is then the rotated part
    # shared by all heads (qk_rope_head_dim); the pool keeps each token's latent and that part
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: q from one matrix
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Gemma 4: its full-attention layers' head width and KV heads (0: head_dim, num_kv_heads), their values
    # the keys' projection before its norm and rotation (k_eq_v); the last `kv_shared_layers` layers attend
    # over the KV of the last earlier layer of their kind (and have no K/V of their own); each layer's
    # per-layer input (`per_layer_input_size` wide, from a table of `per_layer_vocab` rows and the
    # embedding); the shared layers' MLP twice as wide (double_wide_mlp)
    global_head_dim: int = 0
    global_kv_heads: int = 0
    k_eq_v: bool = False
    kv_shared_layers: int = 0
    per_layer_input_size: int = 0
    per_layer_vocab: int = 0
    double_wide_mlp: bool = False

    def attention_config(self, layer: int) -> ModelConfig:
        """The config a layer's attention sees: Gemma 4's full layers their own head width and KV heads."""
        if self.window(layer) or not (self.global_head_dim or self.global_kv_heads):
            return self
        return dataclasses.replace(self, head_dim=self.global_head_dim or self.head_dim,
                                   num_kv_heads=self.global_kv_heads or self.num_kv_heads)

    def kv_source(self, layer: int) -> int:
        """The layer whose KV `layer` attends over: itself, or for Gemma 4's shared layers the last
        layer before them of the same kind (windowed or full)."""
        first = self.num_layers - self.kv_shared_layers
        if layer < first:
            return layer
        windowed = bool(self.window(layer))
        return max(i for i in range(first) if bool(self.window(i)) == windowed)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    def is_conv_layer(self, layer: int) -> bool:
        return layer in self.conv_layers

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if layer < len(self.layer_windows) else 0

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if cfg.get("text_config") and any(a.startswith("Gemma4") for a in archs):  # the language model alone
            cfg = {**cfg["text_config"], "architectures": archs,
                   "tie_word_embeddings": cfg.get("tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings"))}
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            model_type = cfg.get("model_type")
            family = MODEL_TYPES.get(model_type)
        if family is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; agentkv implements "
                f"{sorted(SUPPORTED_ARCHITECTURES)}. Point --model at a checkpoint of one of them."
            )
        partial = float(rope_params(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            head_dim = cfg.get("head_dim") or hidden // heads
            fields = dict(
                family=family,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_params(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0))),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=family == "qwen2" or family == "qwen2_moe" and bool(cfg.get("qkv_bias", True))
                or bool(cfg.get("attention_bias", False)),
                qk_norm=family in ("qwen3", "qwen3_moe"),
                rope_scaling=rope_scaling(cfg) if family not in ("gemma3", "gemma4") else RopeScaling(),
                rotary_dim=rotary_dim(int(head_dim), partial),
                layer_windows=layer_windows(archs, cfg),
            )
            return cls(**{**fields, **family_fields(family, cfg)})
        except KeyError as e:
            raise ModelLoadError(f"config.json lacks the field {e.args[0]!r} that a {family} model needs") from None

    def to_hf(self) -> dict[str, Any]:
        """A config.json that `from_hf` reads back (used by the GGUF conversion cache)."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURE_OF[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
        }
        if self.rope_scaling.rope_type != "default":
            rs = {k: v for k, v in dataclasses.asdict(self.rope_scaling).items() if v is not None}
            out["rope_scaling"] = rs
        if self.rotary_dim or self.family in ("glm4", "glm4_moe"):  # (GLM's default is half)
            out["partial_rotary_factor"] = (self.rotary_dim or self.head_dim) / self.head_dim
        if any(self.layer_windows):
            out["sliding_window"] = max(self.layer_windows)
            out["layer_types"] = ["sliding_attention" if w else "full_attention" for w in self.layer_windows]
            out["use_sliding_window"] = True  # (Qwen reads the window only with it)
        if self.family in ("gemma2", "gemma3"):
            out.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=self.attention_scale ** -2,
                       attn_logit_softcapping=self.attn_softcap or None,
                       final_logit_softcapping=self.final_softcap or None)
            if self.family == "gemma3":
                out.update(rope_local_base_freq=self.local_rope_theta)
        if self.family == "gemma4":
            out.update(self._gemma4_hf())
        if self.num_experts and self.family != "gemma4":
            out.update(self._moe_hf())
        if self.nope_layers or self.family == "smollm3":  # (SmolLM3's config without it means every 4th)
            out["no_rope_layers"] = [int(i not in self.nope_layers) for i in range(self.num_layers)]
        if self.family in ("granite", "granitemoe"):
            out.update(embedding_multiplier=self.embedding_multiplier, residual_multiplier=self.residual_multiplier,
                       attention_multiplier=self.attention_scale, logits_scaling=self.logits_scaling)
        if self.family == "glm4_moe":
            out["use_qk_norm"] = self.qk_norm
        if self.family == "glm4":
            out["rope_interleaved"] = self.rope_interleaved
        if self.family == "gpt_oss":
            out.update(swiglu_limit=self.swiglu_limit, swiglu_alpha=self.swiglu_alpha)
        if self.family == "deepseek_v3":
            out.update(kv_lora_rank=self.kv_lora_rank, q_lora_rank=self.q_lora_rank or None,
                       qk_nope_head_dim=self.qk_nope_head_dim, qk_rope_head_dim=self.head_dim,
                       v_head_dim=self.v_head_dim, rope_interleave=self.rope_interleaved)
        if self.family == "lfm2":
            kinds = ["conv" if i in self.conv_layers else "full_attention" for i in range(self.num_layers)]
            out.update(layer_types=kinds,
                       conv_L_cache=self.conv_kernel, conv_bias=self.conv_bias, norm_eps=self.rms_norm_eps,
                       block_auto_adjust_ff_dim=False)
        return out

    def _gemma4_hf(self) -> dict[str, Any]:
        rs = self.rope_scaling
        glob = {"rope_type": "default", "rope_theta": self.rope_theta} if rs.rope_type == "default" else {
            "rope_type": "proportional", "rope_theta": self.rope_theta, "partial_rotary_factor": rs.proportion,
            "factor": rs.factor}
        full = [i for i in range(self.num_layers) if not self.window(i)]
        out: dict[str, Any] = {
            "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": self.final_softcap or None,
            "rope_parameters": {"full_attention": glob,
                                "sliding_attention": {"rope_type": "default", "rope_theta": self.local_rope_theta}},
            "per_layer_config": {str(i): {"head_dim": self.global_head_dim or self.head_dim,
                                          "num_key_value_heads": self.global_kv_heads or self.num_kv_heads}
                                 for i in full},
            "attention_k_eq_v": self.k_eq_v, "num_kv_shared_layers": self.kv_shared_layers,
            "hidden_size_per_layer_input": self.per_layer_input_size,
            "vocab_size_per_layer_input": self.per_layer_vocab, "use_double_wide_mlp": self.double_wide_mlp}
        if self.num_experts:
            out.update(enable_moe_block=True, num_experts=self.num_experts, top_k_experts=self.experts_per_token,
                       moe_intermediate_size=self.moe_intermediate_size)
        return out

    def _moe_hf(self) -> dict[str, Any]:
        count = {"mixtral": "num_local_experts", "granitemoe": "num_local_experts", "glm4_moe": "n_routed_experts",
                 "gpt_oss": "num_local_experts", "deepseek_v3": "n_routed_experts"}
        out: dict[str, Any] = {
            count.get(self.family, "num_experts"): self.num_experts, "num_experts_per_tok": self.experts_per_token,
            "norm_topk_prob": self.norm_topk_prob, "moe_intermediate_size": self.moe_intermediate_size,
            "mlp_only_layers": list(self.dense_layers),
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size}
        if self.family in ("mixtral", "granitemoe", "gpt_oss"):
            out["intermediate_size"] = self.moe_intermediate_size
        if self.family in ("glm4_moe", "deepseek_v3"):  # (its dense layers are the first ones)
            out.update(n_group=self.expert_groups, topk_group=self.expert_groups_chosen,
                       routed_scaling_factor=self.routed_scaling_factor, first_k_dense_replace=len(self.dense_layers),
                       n_shared_experts=self.shared_expert_intermediate_size // self.moe_intermediate_size)
        return out


