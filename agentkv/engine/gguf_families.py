"""What a GGUF file says (or llama.cpp fixes by architecture) of each family beyond the common
hyperparameters, as ModelConfig fields: Gemma's scale, windows and rope base, Gemma 4's two head
widths, shared KV and per-layer inputs, SmolLM3's layers without rope, Granite's multipliers, GLM-4's
sandwich and GLM-4.5's router, shared expert and leading dense layers, LFM2's convolution layers."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentkv.engine.rope_config import RopeScaling, yarn_mscale
from agentkv.errors import ModelLoadError


def gguf_family_fields(meta: dict[str, Any], arch: str, family: str, names: set[str], common: dict[str, Any],
                       shapes: dict[str, tuple[int, ...]] | None = None,
                       factors: dict[str, tuple[float, ...]] | None = None) -> dict[str, Any]:
    """The fields `family` adds to (or changes in) `common`, the ones every architecture states
    (`shapes`: the file's tensors' shapes, HF's order; `factors`: its rope tensors' values)."""
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}")
        return default if value is None else value

    if family in ("gemma2", "gemma3"):
        return _gemma(get, family, common)
    if family == "gemma4":
        return _gemma4(get, names, common, shapes or {}, (factors or {}).get("rope_freqs.weight"))
    if family == "smollm3":  # llama.cpp fixes it: every 4th layer attends without rope (no key says so)
        return {"nope_layers": tuple(i for i in range(common["num_layers"]) if (i + 1) % 4 == 0)}
    if family in ("granite", "granitemoe"):
        return {"embedding_multiplier": float(get("embedding_scale", 1.0)),
                "residual_multiplier": float(get("residual_scale", 1.0)),
                "attention_scale": float(get("attention.scale", common["head_dim"] ** -0.5)),
                "logits_scaling": float(get("logit_scale", 1.0))}
    if family == "glm4":  # its q/k rows are reordered in the conversion: nothing rotates pairs after it
        return {"attention_bias": True, "rope_interleaved": False}
    if family == "glm4_moe":
        return _glm4_moe(get, names, common)
    if family == "deepseek_v3":
        return {**_glm4_moe(get, names, common), **_latent_attention(get, common)}
    if family == "gpt_oss":  # (llama.cpp fixes the clamp and alpha, and windows every other layer, the first)
        window = int(get("attention.sliding_window", 128))
        return {"attention_sinks": True, "attention_bias": True, "o_proj_bias": True, "router_bias": True,
                "mlp_bias": True, "hidden_act": "swiglu_clamped", "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
                "layer_windows": tuple(window if i % 2 == 0 else 0 for i in range(common["num_layers"])),
                "rope_scaling": dataclasses.replace(common["rope_scaling"], truncate=False)}
    if family == "lfm2":  # its convolution layers are those with no KV heads
        kv = get("attention.head_count_kv")
        return {"conv_layers": tuple(i for i, n in enumerate(kv) if not n) if isinstance(kv, (list, tuple)) else (),
                "conv_kernel": int(get("shortconv.l_cache", 3)), "qk_norm": True,
                "tie_word_embeddings": "output.weight" not in names}
    return {}


def _gemma(get, family: str, common: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2 / 3 as llama.cpp reads their GGUF files: what their configs say and a GGUF does not is
    fixed there by family and size (every 2nd / 6th layer global, the windowed layers' rope base
    10,000, the attention scale from the head size but for the 27B models, whose is hidden / heads)."""
    layers, window = common["num_layers"], int(get("attention.sliding_window", 0))
    big = layers == (46 if family == "gemma2" else 62)  # (llama.cpp's LLM_TYPE_27B)
    pattern = 2 if family == "gemma2" else 6
    scale_dim = common["hidden_size"] / common["num_heads"] if big else common["head_dim"]
    return dict(
        max_position_embeddings=int(get("context_length", 8192)), tie_word_embeddings=True,
        qk_norm=family == "gemma3", hidden_act="gelu_tanh", attention_scale=scale_dim ** -0.5,
        layer_windows=tuple(window if (i + 1) % pattern else 0 for i in range(layers)) if window else (),
        local_rope_theta=float(get("rope.freq_base_swa", 10_000.0)) if family == "gemma3" else 0.0,
        attn_softcap=float(get("attn_logit_softcapping", 0.0)),
        final_softcap=float(get("final_logit_softcapping", 0.0)))


def _gemma4(get, names: set[str], common: dict[str, Any], shapes: dict[str, tuple[int, ...]],
            rope_freqs: tuple[float, ...] | None) -> dict[str, Any]:
    """Gemma 4 as llama.cpp's converter writes it: which layers are windowed (`sliding_window_pattern`, a
    bool a layer); the full layers' head width as `key_length` and the windowed ones' as
    `key_length_swa`; KV heads a layer where they differ; the shared-KV layers' count; the MLP's width
    a layer (the shared layers' twice as wide with use_double_wide_mlp); the per-layer inputs' width (the
    table's rows: its shape); the full layers' proportional rope as `rope_freqs` (1 for a rotating
    pair, 1e30 for one that stays); values the keys' projection where a full layer has no attn_v."""
    layers = common["num_layers"]
    pattern = get("attention.sliding_window_pattern")
    window = int(get("attention.sliding_window", 0))
    if isinstance(pattern, (list, tuple)) and len(pattern) == layers:
        windows = tuple(window if bool(p) else 0 for p in pattern)
    else:  # (no pattern: Gemma 3's, every 6th layer full)
        windows = tuple(window if (i + 1) % 6 else 0 for i in range(layers))
    full = [i for i in range(layers) if not windows[i]]
    global_dim = int(get("attention.key_length", common["head_dim"]))
    local_dim = int(get("attention.key_length_swa", global_dim))
    kv = get("attention.head_count_kv", common["num_heads"])
    kv = list(kv) if isinstance(kv, (list, tuple)) else [int(kv)] * layers
    local_kv = next((int(kv[i]) for i in range(layers) if windows[i]), int(kv[0]))
    global_kv = int(kv[full[0]]) if full else local_kv
    ffn = get("feed_forward_length")
    ffn = list(ffn) if isinstance(ffn, (list, tuple)) else [int(ffn)] * layers
    shared = int(get("attention.shared_kv_layers", 0))
    first_shared = layers - shared
    rotated = int(get("rope.dimension_count_swa", local_dim))
    scaling = RopeScaling()
    if rope_freqs is not None:  # the full layers' rope: the first pairs rotate, the rest stay
        turning = sum(1 for f in rope_freqs if f == 1.0)
        if len(rope_freqs) != global_dim // 2 or any(f < 1e29 for f in rope_freqs[turning:]) \
                or any(f != 1.0 for f in rope_freqs[:turning]):  # (1e30: float32's, not exactly 1e30)
            raise ModelLoadError("this Gemma 4 GGUF's rope_freqs is not the proportional rope's (ones, then 1e30 for "
                                 "the pairs that do not rotate); agentkv implements that one")
        scaling = RopeScaling(rope_type="proportional", proportion=2 * turning / global_dim)
    width = int(get("embedding_length_per_layer_input", 0))
    table = shapes.get("per_layer_token_embd.weight")
    out = {
        "hidden_act": "gelu_tanh", "qk_norm": True, "attention_scale": 1.0, "attention_bias": False,
        "tie_word_embeddings": "output.weight" not in names,
        "final_softcap": float(get("final_logit_softcapping", 0.0)),
        "rope_scaling": scaling, "local_rope_theta": float(get("rope.freq_base_swa", 10_000.0)),
        "layer_windows": windows if any(windows) else (),
        "head_dim": local_dim, "rotary_dim": rotated if rotated < local_dim else 0, "num_kv_heads": local_kv,
        "global_head_dim": global_dim if full else 0, "global_kv_heads": global_kv if full else 0,
        "k_eq_v": any(f"blk.{i}.attn_v.weight" not in names for i in full if i < first_shared),
        "kv_shared_layers": shared, "intermediate_size": int(ffn[0]),
        "double_wide_mlp": bool(shared) and int(ffn[-1]) == 2 * int(ffn[0]) != int(ffn[0]),
        "per_layer_input_size": width, "per_layer_vocab": int(table[0]) if table else common["vocab_size"],
    }
    if common.get("num_experts"):
        out["router"] = "gemma4"
    return out


def _latent_attention(get, common: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's MLA as llama.cpp's deepseek2 states it: the ranks; the rotated part's width as the
    rope's; the per-head key and value widths under *_mla (key_length and value_length there are the
    latent's, for MLA's absorption; a file without *_mla has the per-head ones there); the softmax scale
    from YaRN's log multiplier (0.1 mscale_all_dim), whose two mscales DeepSeek sets equal."""
    rope = int(get("rope.dimension_count", common["head_dim"]))
    key = int(get("attention.key_length_mla", get("attention.key_length")))
    log_mul = float(get("rope.scaling.yarn_log_multiplier", 0.0))
    scaling = common["rope_scaling"]
    scale = key ** -0.5
    if scaling.rope_type == "yarn" and log_mul:
        m = round(log_mul / 0.1, 6)  # (the file's float32 of 0.1 m; configs write m as a short decimal)
        scale *= yarn_mscale(scaling.factor, m) ** 2
        scaling = dataclasses.replace(scaling, mscale=m, mscale_all_dim=m)
    return {"kv_lora_rank": int(get("attention.kv_lora_rank")), "q_lora_rank": int(get("attention.q_lora_rank", 0)),
            "qk_nope_head_dim": key - rope, "v_head_dim": int(get("attention.value_length_mla",
                                                                  get("attention.value_length"))),
            "head_dim": rope, "rotary_dim": 0, "attention_scale": scale, "rope_scaling": scaling,
            "rope_interleaved": False}  # (its rotated rows rotate adjacent pairs; the conversion reorders them)


def _glm4_moe(get, names: set[str], common: dict[str, Any]) -> dict[str, Any]:
    """GLM-4.5: DeepSeek-V3's router (expert_gating_func 2: sigmoid), `leading_dense_block_count` dense
    layers first, `expert_shared_count` shared experts as one MLP; its block count includes the
    multi-token-prediction layers (`nextn_predict_layers`), which the model's forward does not run."""
    layers = common["num_layers"] - int(get("nextn_predict_layers", 0))
    width = common["moe_intermediate_size"]
    return {"num_layers": layers, "router": "sigmoid_groups",
            "dense_layers": tuple(range(min(int(get("leading_dense_block_count", 1)), layers))),
            "expert_groups": int(get("expert_group_count", 1)) or 1,
            "expert_groups_chosen": int(get("expert_group_used_count", 1)) or 1,
            "routed_scaling_factor": float(get("expert_weights_scale", 1.0)) or 1.0,
            "norm_topk_prob": bool(get("expert_weights_norm", True)),
            "shared_expert_intermediate_size": width * int(get("expert_shared_count", 0)),
            "shared_expert_gated": False,
            "qk_norm": "blk.0.attn_q_norm.weight" in names, "attention_bias": "blk.0.attn_q.bias" in names}
