"""What the network is: `ModelConfig`, read from an HF `config.json` (GGUF metadata is turned into one
by engine/gguf_convert.py), frozen and passed down to the model code, the KV pool and the loader."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from agentkv.errors import ModelLoadError

# HF `architectures` names we implement, and the family each maps to.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",  # Llama's layers, q/k/v and gate/up fused in the checkpoint
    # Gemma 3 (text): norms around attention and MLP, GeGLU, q/k norm, scaled embeddings, windowed
    # layers with their own rope base
    "Gemma3ForCausalLM": "gemma3",
    "Gemma2ForCausalLM": "gemma2",  # Gemma 3's layer without q/k norm, with soft-capped scores and logits
    # mixtures of experts: the attention of the dense family, a routed MoE block for the MLP
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
}
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None  # (yarn, longrope) None: from the factor, as HF computes it
    # longrope (Phi-3 128k, Phi-4-mini): per-frequency divisors, `short_factor` for positions before
    # original_max_position_embeddings and `long_factor` from there on (see rope.inv_frequencies)
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    family: Literal["llama", "phi3", "gemma2", "gemma3", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral"]
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
    # `norm_topk_prob`), plus, in Qwen2-MoE, a shared expert gated by a sigmoid
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead (Qwen's mlp_only_layers, decoder_sparse_step)
    # sliding-window attention: per layer, how many keys (the query's own included) a query sees;
    # 0 (or no entry) is full attention. Mistral v0.1 and Mixtral window every layer; Qwen2 with
    # use_sliding_window the layers from max_window_layers on; `layer_types` says it per layer.
    layer_windows: tuple[int, ...] = ()
    hidden_act: str = "silu"  # the MLP's gate activation: "silu", or "gelu_tanh" (Gemma's GeGLU)
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    local_rope_theta: float = 0.0  # the windowed layers' own rope base (Gemma 3), default rope; 0: as the others
    attn_softcap: float = 0.0  # > 0: attention scores capped to c * tanh(s / c) (Gemma 2)
    final_softcap: float = 0.0  # > 0: the logits capped the same way (Gemma 2)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if layer < len(self.layer_windows) else 0

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            model_type = cfg.get("model_type")
            family = {"llama": "llama", "mistral": "llama", "phi3": "phi3", "gemma3_text": "gemma3", "gemma2": "gemma2",
                      "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen2_moe",
                      "mixtral": "mixtral"}.get(model_type)
        if family is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; agentkv implements "
                f"{sorted(SUPPORTED_ARCHITECTURES)}. Point --model at a Llama, Mistral, Phi-3, Gemma 2 or 3, Qwen2, "
                "Qwen3, Qwen2-MoE, Qwen3-MoE or Mixtral checkpoint."
            )
        partial = float(_rope_params(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
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
                rope_theta=float(_rope_params(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0))),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=family == "qwen2" or family == "qwen2_moe" and bool(cfg.get("qkv_bias", True))
                or bool(cfg.get("attention_bias", False)),
                qk_norm=family in ("qwen3", "qwen3_moe"),
                rope_scaling=_rope_scaling(cfg) if family != "gemma3" else RopeScaling(),
                rotary_dim=_rotary_dim(int(head_dim), partial),
                layer_windows=_windows(archs, cfg),
            )
            return cls(**{**fields, **_moe(family, cfg), **_gemma(family, cfg)})
        except KeyError as e:
            raise ModelLoadError(f"config.json lacks the field {e.args[0]!r} that a {family} model needs") from None

    def to_hf(self) -> dict[str, Any]:
        """A config.json that `from_hf` reads back (used by the GGUF conversion cache)."""
        arch = {"llama": "LlamaForCausalLM", "phi3": "Phi3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                "mixtral": "MixtralForCausalLM", "gemma3": "Gemma3ForCausalLM",
                "gemma2": "Gemma2ForCausalLM"}[self.family]
        out: dict[str, Any] = {
            "architectures": [arch],
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
        if self.rotary_dim:
            out["partial_rotary_factor"] = self.rotary_dim / self.head_dim
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
        if self.num_experts:
            out.update({"num_local_experts" if self.family == "mixtral" else "num_experts": self.num_experts,
                        "num_experts_per_tok": self.experts_per_token, "norm_topk_prob": self.norm_topk_prob,
                        "moe_intermediate_size": self.moe_intermediate_size, "mlp_only_layers": list(self.dense_layers),
                        "shared_expert_intermediate_size": self.shared_expert_intermediate_size})
            if self.family == "mixtral":
                out["intermediate_size"] = self.moe_intermediate_size
        return out


def _windows(archs: list[str], cfg: dict[str, Any]) -> tuple[int, ...]:
    """Each layer's attention window (0: full), as transformers reads the config: `layer_types`
    where given; else Mistral, Mixtral and Phi-3 window every layer by `sliding_window`, and Qwen2 / Qwen3
    (and their MoE) the layers from `max_window_layers` on where `use_sliding_window` is set. A
    Llama config's `sliding_window` is not read (LlamaForCausalLM has none)."""
    window, layers = int(cfg.get("sliding_window") or 0), int(cfg["num_hidden_layers"])
    if not window:
        return ()
    model_type = cfg.get("model_type", "")
    if any(a.startswith(("Qwen2", "Qwen3")) for a in archs) or model_type.startswith(("qwen2", "qwen3")):
        if not cfg.get("use_sliding_window"):
            return ()
        types = cfg.get("layer_types") or ["sliding_attention" if i >= int(cfg.get("max_window_layers", 0)) else
                                           "full_attention" for i in range(layers)]
    elif cfg.get("layer_types"):
        types = cfg["layer_types"]
    elif (
        "Gemma3ForCausalLM" in archs
        or model_type == "gemma3_text"
        or "Gemma2ForCausalLM" in archs
        or model_type == "gemma2"
    ):  # every `sliding_window_pattern`-th layer full (Gemma 2: every other)
        pattern = int(
            cfg.get("sliding_window_pattern") or (2 if "gemma2" in model_type or "Gemma2ForCausalLM" in archs else 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    elif any(a in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM") for a in archs) or model_type in (
        "mistral", "mixtral", "phi3"):
        types = ["sliding_attention"] * layers
    else:
        return ()
    windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    return windows if any(windows) else ()


def _gemma(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's fields: GeGLU, the attention scale, q/k norm, and per layer type its rope (the global
    layers' `rope_theta` and scaling, the windowed layers' `rope_local_base_freq`); transformers 5
    writes both under `rope_parameters` by layer type."""
    if family == "gemma2":  # one rope for every layer, soft caps on scores and logits
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ModelLoadError(f"Gemma 2 with activation {act!r} is not implemented (gelu_pytorch_tanh is)")
        return {"hidden_act": "gelu_tanh", "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
                "attention_scale": float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or 256) ** -0.5,
                "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
                "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0)}
    if family != "gemma3":
        return {}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):  # (Gemma 3 has none; a config that sets them is not one transformers writes)
            raise ModelLoadError(f"{key}={cfg[key]} with Gemma 3 is not implemented")
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError("use_bidirectional_attention (an embedding model) is not a causal LM agentkv serves")
    params = cfg.get("rope_parameters") or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    if (local.get("rope_type") or "default") != "default":
        raise ModelLoadError(f"Gemma 3 windowed layers with rope {local.get('rope_type')!r} are not implemented")
    glob = {**(cfg.get("rope_scaling") or {}), **full}
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"Gemma 3 with activation {act!r} is not implemented (gelu_pytorch_tanh is)")
    return {"hidden_act": "gelu_tanh", "qk_norm": True,
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
            "attention_scale": float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or 256) ** -0.5,
            "rope_theta": float(glob.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
            "rope_scaling": _rope_scaling({"rope_scaling": glob}) if glob else RopeScaling(),
            "local_rope_theta": float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)))}


def _moe(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields of a config.json (none for a dense family)."""
    if family not in MOE_FAMILIES:
        return {}
    n = int(cfg.get("num_local_experts" if family == "mixtral" else "num_experts") or 0)
    if n < 1:
        raise ModelLoadError(f"a {family} config.json needs its number of experts (num_experts / num_local_experts)")
    layers = int(cfg["num_hidden_layers"])
    if family == "mixtral":
        dense: tuple[int, ...] = ()
        width, norm = int(cfg["intermediate_size"]), True
    else:  # Qwen: mlp_only_layers, and every decoder_sparse_step-th layer sparse
        step, only = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
        width, norm = int(cfg["moe_intermediate_size"]), bool(cfg.get("norm_topk_prob", False))
    k = int(cfg.get("num_experts_per_tok") or 2)
    if not 1 <= k <= n:
        raise ModelLoadError(f"num_experts_per_tok={k} must be between 1 and the {n} experts")
    return {"num_experts": n, "experts_per_token": k, "moe_intermediate_size": width, "norm_topk_prob": norm,
            "shared_expert_intermediate_size": int(cfg.get("shared_expert_intermediate_size") or 0)
            if family == "qwen2_moe" else 0, "dense_layers": dense}


def _rope_params(cfg: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 writes `rope_parameters`; older configs write `rope_scaling` (+ `rope_theta`).
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return {} if "full_attention" in params else params  # (Gemma 3's per layer type: read by _gemma)


def _rope_scaling(cfg: dict[str, Any]) -> RopeScaling:
    rs = _rope_params(cfg)
    rope_type = rs.get("rope_type") or rs.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"unsupported rope scaling {rope_type!r}; agentkv implements {SUPPORTED_ROPE_TYPES}")
    known = {f.name for f in dataclasses.fields(RopeScaling)}
    kwargs = {k: v for k, v in rs.items() if k in known}
    kwargs["rope_type"] = rope_type
    if rope_type == "longrope":
        # Phi-3 keeps the pretrained length beside the rope parameters; without a `factor`, HF takes the
        # ratio of the two lengths (what sets the attention factor)
        original = rs.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
        if not original or not rs.get("short_factor") or not rs.get("long_factor"):
            raise ModelLoadError(
                "longrope needs original_max_position_embeddings, short_factor and long_factor "
                "in the config; this one lacks some"
            )
        kwargs.update(
            original_max_position_embeddings=int(original), short_factor=tuple(map(float, rs["short_factor"])),
            long_factor=tuple(map(float, rs["long_factor"])),
            factor=float(rs.get("factor") or int(cfg.get("max_position_embeddings", original)) / int(original)))
    return RopeScaling(**kwargs)


def _rotary_dim(head_dim: int, partial: float) -> int:
    """The rotated dims of a head under partial_rotary_factor (0: all); an even count, as HF's int()."""
    if partial == 1.0:
        return 0
    dim = int(head_dim * partial)
    if not 0 < dim <= head_dim or dim % 2:
        raise ModelLoadError(f"partial_rotary_factor={partial} of head_dim {head_dim} gives {dim} rotated dims; "
                             "it must be an even count between 2 and head_dim")
    return dim
