"""GGUF files of the families beyond Llama: Qwen3-MoE (experts stacked by kind, kept in their blocks),
Qwen2-MoE (a shared expert) and Phi-3 (fused q/k/v and gate/up, a sliding window), each written by
the `gguf` package as llama.cpp lays them out and checked against the HF directory holding the same
(dequantized) weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import agentkv as ak
from agentkv.engine import gguf_convert
from agentkv.kernels import cpu_native
from tests.engine.test_loading import gguf_writer
from tests.engine.test_model_parity import PHI4_ROPE
from tests.kernels.test_quant_kernels import K_QUANTS, k_blocks
from tests.reference import engine_logits, rel_error
from tests.tiny import make_tiny_model

gguf = pytest.importorskip("gguf")

ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "phi3": "phi3"}


def gguf_name(name: str, arch: str) -> str:
    globals_ = {v: k for k, v in gguf_convert._GLOBAL_NAMES.items()}
    if name in globals_:
        return globals_[name]
    i, rest = name[len("model.layers."):].split(".", 1)
    if arch == "phi3" and rest == "mlp.gate_up_proj.weight":
        return f"blk.{i}.ffn_up.weight"
    return f"blk.{i}." + {v: k for k, v in gguf_convert._LAYER_NAMES.items()}[rest]


def write_gguf(src, out, family: str, quant: str) -> dict[str, np.ndarray]:
    """The tiny HF checkpoint `src` as a GGUF of `family`; returns the HF tensors it holds, dequantized
    (each expert's own, as the Hub names them)."""
    from safetensors.numpy import load_file

    arch, kind = ARCH[family], getattr(gguf.GGMLQuantizationType, quant)
    cfg = json.loads((src / "config.json").read_text())
    hf = load_file(str(src / "model.safetensors"))
    w = gguf_writer(out, arch, cfg)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    if cfg.get("num_experts"):
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("partial_rotary_factor"):
        w.add_rope_dimension_count(int(cfg["head_dim"] * cfg["partial_rotary_factor"]))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type") == "longrope":  # as llama.cpp writes Phi-3's: factors as tensors, the attention factor
        original = cfg["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(cfg["max_position_embeddings"] / original) / math.log(original)))
        w.add_tensor("rope_factors_long.weight", np.array(rs["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rs["short_factor"], dtype=np.float32))
    experts: dict[tuple[str, str], dict[int, str]] = {}
    for name in hf:  # the Hub's per-expert names, stacked by kind as llama.cpp stores them
        if ".mlp.experts." in name:
            head, e, kind_name = name.rsplit(".", 3)[0], int(name.split(".")[-3]), name.split(".")[-2]
            experts.setdefault((head.rsplit(".experts", 1)[0], kind_name), {})[e] = name
    deq = {}
    rng = np.random.default_rng(0)

    def put(gname: str, data: np.ndarray) -> np.ndarray:
        if data.ndim >= 2:
            # (K-quants: the package cannot make them; random blocks, the weights they hold taken as the model's)
            q = (
                k_blocks(kind, data.shape, rng)
                if quant in K_QUANTS
                else gguf.quants.quantize(data.astype(np.float32), kind)
            )
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=kind)
            return gguf.quants.dequantize(q, kind).reshape(data.shape)
        w.add_tensor(gname, data.astype(np.float32))
        return data.astype(np.float32)

    for name, t in hf.items():
        if ".mlp.experts." not in name:
            deq[name] = put(gguf_name(name, arch), t)
    for (head, kind_name), names in experts.items():
        i = head.split(".")[2]
        stacked = np.stack([hf[names[e]] for e in sorted(names)])
        back = put(f"blk.{i}.ffn_{kind_name.removesuffix('_proj')}_exps.weight", stacked)
        for e in sorted(names):
            deq[names[e]] = back[e]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


@pytest.mark.parametrize("family,kwargs,quant", [
    ("qwen3_moe", {"kv_heads": 4}, "Q8_0"),
    ("qwen3_moe", {"kv_heads": 4}, "Q4_1"),
    ("qwen2_moe", {"tie": False}, "Q8_0"),
    ("phi3", {"sliding_window": 20, "tie": False}, "Q8_0"),
    ("phi3", {"tie": False, "config": PHI4_ROPE}, "Q8_0"),  # partial rotary, LongRoPE's factors as tensors
    # K-quants (rows of whole 256-weight super-blocks: wider layers), experts and the vocabulary included
    ("qwen3_moe", {"kv_heads": 4, "hidden": 256, "intermediate": 512}, "Q4_K"),
    ("phi3", {"tie": False, "hidden": 256, "intermediate": 512}, "Q6_K"),
])
def test_gguf_family_equals_the_hf_dir_with_the_same_weights(tmp_path, monkeypatch, family, kwargs, quant):
    from safetensors.numpy import save_file

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", family, **kwargs)
    deq = write_gguf(src, tmp_path / "m.gguf", family, quant)
    save_file({k: np.ascontiguousarray(v) for k, v in deq.items()}, str(src / "model.safetensors"))
    text = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
    with (ak.Engine(str(src), num_slots=1024) as ref,
          ak.Engine(str(tmp_path / "m.gguf"), num_slots=1024, quantized_weights=False) as exact,
          ak.Engine(str(tmp_path / "m.gguf"), num_slots=1024) as kept):
        for ours in (exact, kept):
            assert ours.model_config.family == family and ours.model_config.num_experts == ref.model_config.num_experts
            assert ours.model_config.layer_windows == ref.model_config.layer_windows
            assert ours.model_config.rotary_dim == ref.model_config.rotary_dim
            a, b = ours.model_config.rope_scaling, ref.model_config.rope_scaling
            assert a.rope_type == b.rope_type and (a.short_factor is None) == (b.short_factor is None)
            if a.short_factor:  # (stored as float32, as they are used)
                assert np.array_equal(np.float32(a.short_factor), np.float32(b.short_factor))
                assert np.array_equal(np.float32(a.long_factor), np.float32(b.long_factor))
        from agentkv.engine.model import Linear

        named = dict(kept._core.runner.model.named_modules())
        if cpu_native.load() is not None:  # (blocks are kept only where the C kernels run)
            assert named["layers.0.self_attn.qkv_proj"].quantized is not None
            assert all(m.quantized is not None for n, m in named.items() if ".experts." in n and isinstance(m, Linear))
        ids = ref.tokenizer.encode(text)
        expected = engine_logits(ref, ids)[0]
        assert rel_error(engine_logits(exact, ids)[0], expected) < 1e-4  # the conversion: the same weights
        # kept in their blocks (experts see a few rows each: the int8 path there, as llama.cpp's; K-quants
        # are multiplied with x in fp32)
        assert rel_error(engine_logits(kept, ids)[0], expected) < (1e-4 if quant in K_QUANTS else 5e-2)
