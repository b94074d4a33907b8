"""Tiny random-weight checkpoints of the families transformers itself defines (SmolLM3, Granite,
Granite-MoE, GLM-4, GLM-4.5): the model built from its transformers config, its weights drawn from a
seeded generator at scales that make every part matter, and saved by transformers as the Hub lays
it out, with a byte tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv.testing import write_byte_tokenizer

# each family's config beyond the shared shape: values away from 1 and 0 where a mistake would hide
FAMILY_CONFIGS = {
    "smollm3": {"num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 0], "rope_theta": 10000.0},
    "granite": {"embedding_multiplier": 1.7, "residual_multiplier": 0.45, "attention_multiplier": 0.31,
                "logits_scaling": 2.5},
    "granitemoe": {"embedding_multiplier": 1.7, "residual_multiplier": 0.45, "attention_multiplier": 0.31,
                   "logits_scaling": 2.5, "num_local_experts": 4, "num_experts_per_tok": 2},
    "glm4": {},
    "glm4_moe": {"num_hidden_layers": 3, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
                 "routed_scaling_factor": 2.5, "norm_topk_prob": True, "attention_bias": True},
}


def make_family_model(out: Path, model_type: str, *, seed: int = 0, tie: bool = False,
                      config: dict | None = None) -> Path:
    """A random `model_type` model (FAMILY_CONFIGS' entries, then `config`) written to `out`."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(out)
    fields = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    fields.update(FAMILY_CONFIGS[model_type])
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
            else:
                scale = 0.5 if "embed" in name or "router" in name or name.endswith("gate.weight") else 0.3
                scale, base = (0.2 if name.endswith("bias") else scale), 0.0
            t.copy_(base + torch.randn(t.shape, generator=g) * scale)
    model.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
