"""Test doubles for agents: a tiny random-weight model that runs the real engine and grammar.

    from agentkv.testing import tiny_engine

    def test_my_agent():
        with tiny_engine() as engine, my_agent.override(engine=engine):
            result = my_agent.run_sync("anything", deps=fake_deps)
            # every tool call validates against its schema, the output against output_type:
            # the model is random, the grammar is the one in production

A random model writes random values, so a test asserts what the grammar guarantees (calls parse
and validate, outputs are instances of the output type, the loop ends) and what the agent's own
code does with them, not what a trained model would say. Steer it with `tool_choice` (a tool's name
forces a call of it) and `seed`. It loads in well under a second and needs no download.

The checkpoint is a two-layer Llama of width 64 with a byte-level tokenizer (256 byte tokens and
ChatML's specials), written once per process into a temporary folder.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"  # noqa: E501
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_written: dict[tuple, Path] = {}


def tiny_engine(*, seed: int = 0, context: int = 4096, **engine_options):
    """An `ak.Engine` over a tiny random model (seeded: its unseeded requests draw the same seeds
    every run). `engine_options` are Engine's (num_slots, max_running_requests, ...)."""
    from agentkv.engine import Engine  # here: the engine's module loads torch, `import agentkv` must not

    key = (context,)
    if key not in _written:
        _written[key] = write_tiny_model(Path(tempfile.mkdtemp(prefix="agentkv-tiny-")), max_positions=context)
    engine_options.setdefault("num_slots", 4 * context)
    return Engine(str(_written[key]), seed=seed, device="cpu", dtype="float32", **engine_options)


def write_byte_tokenizer(out: Path, specials=SPECIALS, added=(), bos: str = "<|im_start|>", eos: str = "<|im_end|>",
                         template: str = CHATML, merges: int = 0) -> int:
    """A byte tokenizer (no merges: any text encodes, the vocabulary stays tiny) with `specials`,
    `added` tokens and a chat template; returns the vocabulary size. `merges`: that many BPE merges
    learnt from a fixed English text, for tests where text does not re-tokenize as it was written."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    learnt = _learn_merges(vocab, merges) if merges else []
    for a, b in learnt:
        vocab.setdefault(a + b, len(vocab))
    for a in added:
        vocab[a] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=learnt))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
    tok.save(str(out / "tokenizer.json"))
    cfg = {"bos_token": bos, "eos_token": eos, "add_bos_token": False, "chat_template": template}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


def _learn_merges(vocab: dict[str, int], n: int) -> list[tuple[str, str]]:
    """`n` merges by byte-pair counts over a fixed text (pre-tokenized as the tokenizer splits)."""
    from collections import Counter

    from tokenizers.pre_tokenizers import ByteLevel

    text = ("the turn of the conversation is kept in the cache and the reply is written back by the template "
            "while the agent thinks about the answer and then calls a tool with its arguments ") * 4
    words = [list(w) for w, _ in ByteLevel(add_prefix_space=False).pre_tokenize_str(text)]
    merges: list[tuple[str, str]] = []
    while len(merges) < n:
        pairs = Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == (a, b):
                    w[i:i + 2] = [a + b]
                i += 1
    return merges


ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "mixtral": "MixtralForCausalLM"}


def write_tiny_model(out: Path, family: str = "llama", *, hidden: int = 64, layers: int = 2, heads: int = 4,
                     kv_heads: int = 2, intermediate: int = 128, rope_scaling: dict | None = None,
                     max_positions: int = 512, tie: bool = True, seed: int = 0, tokenizer: dict | None = None,
                     experts: int = 4, top_k: int = 2, dense_layers: tuple[int, ...] = (),
                     sliding_window: int | None = None, max_window_layers: int = 0, config: dict | None = None,
                     weights: bool = True, dtype: str = "float32") -> Path:
    """Write config.json, model.safetensors and a byte tokenizer (`tokenizer`: write_byte_tokenizer's
    options) for a random model of `family` (llama, mistral, phi3, gemma3_text, qwen2, qwen3, or the mixtures of experts
    qwen3_moe, qwen2_moe with a shared expert, mixtral: `experts`, `top_k`, Qwen's `dense_layers`),
    its tensors named as the Hub's checkpoints name them; returns `out`. `sliding_window`: Mistral
    and Mixtral window every layer, Qwen the layers from `max_window_layers` on. `config`: more entries
    of config.json (partial_rotary_factor, original_max_position_embeddings, ...). `weights=False`: the
    config and tokenizer alone, for an engine with load_format="dummy" (a full-size shape in seconds). `dtype`:
    the stored tensors' ("bfloat16": as most checkpoints on the Hub are saved)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(out, **(tokenizer or {}))
    head_dim = hidden // heads
    arch = ARCHITECTURES[family]
    cfg = {
        "architectures": [arch], "model_type": family, "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": max_positions, "tie_word_embeddings": tie, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": dtype,
    }
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    cfg["sliding_window"] = sliding_window
    if family in ("phi3", "gemma3_text", "gemma2"):
        cfg["pad_token_id"] = None  # their configs' defaults are past a byte vocabulary
    if family == "gemma3_text":  # windowed layers with the local rope base, every third layer global
        cfg.update(query_pre_attn_scalar=head_dim * 2, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                   hidden_activation="gelu_pytorch_tanh", sliding_window=sliding_window or 4096,
                   layer_types=["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)])
    if family == "gemma2":  # soft caps low enough to bite on random weights; every other layer windowed
        cfg.update(query_pre_attn_scalar=head_dim * 2, hidden_activation="gelu_pytorch_tanh",
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=sliding_window or 4096,
                   layer_types=["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)])
    if sliding_window and family.startswith("qwen"):
        cfg.update(use_sliding_window=True, max_window_layers=max_window_layers)
    cfg.update(config or {})
    moe = family in ("qwen3_moe", "qwen2_moe", "mixtral")
    if family == "mixtral":
        cfg.update(num_local_experts=experts, num_experts_per_tok=top_k)
    elif moe:
        cfg.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=intermediate // 2,
                   norm_topk_prob=family == "qwen3_moe", mlp_only_layers=list(dense_layers), decoder_sparse_step=1)
        if family == "qwen2_moe":
            cfg.update(shared_expert_intermediate_size=intermediate, qkv_bias=True)
    if not weights:
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
        return out
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
        if family in ("qwen2", "qwen2_moe"):
            for x, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                w[p + f"self_attn.{x}_proj.bias"] = rnd(n * head_dim, scale=0.2)
        if family in ("qwen3", "qwen3_moe", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = 1 + rnd(head_dim)
            w[p + "self_attn.k_norm.weight"] = 1 + rnd(head_dim)
        if family in ("gemma3_text", "gemma2"):  # (their norms scale by 1 + weight: weights near 0)
            for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm") + (("self_attn.q_norm", "self_attn.k_norm")
                                                          if family == "gemma3_text" else ()):
                w[p + name + ".weight"] = rnd(hidden if "attn." not in name else head_dim, scale=0.3)
        if moe and i not in dense_layers:
            w.update(_experts(p, family, hidden, intermediate, experts, rnd))
            continue
        if family == "phi3":  # Phi-3's checkpoints fuse q/k/v and gate/up
            w[p + "self_attn.qkv_proj.weight"] = torch.cat([w.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            w[p + "mlp.gate_up_proj.weight"] = rnd(2 * intermediate, hidden, scale=0.3)
            w[p + "mlp.down_proj.weight"] = rnd(hidden, intermediate, scale=0.3)
            continue
        w[p + "mlp.gate_proj.weight"] = rnd(intermediate, hidden, scale=0.3)
        w[p + "mlp.up_proj.weight"] = rnd(intermediate, hidden, scale=0.3)
        w[p + "mlp.down_proj.weight"] = rnd(hidden, intermediate, scale=0.3)
    save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in w.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def _experts(p: str, family: str, hidden: int, intermediate: int, experts: int, rnd) -> dict:
    """One MoE layer's tensors under the Hub's names (Mixtral: block_sparse_moe and w1/w3/w2)."""
    if family == "mixtral":
        router, each, (gate, up, down) = "block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2")
        width = intermediate
    else:  # the Qwen MoE families' names; their experts here are half the MLP's width
        router, each, (gate, up, down) = "mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")
        width = intermediate // 2
    w = {p + router + ".weight": rnd(experts, hidden, scale=0.5)}
    for e in range(experts):
        x = f"{p}{each}.{e}."
        w[x + gate + ".weight"] = rnd(width, hidden, scale=0.3)
        w[x + up + ".weight"] = rnd(width, hidden, scale=0.3)
        w[x + down + ".weight"] = rnd(hidden, width, scale=0.3)
    if family == "qwen2_moe":
        x = p + "mlp.shared_expert."
        w[x + "gate_proj.weight"] = rnd(intermediate, hidden, scale=0.3)
        w[x + "up_proj.weight"] = rnd(intermediate, hidden, scale=0.3)
        w[x + "down_proj.weight"] = rnd(hidden, intermediate, scale=0.3)
        w[p + "mlp.shared_expert_gate.weight"] = rnd(1, hidden, scale=0.5)
    return w
