"""Tiny random-weight checkpoints (HF directory layout) for fast engine tests.

The tokenizer is byte-level with no merges: 256 byte tokens plus chat specials, so any text encodes
and the vocabulary stays tiny.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_byte_tokenizer(out: Path, chat: str | None = None) -> int:
    """A byte tokenizer with ChatML (or, given `chat`, a family of tests/chat_templates.py: its
    special tokens, added tokens and chat template); returns the vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    from tests.chat_templates import FAMILIES

    family = FAMILIES[chat] if chat else None
    specials = list(family.specials) if family else SPECIALS
    added = list(family.added) if family else []
    alphabet = sorted(ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(specials)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    for a in added:
        vocab[a] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
    tok.save(str(out / "tokenizer.json"))
    if family:
        cfg = {"bos_token": family.bos, "eos_token": family.eos, "add_bos_token": False, "chat_template": family.template}
    else:
        cfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False, "chat_template": CHATML}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


def make_tiny_model(
    out: Path,
    family: str = "llama",
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    rope_scaling: dict | None = None,
    max_positions: int = 512,
    tie: bool = True,
    seed: int = 0,
    chat: str | None = None,
) -> Path:
    """Write config.json, model.safetensors and a byte tokenizer for a random model; returns `out`.
    `chat`: a family of tests/chat_templates.py whose template and special tokens it carries."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(out, chat)
    head_dim = hidden // heads
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
    cfg = {
        "architectures": [arch],
        "model_type": family,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    w = {"model.embed_tokens.weight": rnd(vocab, hidden, scale=0.5), "model.norm.weight": 1 + rnd(hidden)}
    if not tie:
        w["lm_head.weight"] = rnd(vocab, hidden, scale=0.3)
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rnd(hidden)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(hidden)
        w[p + "self_attn.q_proj.weight"] = rnd(heads * head_dim, hidden, scale=0.3)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * head_dim, hidden, scale=0.3)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * head_dim, hidden, scale=0.3)
        w[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * head_dim, scale=0.3)
        if family == "qwen2":
            for x, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                w[p + f"self_attn.{x}_proj.bias"] = rnd(n * head_dim, scale=0.2)
        if family == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + rnd(head_dim)
            w[p + "self_attn.k_norm.weight"] = 1 + rnd(head_dim)
        w[p + "mlp.gate_proj.weight"] = rnd(intermediate, hidden, scale=0.3)
        w[p + "mlp.up_proj.weight"] = rnd(intermediate, hidden, scale=0.3)
        w[p + "mlp.down_proj.weight"] = rnd(hidden, intermediate, scale=0.3)
    save_file({k: v.contiguous() for k, v in w.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
