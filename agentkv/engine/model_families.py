"""The families agentkv runs, and what each one's config.json says beyond the common fields: which
layers window their attention, Gemma's norms and caps, the mixtures of experts and their routers,
Granite's multipliers, GLM's rotation and SmolLM3's layers without rope. Each reader returns
ModelConfig fields (engine/model_config.py joins them)."""

from __future__ import annotations

from typing import Any

from agentkv.engine.rope_config import RopeScaling, rope_params, rope_scaling, yarn_mscale
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
    # Gemma 4 (text; the multimodal checkpoint's language model): Gemma 3's layer with wider heads in its full
    # layers, values normed, per-layer inputs, the last layers reading earlier layers' KV, optional experts
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "SmolLM3ForCausalLM": "smollm3",  # Llama's layers, every 4th without rope
    "GraniteForCausalLM": "granite",  # Llama's layers with multipliers on embeddings, residuals, scores, logits
    "Glm4ForCausalLM": "glm4",  # the sandwich layer, biased q/k/v, half of each head rotating by adjacent pairs
    # a hybrid: gated short convolutions in most layers, GQA attention with q/k norms in the others
    "Lfm2ForCausalLM": "lfm2",
    # mixtures of experts: the attention of the dense family, a routed MoE block for the MLP
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "GraniteMoeForCausalLM": "granitemoe",  # Granite's multipliers, Mixtral's routing
    # GLM-4.5 / 4.6: DeepSeek-V3's router (sigmoid scores, a correction bias, expert groups) and a
    # shared expert; the first layers dense; half of each head rotating
    "Glm4MoeForCausalLM": "glm4_moe",
    # gpt-oss: attention sinks, every other layer windowed, biased linears, experts with the clamped
    # SwiGLU routed by a softmax over the top k
    "GptOssForCausalLM": "gpt_oss",
    # DeepSeek-V3 and Kimi K2: multi-head latent attention (the pool keeps each token's compressed latent
    # and its rotated key part) and GLM-4.5's router, shared expert and dense first layers
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
# config.json's model_type, where its `architectures` names none of the above
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "phi3": "phi3", "gemma3_text": "gemma3", "gemma2": "gemma2",
               "gemma4_text": "gemma4", "gemma4": "gemma4",
               "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen2_moe",
               "mixtral": "mixtral", "smollm3": "smollm3", "granite": "granite", "granitemoe": "granitemoe",
               "glm4": "glm4", "glm4_moe": "glm4_moe", "lfm2": "lfm2", "gpt_oss": "gpt_oss",
               "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3"}
ARCHITECTURE_OF = {family: arch for arch, family in SUPPORTED_ARCHITECTURES.items()
                   if arch not in ("MistralForCausalLM", "Gemma4ForConditionalGeneration")}
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "granitemoe", "glm4_moe", "gpt_oss", "deepseek_v3")
# a norm after attention and after the MLP too (Gemma 4's layer is its own: engine/gemma4.py)
SANDWICH_FAMILIES = ("gemma2", "gemma3", "glm4")


def family_fields(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields particular to `family`."""
    return {**_moe(family, cfg), **_gemma(family, cfg), **_granite(family, cfg), **_glm(family, cfg),
            **_smollm3(family, cfg), **_lfm2(family, cfg), **_gpt_oss(family, cfg), **_deepseek(family, cfg),
            **_gemma4(family, cfg)}


def layer_windows(archs: list[str], cfg: dict[str, Any]) -> tuple[int, ...]:
    """Each layer's attention window (0: full), as transformers reads the config: `layer_types`
    where given; else Mistral, Mixtral and Phi-3 window every layer by `sliding_window`, and Qwen2 / Qwen3
    (and their MoE) the layers from `max_window_layers` on where `use_sliding_window` is set. A
    Llama config's `sliding_window` is not read (LlamaForCausalLM has none)."""
    window, layers = int(cfg.get("sliding_window") or 0), int(cfg["num_hidden_layers"])
    if not window:
        return ()
    model_type = cfg.get("model_type", "")
    if any(a.startswith(("Qwen2", "Qwen3", "SmolLM3")) for a in archs) or model_type.startswith(
            ("qwen2", "qwen3", "smollm3")):
        if not cfg.get("use_sliding_window"):
            return ()
        if "SmolLM3ForCausalLM" in archs or model_type == "smollm3":  # the layers without rope
            nope = _nope_layers(cfg)
            types = cfg.get("layer_types") or ["sliding_attention" if i in nope else "full_attention"
                                               for i in range(layers)]
        else:
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
            "rope_scaling": rope_scaling({"rope_scaling": glob}) if glob else RopeScaling(),
            "local_rope_theta": float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)))}


def _moe(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields of a config.json (none for a dense family)."""
    if family not in MOE_FAMILIES:
        return {}
    key = {"mixtral": "num_local_experts", "granitemoe": "num_local_experts", "glm4_moe": "n_routed_experts",
           "gpt_oss": "num_local_experts", "deepseek_v3": "n_routed_experts"}
    n = int(cfg.get(key.get(family, "num_experts")) or 0)
    if n < 1:
        raise ModelLoadError(f"a {family} config.json needs its number of experts ({key.get(family, 'num_experts')})")
    layers = int(cfg["num_hidden_layers"])
    dense: tuple[int, ...] = ()
    extra: dict[str, Any] = {}
    if family in ("mixtral", "granitemoe", "gpt_oss"):  # (Granite's, gpt-oss's routing: softmax over the top k)
        width, norm = int(cfg["intermediate_size"]), True
    elif family in ("glm4_moe", "deepseek_v3"):  # (DeepSeek-V3's router, which GLM-4.5 took)
        width, norm = int(cfg["moe_intermediate_size"]), bool(cfg.get("norm_topk_prob", True))
        dense = tuple(range(min(int(cfg.get("first_k_dense_replace", 1)), layers)))
        groups, chosen = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
        if n % groups or not 1 <= chosen <= groups:
            raise ModelLoadError(f"n_group={groups} and topk_group={chosen} do not divide the {n} experts into groups "
                                 "of which topk_group are chosen; the config is inconsistent")
        extra = {"router": "sigmoid_groups", "expert_groups": groups, "expert_groups_chosen": chosen,
                 "routed_scaling_factor": float(cfg.get("routed_scaling_factor") or 1.0),
                 "shared_expert_intermediate_size": width * int(cfg.get("n_shared_experts") or 0)}
    else:  # Qwen: mlp_only_layers, and every decoder_sparse_step-th layer sparse
        step, only = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
        width, norm = int(cfg["moe_intermediate_size"]), bool(cfg.get("norm_topk_prob", False))
        if family == "qwen2_moe":
            extra = {"shared_expert_intermediate_size": int(cfg.get("shared_expert_intermediate_size") or 0),
                     "shared_expert_gated": True}
    k = int(cfg.get("num_experts_per_tok") or 2)
    if not 1 <= k <= n:
        raise ModelLoadError(f"num_experts_per_tok={k} must be between 1 and the {n} experts")
    return {"num_experts": n, "experts_per_token": k, "moe_intermediate_size": width, "norm_topk_prob": norm,
            "dense_layers": dense, **extra}


def _granite(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite's four multipliers (muP): embeddings times one, each layer's attention and MLP output
    times another before it joins the residual, scores scaled by `attention_multiplier` (not
    1/sqrt(head_dim)), logits divided by `logits_scaling`."""
    if family not in ("granite", "granitemoe"):
        return {}
    return {"embedding_multiplier": float(cfg.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(cfg.get("residual_multiplier", 1.0)),
            "attention_scale": float(cfg.get("attention_multiplier", 1.0)),
            "logits_scaling": float(cfg.get("logits_scaling", 1.0))}


def _glm(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """GLM-4 rotates adjacent pairs of a head's first dims (the loader reorders q and k so the
    half-split rotation computes it); GLM-4.5 rotates halves. Both rotate half of each head unless
    the config says otherwise; GLM-4.5's q/k norms are optional."""
    if family not in ("glm4", "glm4_moe"):
        return {}
    # (a GGUF's conversion reorders the rows itself, and says so in the config it writes)
    out: dict[str, Any] = {"rope_interleaved": bool(cfg.get("rope_interleaved", family == "glm4"))}
    if "partial_rotary_factor" not in rope_params(cfg) and "partial_rotary_factor" not in cfg:
        out["rotary_dim"] = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])) // 2
    if family == "glm4":
        out["attention_bias"] = bool(cfg.get("attention_bias", True))
    else:
        out["qk_norm"] = bool(cfg.get("use_qk_norm", False))
    return out


def _nope_layers(cfg: dict[str, Any]) -> tuple[int, ...]:
    layers = int(cfg["num_hidden_layers"])
    flags = cfg.get("no_rope_layers")  # (1: the layer rotates)
    if flags is None:
        interval = int(cfg.get("no_rope_layer_interval") or 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers:
        raise ModelLoadError(f"no_rope_layers has {len(flags)} entries for {layers} layers; give one per layer")
    return tuple(i for i, f in enumerate(flags) if not f)


def _smollm3(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """SmolLM3: the layers `no_rope_layers` marks 0 (every 4th by default) attend without rotation."""
    return {"nope_layers": _nope_layers(cfg)} if family == "smollm3" else {}


def _lfm2(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """LFM2: which layers are short convolutions (`layer_types` "conv", else those not in
    `full_attn_idxs`), their kernel length, q/k norms on the attention layers, its norm's epsilon
    under its own name, and the MLP's width as its block computes it from `intermediate_size`."""
    if family != "lfm2":
        return {}
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        full = set(cfg.get("full_attn_idxs") or range(layers))
        types = ["full_attention" if i in full else "conv" for i in range(layers)]
    if len(types) != layers or set(types) - {"conv", "full_attention"}:
        raise ModelLoadError(f"layer_types {types} must give each of the {layers} layers 'conv' or 'full_attention'")
    width = int(cfg["intermediate_size"])
    if cfg.get("block_auto_adjust_ff_dim", True):  # (as Lfm2MLP sizes itself)
        width = int(2 * width / 3)
        if cfg.get("block_ffn_dim_multiplier") is not None:
            multiple = int(cfg.get("block_multiple_of") or 256)
            width = int(float(cfg["block_ffn_dim_multiplier"]) * width)
            width = multiple * ((width + multiple - 1) // multiple)
    return {"conv_layers": tuple(i for i, t in enumerate(types) if t == "conv"),
            "conv_kernel": int(cfg.get("conv_L_cache") or 3), "conv_bias": bool(cfg.get("conv_bias", False)),
            "qk_norm": True, "rms_norm_eps": float(cfg.get("norm_eps", 1e-5)), "intermediate_size": width,
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))}


def _gpt_oss(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss: a learned sink per head in each softmax, biases on every attention linear (o's too),
    on the router and on the experts, whose SwiGLU clamps its inputs (`swiglu_limit`) and gates by
    sigmoid(alpha x) times (up + 1)."""
    if family != "gpt_oss":
        return {}
    bias = bool(cfg.get("attention_bias", True))
    return {"attention_sinks": True, "attention_bias": bias, "o_proj_bias": bias, "router_bias": True,
            "mlp_bias": True, "hidden_act": "swiglu_clamped", "swiglu_limit": float(cfg.get("swiglu_limit", 7.0)),
            "swiglu_alpha": float(cfg.get("swiglu_alpha", 1.702))}


def _deepseek(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention: q through a low-rank pair (q_lora_rank; none: one
    matrix), k and v from one compressed latent per token (kv_lora_rank) beside a rotated part shared
    by every head (qk_rope_head_dim, its pairs adjacent where rope_interleave); the softmax scale
    (qk_nope + qk_rope)^-0.5, times YaRN's mscale_all_dim factor squared."""
    if family != "deepseek_v3":
        return {}
    nope, rope, r = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["kv_lora_rank"])
    scale = (nope + rope) ** -0.5
    params = rope_params(cfg)
    if (params.get("rope_type") or params.get("type") or "default") != "default" and params.get("mscale_all_dim"):
        scale *= yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"])) ** 2
    return {"kv_lora_rank": r, "q_lora_rank": int(cfg.get("q_lora_rank") or 0), "qk_nope_head_dim": nope,
            "v_head_dim": int(cfg["v_head_dim"]), "head_dim": rope, "rotary_dim": 0, "attention_scale": scale,
            "rope_interleaved": bool(cfg.get("rope_interleave", True))}


def _gemma4(family: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4: the full-attention layers' head width and KV heads (`per_layer_config` as transformers
    writes it, or the checkpoint's `global_head_dim` / `num_global_key_value_heads`), their values the keys'
    projection where `attention_k_eq_v`, their rope "proportional"; scores unscaled; the last
    `num_kv_shared_layers` layers reading earlier layers' KV; per-layer inputs; experts beside the MLP."""
    if family != "gemma4":
        return {}
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError("use_bidirectional_attention (an embedding model) is not a causal LM agentkv serves")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"Gemma 4 with activation {act!r} is not implemented (gelu_pytorch_tanh is)")
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    full = {i for i, t in enumerate(types) if t == "full_attention"}
    head_dim, kv_heads = int(cfg.get("head_dim") or 256), int(cfg.get("num_key_value_heads") or 1)
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    wide = {"head_dim": int(cfg.get("global_head_dim") or 512)}
    if k_eq_v and cfg.get("num_global_key_value_heads"):
        wide["num_key_value_heads"] = int(cfg["num_global_key_value_heads"])
    if cfg.get("per_layer_config") is not None:
        per_layer = {int(i): dict(v) for i, v in cfg["per_layer_config"].items()}
        wide = per_layer[min(full)] if full and min(full) in per_layer else {}
        if set(per_layer) - full or any(per_layer.get(i, {}) != wide for i in full) \
                or set(wide) - {"head_dim", "num_key_value_heads"}:
            raise ModelLoadError("Gemma 4 per_layer_config other than one head width and KV head count for all the "
                                 f"full-attention layers is not implemented (this config: {cfg['per_layer_config']})")
    params = cfg.get("rope_parameters") or {}
    glob, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    if (local.get("rope_type") or "default") != "default" or (glob.get("rope_type") or "default") not in (
            "default", "proportional"):
        raise ModelLoadError(f"Gemma 4 with rope {params} is not implemented (default on the windowed layers, "
                             "proportional or default on the full ones is)")
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    if shared and {t for t in types[layers - shared:]} - {t for t in types[: layers - shared]}:
        raise ModelLoadError(f"num_kv_shared_layers={shared}: a shared layer's kind has no earlier layer to read")
    out: dict[str, Any] = {
        "hidden_act": "gelu_tanh", "qk_norm": True, "attention_scale": 1.0,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
        "rope_theta": float(glob.get("rope_theta", 1_000_000.0)),
        "rope_scaling": RopeScaling(rope_type="proportional", factor=float(glob.get("factor", 1.0)),
                                    proportion=float(glob.get("partial_rotary_factor", 1.0)))
        if glob.get("rope_type") == "proportional" else RopeScaling(),
        "local_rope_theta": float(local.get("rope_theta", 10_000.0)),
        "global_head_dim": int(wide.get("head_dim", head_dim)) if full else 0,
        "global_kv_heads": int(wide.get("num_key_value_heads", kv_heads)) if full else 0,
        "k_eq_v": k_eq_v, "kv_shared_layers": shared,
        "per_layer_input_size": int(cfg.get("hidden_size_per_layer_input") or 0),
        "per_layer_vocab": int(cfg.get("vocab_size_per_layer_input") or cfg["vocab_size"]),
        "double_wide_mlp": bool(cfg.get("use_double_wide_mlp", False))}
    if out["per_layer_input_size"] and out["per_layer_vocab"] < int(cfg["vocab_size"]):
        raise ModelLoadError(f"vocab_size_per_layer_input={out['per_layer_vocab']} is under vocab_size="
                             f"{cfg['vocab_size']}: the tokens past it have no per-layer input")
    if cfg.get("enable_moe_block"):
        n, k = int(cfg.get("num_experts") or 0), int(cfg.get("top_k_experts") or 0)
        if not 1 <= k <= n:
            raise ModelLoadError(f"Gemma 4's experts: top_k_experts={k} must be between 1 and num_experts={n}")
        out.update(num_experts=n, experts_per_token=k, moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                   norm_topk_prob=True, router="gemma4")
    return out
