"""Tiny random-weight checkpoints of the families transformers itself defines (SmolLM3, Granite,
Granite-MoE, GLM-4, GLM-4.5, LFM2, gpt-oss, DeepSeek-V3): the model built from its transformers
config, its weights drawn from a seeded generator at scales that make every part matter, and saved by
transformers as the Hub lays it out, with a byte tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv.testing import write_byte_tokenizer
from tests.tiny import chat_tokenizer, write_chat_ends

# each family's config beyond the shared shape: values away from 1 and 0 where a mistake would hide
FAMILY_CONFIGS = {
    "smollm3": {"num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 0], "rope_theta": 10000.0},
    "granite": {"embedding_multiplier": 1.7, "residual_multiplier": 0.45, "attention_multiplier": 0.31,
                "logits_scaling": 2.5},
    "granitemoe": {"embedding_multiplier": 1.7, "residual_multiplier": 0.45, "attention_multiplier": 0.31,
                   "logits_scaling": 2.5, "num_local_experts": 4, "num_experts_per_tok": 2},
    "glm4": {},
    # every other layer windowed (8 keys: shorter than the tests' texts), a clamp low enough to bite
    "gpt_oss": {"num_hidden_layers": 3, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                "sliding_window": 8, "swiglu_limit": 1.0,
                "rope_parameters": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 64,
                                    "rope_theta": 150000.0}},
    # latent attention (q through its own low rank), two groups of four experts, one chosen, layer 0 dense;
    # YaRN with DeepSeek's two mscales
    "deepseek_v3": {"num_hidden_layers": 3, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 16, "v_head_dim": 24, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
                    "topk_group": 1, "routed_scaling_factor": 2.5, "num_key_value_heads": 4,
                    "rope_parameters": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8,
                                        "rope_theta": 10000.0}},
    # convolutions in layers 0, 2 and 3, attention in 1 and 4; the MLP 2/3 of 192 wide, as LFM2 sizes it
    "lfm2": {"num_hidden_layers": 5, "layer_types": ["conv", "full_attention", "conv", "conv", "full_attention"],
             "intermediate_size": 192, "block_multiple_of": 32, "tie_word_embeddings": True},
    # Gemma 4 (E2B's shape): windowed and full layers (the full ones 32 wide with one KV head whose values are
    # its keys' projection, a quarter of their pairs rotating), the last two layers reading layers 2's and
    # 3's KV with an MLP twice as wide, per-layer inputs 8 wide; the logits capped
    "gemma4_text": {"num_hidden_layers": 6,
                    "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                    "sliding_attention", "sliding_attention", "full_attention"],
                    "sliding_window": 8, "global_head_dim": 32, "attention_k_eq_v": True,
                    "num_global_key_value_heads": 1, "num_kv_shared_layers": 2, "use_double_wide_mlp": True,
                    "hidden_size_per_layer_input": 8, "final_logit_softcapping": 30.0, "tie_word_embeddings": True},
    "glm4_moe": {"num_hidden_layers": 3, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
                 "routed_scaling_factor": 2.5, "norm_topk_prob": True, "attention_bias": True},
}


def make_family_model(out: Path, model_type: str, *, seed: int = 0, tie: bool = False,
                      config: dict | None = None, chat: str | None = None) -> Path:
    """A random `model_type` model (FAMILY_CONFIGS' entries, then `config`) written to `out`; `chat`: a
    family of tests/chat_templates.py whose template and tokens its tokenizer carries."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(out, **(chat_tokenizer(chat) or {}))
    fields = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    fields.update(FAMILY_CONFIGS[model_type])
    if model_type == "gemma4_text":  # (its per-layer table as long as the vocabulary, as Gemma 4's is)
        fields["vocab_size_per_layer_input"] = vocab
    fields.update(config or {})
    hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in sorted([*model.named_parameters(), *model.named_buffers()]):
            if not t.is_floating_point() or "rotary" in name or "inv_freq" in name:
                continue
            if name.endswith("e_score_correction_bias"):  # enough to change which experts a token gets
                scale, base = 0.3, 0.0
            elif "norm" in name:
                scale, base = 0.08, 1.0
            elif name.endswith("sinks"):  # (enough to take a share of each softmax)
                scale, base = 1.0, 0.0
            elif name.endswith(("layer_scalar", "per_expert_scale", "router.scale")):  # (Gemma 4's, near one)
                scale, base = 0.2, 1.0
            else:
                scale = 0.5 if "embed" in name or "router" in name or name.endswith("gate.weight") else 0.3
                scale, base = (0.2 if name.endswith("bias") else scale), 0.0
            t.copy_(base + torch.randn(t.shape, generator=g) * scale)
    model.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    write_chat_ends(out, chat)
    return out


def make_gemma4_multimodal(text_dir: Path, out: Path) -> Path:
    """The Gemma 4 text model at `text_dir` (make_family_model's) as Google publishes Gemma 4: a
    Gemma4ForConditionalGeneration checkpoint, the language model's weights under
    `model.language_model.`, beside a small random vision tower."""
    import shutil

    import torch
    import transformers

    text = transformers.AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    cfg = transformers.Gemma4Config(
        text_config=text.config.to_dict(), audio_config=None,
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "num_key_value_heads": 2, "head_dim": 16})
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(cfg)
    state = {"model.language_model." + k.removeprefix("model."): v for k, v in text.state_dict().items()
             if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(("model.vision_tower", "model.embed_vision")) or k == "lm_head.weight"
                                  for k in missing), (missing, unexpected)
    model.save_pretrained(out)
    for f in text_dir.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            shutil.copy(f, out / f.name)
    return out


# llama.cpp's architecture names, and the ones whose q/k rows its converter permutes
GGUF_ARCH = {"smollm3": "smollm3", "granite": "granite", "granitemoe": "granitemoe", "glm4": "glm4",
             "glm4_moe": "glm4moe", "lfm2": "lfm2", "gpt_oss": "gpt-oss", "deepseek_v3": "deepseek2"}
PERMUTED = ("smollm3", "granite", "granitemoe")


LFM2_GGUF = {"model.embedding_norm.weight": "token_embd_norm.weight"}
LFM2_LAYER_GGUF = [(f".{a}.", f".{b}.") for a, b in (
    ("operator_norm", "attn_norm"), ("ffn_norm", "ffn_norm"), ("self_attn.q_layernorm", "attn_q_norm"),
    ("self_attn.k_layernorm", "attn_k_norm"), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"), ("self_attn.out_proj", "attn_output"), ("feed_forward.w1", "ffn_gate"),
    ("feed_forward.w3", "ffn_up"), ("feed_forward.w2", "ffn_down"), ("conv.conv", "shortconv.conv"),
    ("conv.in_proj", "shortconv.in_proj"), ("conv.out_proj", "shortconv.out_proj"))] + [("model.layers.", "blk.")]


def write_family_gguf(src: Path, out: Path, quant: str = "Q8_0", nextn: int = 1) -> dict:
    """The checkpoint `src` (make_family_model's) as llama.cpp's converter writes it: its hyperparameters
    under the architecture's keys, q/k rows permuted where the converter permutes them, Granite-MoE's
    experts split into gate and up, GLM-4.5's experts stacked by kind (and `nextn` multi-token-prediction
    layers after its own, which a forward skips); matrices in `quant`. Returns the checkpoint's tensors
    as the file holds them, dequantized, under their HF names and shapes."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from agentkv.engine import gguf_names
    from tests.engine.test_loading import gguf_writer

    cfg = json.loads((src / "config.json").read_text())
    family = cfg["model_type"]
    arch = GGUF_ARCH[family]
    rope = cfg.get("rope_parameters") or {}
    layers, d = cfg["num_hidden_layers"], cfg["head_dim"]
    common = {**cfg, "rope_theta": rope.get("rope_theta", 10000.0),
              "num_hidden_layers": layers + (nextn if family == "glm4_moe" else 0)}
    if family == "lfm2":  # KV heads per layer (none in a convolution's), the MLP's width as its block sizes it
        kv = [0 if t == "conv" else cfg["num_key_value_heads"] for t in cfg["layer_types"]]
        width = load_file(str(src / "model.safetensors"))["model.layers.0.feed_forward.w1.weight"].shape[0]
        common.update(num_key_value_heads=kv, intermediate_size=width, rms_norm_eps=cfg["norm_eps"])
    w = gguf_writer(out, arch, common)
    if family != "deepseek_v3":  # (its own below)
        w.add_key_length(d)
        w.add_value_length(d)
    if "partial_rotary_factor" in rope:
        w.add_rope_dimension_count(int(d * rope["partial_rotary_factor"]))
    if family == "deepseek_v3":  # MLA as llama.cpp writes it for its absorption
        write_latent_attention_keys(w, cfg, rope)
    key = arch + "."
    if family == "lfm2":
        w.add_uint32(key + "shortconv.l_cache", cfg["conv_L_cache"])
    if family == "gpt_oss":
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if family in ("granite", "granitemoe"):
        for ours, theirs in (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"),
                             ("attention.scale", "attention_multiplier"), ("logit_scale", "logits_scaling")):
            w.add_float32(key + ours, cfg[theirs])
    if family == "granitemoe":
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if family in ("glm4_moe", "deepseek_v3"):
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_uint32(key + "expert_shared_count", cfg["n_shared_experts"])
        w.add_uint32(key + "leading_dense_block_count", cfg["first_k_dense_replace"])
        w.add_float32(key + "expert_weights_scale", cfg["routed_scaling_factor"])
        w.add_bool(key + "expert_weights_norm", cfg["norm_topk_prob"])
        w.add_uint32(key + "expert_gating_func", 2)  # sigmoid
        w.add_uint32(key + "expert_group_count", cfg["n_group"])
        w.add_uint32(key + "expert_group_used_count", cfg["topk_group"])
        w.add_uint32(key + "nextn_predict_layers", nextn if family == "glm4_moe" else 0)
    hf = load_file(str(src / "model.safetensors"))
    kind = getattr(gguf.GGMLQuantizationType, quant)

    def quantized(t: np.ndarray) -> np.ndarray:
        return gguf.quants.quantize(t.astype(np.float32), kind)

    def kept_float(name: str) -> bool:  # (llama.cpp keeps a short convolution's taps in F32)
        return name.endswith(("conv.conv.weight", "shortconv.conv.weight"))

    def put(name: str, t: np.ndarray) -> None:
        if t.ndim >= 2 and not kept_float(name):
            q = quantized(t)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kind)
        else:
            w.add_tensor(name, t.astype(np.float32))

    names = {v: k for k, v in {**gguf_names.LAYER_NAMES,
                               **{"glm4": gguf_names.GLM4_NAMES, "glm4moe": gguf_names.GLM4_MOE_NAMES,
                                  "gpt-oss": gguf_names.GPT_OSS_NAMES,
                                  "deepseek2": gguf_names.DEEPSEEK2_NAMES}.get(arch, {})}.items()}
    deq_experts: dict[str, np.ndarray] = {}
    globals_ = {v: k for k, v in gguf_names.GLOBAL_NAMES.items()}
    stacks: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for name, t in hf.items():
        if family == "lfm2":  # its names for the common tensors, its short convolutions' own
            name = LFM2_GGUF.get(name, name)
            for theirs, ours in LFM2_LAYER_GGUF:
                name = name.replace(theirs, ours)
            if name.startswith("blk.") or name in LFM2_GGUF.values():
                put(name, t.reshape(t.shape[0], t.shape[-1]) if "shortconv.conv" in name else t)
                continue
        if name in globals_:
            put(globals_[name], t)
            continue
        i, rest = name[len("model.layers."):].split(".", 1)
        if family in PERMUTED and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            heads = cfg["num_attention_heads"] if "q_proj" in rest else cfg["num_key_value_heads"]
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
        if rest == "self_attn.kv_b_proj.weight":  # split per head for MLA's absorption (F32, as they are)
            heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
            kv_b = t.reshape(heads, nope + cfg["v_head_dim"], -1)
            w.add_tensor(f"blk.{i}.attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)))
            w.add_tensor(f"blk.{i}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:]))
            deq_experts[name] = t
        elif rest.startswith("mlp.experts.") and family == "gpt_oss":  # de-interleaved, [E, out, in], MXFP4
            deq_experts.update(put_gpt_oss_experts(w, i, rest, t, name))
        elif rest == "block_sparse_moe.input_linear.weight":  # Granite-MoE: gate and up, each stacked
            half = t.shape[1] // 2
            put(f"blk.{i}.ffn_gate_exps.weight", t[:, :half])
            put(f"blk.{i}.ffn_up_exps.weight", t[:, half:])
        elif rest == "block_sparse_moe.output_linear.weight":
            put(f"blk.{i}.ffn_down_exps.weight", t)
        elif rest == "block_sparse_moe.router.layer.weight":
            put(f"blk.{i}.ffn_gate_inp.weight", t)
        elif rest.startswith("mlp.experts."):
            e, kind_name = rest.split(".")[2], rest.split(".")[3].removesuffix("_proj")
            stacks.setdefault((i, kind_name), {})[int(e)] = t
        else:
            put(f"blk.{i}.{names[rest]}", t)
    for (i, kind_name), experts in stacks.items():
        put(f"blk.{i}.ffn_{kind_name}_exps.weight", np.stack([experts[e] for e in sorted(experts)]))
    rng = np.random.default_rng(1)
    for extra in range(nextn if family == "glm4_moe" else 0):  # a multi-token-prediction layer: not run
        hidden = cfg["hidden_size"]
        put(f"blk.{layers + extra}.nextn.eh_proj.weight", rng.standard_normal((hidden, 2 * hidden)))
        put(f"blk.{layers + extra}.attn_q.weight", rng.standard_normal((hidden, hidden)))
        put(f"blk.{layers + extra}.attn_norm.weight", rng.standard_normal(hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # (quantization is by rows of blocks along the last dimension: the same values in any row order)
    return {n: deq_experts[n] if n in deq_experts else
            gguf.quants.dequantize(quantized(t), kind).reshape(t.shape) if t.ndim >= 2 and not kept_float(n)
            else t for n, t in hf.items()}


def put_gpt_oss_experts(w, i: str, rest: str, t, name: str) -> dict:
    """gpt-oss's experts as llama.cpp's converter writes them: gate and up apart (the checkpoint
    interleaves their columns), [experts, out, in], the matrices in MXFP4; returns the HF tensor `name`
    holding what the file holds (dequantized, in the checkpoint's layout)."""
    import gguf
    import numpy as np

    mx = gguf.GGMLQuantizationType.MXFP4

    def put(gname: str, data: np.ndarray) -> np.ndarray:
        q = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), mx)
        w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=mx)
        return gguf.quants.dequantize(q, mx).reshape(data.shape)

    if rest == "mlp.experts.gate_up_proj":  # [E, in, 2 out], gate's columns even, up's odd
        gate = put(f"blk.{i}.ffn_gate_exps.weight", t[:, :, 0::2].transpose(0, 2, 1))
        up = put(f"blk.{i}.ffn_up_exps.weight", t[:, :, 1::2].transpose(0, 2, 1))
        back = np.empty_like(t)
        back[:, :, 0::2], back[:, :, 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
        return {name: back}
    if rest == "mlp.experts.down_proj":  # [E, in, out]
        return {name: put(f"blk.{i}.ffn_down_exps.weight", t.transpose(0, 2, 1)).transpose(0, 2, 1)}
    if rest == "mlp.experts.gate_up_proj_bias":  # (biases in F32, as they are)
        w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(t[:, 0::2], dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(t[:, 1::2], dtype=np.float32))
    else:  # down_proj_bias
        w.add_tensor(f"blk.{i}.ffn_down_exps.bias", np.ascontiguousarray(t, dtype=np.float32))
    return {name: t}


def write_latent_attention_keys(w, cfg: dict, rope: dict) -> None:
    """DeepSeek-V3's MLA keys as llama.cpp's deepseek2 states them: key and value lengths of the latent
    (its absorption), the per-head ones under *_mla, the ranks, YaRN's log multiplier."""
    r, nope, p = cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    key = w.arch + "."
    w.add_uint32(key + "attention.key_length", r + p)
    w.add_uint32(key + "attention.value_length", r)
    w.add_key_length_mla(nope + p)
    w.add_uint32(key + "attention.value_length_mla", cfg["v_head_dim"])
    w.add_rope_dimension_count(p)
    w.add_kv_lora_rank(r)
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    if rope.get("rope_type") == "yarn":
        import gguf

        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
