"""GGUF tensor names -> the HF checkpoint names the loader reads, by architecture: llama.cpp's names for
each family's tensors (its converter's renames and its `gguf` package's maps), and which matrices a
GGUF's blocks are kept for."""

from __future__ import annotations

# GGUF tensor names -> HF names; `{i}` is the layer index.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",  # Phi-3's fused q/k/v
    # mixtures of experts: the router, every expert's matrices stacked [experts, out, in], a shared expert
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_exps",
    "ffn_up_exps.weight": "mlp.experts.up_exps",
    "ffn_down_exps.weight": "mlp.experts.down_exps",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
# Gemma's norms around each block, where they differ from the names above (llama.cpp's ffn_norm is the
# norm before the MLP, which Llama's HF names post_attention_layernorm and Gemma's pre_feedforward_layernorm)
GEMMA_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# GLM-4's sandwich (its HF names differ from Gemma's) and GLM-4.5's norm before the MLP, which llama.cpp
# names post_attention_norm; GLM-4.5's experts' correction bias and its shared expert's (ungated) names
GLM4_NAMES = {
    "post_attention_norm.weight": "post_self_attn_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_mlp_layernorm.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}
GLM4_MOE_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
# LFM2's short convolutions (its other tensors take the names above; its final norm is token_embd_norm)
LFM2_NAMES = {
    "shortconv.conv.weight": "conv.conv.weight",
    "shortconv.in_proj.weight": "conv.in_proj.weight",
    "shortconv.out_proj.weight": "conv.out_proj.weight",
}
# gpt-oss's: its sinks, its norm before the MLP, the biases of its router, experts and o projection
GPT_OSS_NAMES = {
    "attn_sinks.weight": "self_attn.sinks",
    "attn_output.bias": "self_attn.o_proj.bias",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
    "ffn_gate_exps.bias": "mlp.experts.gate_exps_bias",
    "ffn_up_exps.bias": "mlp.experts.up_exps_bias",
    "ffn_down_exps.bias": "mlp.experts.down_exps_bias",
}
# DeepSeek-V3's latent attention (k_b and v_b: kv_b_proj split per head, as llama.cpp's converter writes it for
# MLA's absorption; the loader joins them) and GLM-4.5's names for the rest
DEEPSEEK2_NAMES = {
    **GLM4_MOE_NAMES,
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_k_b.weight": "self_attn.k_b_proj.weight",
    "attn_v_b.weight": "self_attn.v_b_proj.weight",
}
# Gemma 4's own: the layer's output scale, its per-layer input's gate, projection and norm, and the experts
# beside its MLP (their norms, router, scales, and gate/up fused across experts as transformers 5 holds them),
# as llama.cpp's converter names them (Gemma 3's sandwich names above apply too)
GEMMA4_NAMES = {
    **GEMMA_NAMES,
    "layer_output_scale.weight": "layer_scalar",
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",  # Gemma 4's per-layer inputs
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}
# the matrices a GGUF's blocks are kept for (the kernels multiply them, or read an embedding's rows from them)
KEPT_ENDS = ("proj.weight", "proj_with_mqa.weight", "lm_head.weight", "embed_tokens.weight", "_exps",
             "embed_tokens_per_layer.weight", "per_layer_model_projection.weight", "per_layer_input_gate.weight",
             "per_layer_projection.weight", "experts.gate_up_proj", "experts.down_proj")


def hf_name(name: str, arch: str = "llama") -> str | None:
    """The HF name of a GGUF tensor of `arch` (None: one the conversion does not keep, e.g. rope_freqs)."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    if arch == "lfm2" and name == "token_embd_norm.weight":  # (LFM2 norms its last layer's output by it)
        return "model.norm.weight"
    if name.startswith("blk."):
        _, idx, rest = name.split(".", 2)
        if arch == "gemma4":  # (its attention and MLP names are the common ones)
            if rest in GEMMA4_NAMES:
                return f"model.layers.{idx}.{GEMMA4_NAMES[rest]}"
        elif arch.startswith("gemma") and rest in GEMMA_NAMES:
            return f"model.layers.{idx}.{GEMMA_NAMES[rest]}"
        if arch == "phi3" and rest == "ffn_up.weight":  # Phi-3's gate and up, fused (gate first)
            return f"model.layers.{idx}.mlp.gate_up_proj.weight"
        own = {"glm4": GLM4_NAMES, "glm4moe": GLM4_MOE_NAMES, "lfm2": LFM2_NAMES, "gpt-oss": GPT_OSS_NAMES,
               "deepseek2": DEEPSEEK2_NAMES}.get(arch, {})
        if rest in own:
            return f"model.layers.{idx}.{own[rest]}"
        if rest in LAYER_NAMES:
            return f"model.layers.{idx}.{LAYER_NAMES[rest]}"
    return None
