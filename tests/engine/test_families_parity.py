"""SmolLM3, Granite, Granite-MoE, GLM-4, GLM-4.5, gpt-oss, DeepSeek-V3, LFM2 and Gemma 4 against transformers'
own implementations: tiny random models built from their transformers configs give HF's logits
(fresh, over a cached prefix, and the one-row decode route) and HF `generate`'s greedy tokens, on
torch ops and on agentkv's C kernels."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import agentkv as ak
from agentkv.engine.model_config import ModelConfig
from tests.reference import assert_matches_hf, assert_restart_restores, engine_logits, rel_error
from tests.tiny_families import make_family_model

transformers = pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."

CASES = [
    ("smollm3", {}),  # layers 1 and 3 without rope
    ("smollm3", {"no_rope_layers": None, "num_hidden_layers": 4, "use_sliding_window": True,
                 "sliding_window": 12}),  # the default: every 4th without rope, and windowed
    ("granite", {}),
    ("granitemoe", {}),
    ("glm4", {}),  # half of each head rotating by adjacent pairs; the sandwich's four norms
    ("glm4", {"partial_rotary_factor": 1.0}),
    ("glm4_moe", {}),  # two groups of four experts, one group chosen; a shared expert; layer 0 dense
    ("glm4_moe", {"use_qk_norm": True, "n_group": 1, "topk_group": 1, "norm_topk_prob": False}),
    # sinks, every other layer windowed, biased linears, clamped experts routed by a softmax over the top 2,
    # YaRN without truncation; and with one layer (the window's only) over a text longer than it
    ("gpt_oss", {}),
    ("gpt_oss", {"num_hidden_layers": 1, "layer_types": ["sliding_attention"], "swiglu_limit": 7.0}),
    # latent attention: the latent and the shared rotated part in the pool, over a cached prefix too; q
    # through its low rank, pairs rotating adjacent (rope_interleave), YaRN's two mscales in the scale
    ("deepseek_v3", {}),
    ("deepseek_v3", {"q_lora_rank": None, "rope_interleave": False, "rope_parameters": {"rope_theta": 10000.0}}),
    # short convolutions (their inputs read back from the pool: over a cached prefix too) beside attention
    ("lfm2", {}),
    ("lfm2", {"conv_L_cache": 4, "conv_bias": True}),
    # Gemma 4 as E2B: full layers twice as wide with one KV head (its values the keys' projection), a quarter of
    # their pairs rotating; the last two layers reading layers 3's and 2's KV; per-layer inputs; capped logits
    ("gemma4_text", {}),
    # as 26B-A4B: four experts (two chosen, a scale each) beside every layer's MLP, no per-layer inputs, values
    # of their own; and each full layer's rope the default one
    ("gemma4_text", {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
                     "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "attention_k_eq_v": False,
                     "use_double_wide_mlp": False, "final_logit_softcapping": None,
                     "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
]


def _hf(path, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


@pytest.mark.parametrize("native", [False, True], ids=["torch", "native"])
@pytest.mark.parametrize("family,config", CASES)
def test_family_matches_hf(tmp_path, family, config, native):
    from agentkv.kernels import cpu_native

    if native and cpu_native.load() is None:
        pytest.skip("agentkv's C kernels are off (AGENTKV_NATIVE_KERNELS=0) or do not build here")
    path = make_family_model(tmp_path / family, family, config=config)
    assert_matches_hf(path, _hf(path), TEXT, 16, native_kernels=native)


@pytest.mark.parametrize("family,config", CASES)
def test_config_round_trips(tmp_path, family, config):
    """What the GGUF conversion writes (to_hf) reads back as the same config."""
    path = make_family_model(tmp_path / family, family, config=config)
    import json

    mc = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    again = ModelConfig.from_hf(mc.to_hf())
    assert again == mc, [f.name for f in dataclasses.fields(mc) if getattr(mc, f.name) != getattr(again, f.name)]


def test_what_each_family_reads():
    """The fields that make each family itself, as its config states them."""
    import json
    import tempfile
    from pathlib import Path

    def config(family, **extra):
        with tempfile.TemporaryDirectory() as d:
            path = make_family_model(Path(d), family, config=extra)
            return ModelConfig.from_hf(json.loads((path / "config.json").read_text()))

    assert config("smollm3").nope_layers == (1, 3)
    assert config("smollm3", no_rope_layers=None, num_hidden_layers=8).nope_layers == (3, 7)
    g = config("granite")
    assert (g.embedding_multiplier, g.residual_multiplier, g.attention_scale, g.logits_scaling) == (
        1.7, 0.45, 0.31, 2.5)
    glm = config("glm4")
    assert glm.rope_interleaved and glm.rotary_dim == 8 and glm.attention_bias
    moe = config("glm4_moe")
    assert (moe.router, moe.expert_groups, moe.expert_groups_chosen, moe.routed_scaling_factor) == (
        "sigmoid_groups", 2, 1, 2.5)
    assert moe.dense_layers == (0,) and moe.shared_expert_intermediate_size == 32 and not moe.shared_expert_gated
    assert not moe.rope_interleaved and moe.rotary_dim == 8
    ds = config("deepseek_v3")
    assert (ds.kv_lora_rank, ds.q_lora_rank, ds.head_dim, ds.qk_nope_head_dim, ds.v_head_dim) == (32, 32, 16, 16, 24)
    assert ds.router == "sigmoid_groups" and ds.dense_layers == (0,) and ds.rope_interleaved
    assert ds.attention_scale == pytest.approx(32 ** -0.5 * (0.1 * 0.8 * math.log(8.0) + 1) ** 2)
    lfm = config("lfm2")
    assert lfm.conv_layers == (0, 2, 3) and lfm.conv_kernel == 3 and lfm.intermediate_size == 128 and lfm.qk_norm
    g4 = config("gemma4_text")
    assert (g4.head_dim, g4.num_kv_heads, g4.global_head_dim, g4.global_kv_heads) == (16, 2, 32, 1)
    assert g4.k_eq_v and g4.kv_shared_layers == 2 and [g4.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 3, 2]
    assert g4.layer_windows == (8, 8, 0, 8, 8, 0) and g4.per_layer_input_size == 8 and g4.double_wide_mlp
    assert (g4.rope_scaling.rope_type, g4.rope_scaling.proportion, g4.rope_theta, g4.local_rope_theta) == (
        "proportional", 0.25, 1_000_000.0, 10_000.0)
    assert g4.attention_scale == 1.0 and g4.final_softcap == 30.0


@pytest.mark.parametrize("family,targets", [
    ("glm4", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]),  # B's q/k rows reordered too
    ("granite", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),  # under the multiplier
])
def test_a_lora_adapter_on_the_family_is_pefts(tmp_path, family, targets):
    from tests.lora_helpers import make_adapter, peft_greedy, peft_logits, peft_model

    path = make_family_model(tmp_path / family, family)
    adapter = make_adapter(path, tmp_path / "adapter", r=8, targets=targets, scale=3.0)
    ref_model = peft_model(path, adapter)
    with ak.Engine(str(path), num_slots=2048, lora={"a": str(adapter)}) as engine:
        ids = engine.tokenizer.encode(TEXT)
        ref = peft_logits(ref_model, ids)
        ours, _ = engine_logits(engine, ids, adapter="a")
        assert rel_error(ours, ref) < 1e-4
        base, _ = engine_logits(engine, ids)
        assert rel_error(base, ref) > 1e-2  # (the adapter changes the logits)
        out = engine.generate(ids, max_tokens=16, temperature=0.0, ignore_eos=True, adapter="a")
    assert out.token_ids == peft_greedy(ref_model, ids, 16)


def test_the_pool_and_the_disk_tier_keep_deepseeks_latent(tmp_path):
    """DeepSeek-V3's pool holds, per token and layer, its latent and rotated key part (32 + 16 values
    here, not 2 x 4 heads x 32), and the disk tier keeps them across a restart."""
    import json

    from agentkv.engine.memory import KVPool

    path = make_family_model(tmp_path / "ds", "deepseek_v3")
    mc = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    assert KVPool.bytes_per_token(mc, torch.float32) == mc.num_layers * (32 + 16) * 4
    assert_restart_restores(path, TEXT, tmp_path / "kv")
