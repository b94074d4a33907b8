"""SmolLM3, Granite, Granite-MoE, GLM-4, GLM-4.5, LFM2, gpt-oss (its experts in MXFP4) and DeepSeek-V3
from GGUF files laid out as llama.cpp's converter writes them (the `gguf` package writing the tiny
checkpoints of tests/tiny_families.py): the same model as the HF checkpoint holding the same weights,
HF's greedy tokens, and the native decode step giving the Python path's logits bit for bit on the
dense ones."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import torch

import agentkv as ak
from agentkv.kernels import cpu_native
from agentkv.kernels.cpu_quant import QUANT_TYPES
from tests.engine.test_native_step import PROMPTS, step_and_python
from tests.reference import engine_logits, rel_error
from tests.tiny_families import make_family_model, write_family_gguf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
# the fields that make each family itself, which the file must give as the checkpoint's config does
FIELDS = ("family", "num_layers", "nope_layers", "embedding_multiplier", "residual_multiplier", "attention_scale",
          "logits_scaling", "rotary_dim", "attention_bias", "qk_norm", "num_experts", "experts_per_token",
          "norm_topk_prob", "router", "expert_groups", "expert_groups_chosen", "routed_scaling_factor",
          "dense_layers", "shared_expert_intermediate_size", "shared_expert_gated", "tie_word_embeddings",
          "conv_layers", "conv_kernel", "intermediate_size", "num_kv_heads", "rms_norm_eps", "attention_sinks",
          "o_proj_bias", "router_bias", "mlp_bias", "hidden_act", "layer_windows", "rope_scaling", "kv_lora_rank",
          "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "head_dim", "attention_scale", "rope_interleaved")
# SmolLM3's GGUF says nothing of its layers without rope: llama.cpp fixes every 4th, as its config's default
CONFIGS = {"smollm3": {"no_rope_layers": None},
           # (llama.cpp fixes gpt-oss's clamp at 7 and windows every other layer from the first)
           "gpt_oss": {"swiglu_limit": 7.0, "num_hidden_layers": 2},
           # (a GGUF holds YaRN's log multiplier alone: DeepSeek's two mscales equal, as its configs set them)
           "deepseek_v3": {"rope_parameters": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                               "original_max_position_embeddings": 64, "mscale": 0.8,
                                               "mscale_all_dim": 0.8, "rope_theta": 10000.0}}}


def _as_float32(value):
    """A config field with its floats as float32 (a GGUF's), dataclasses field by field."""
    if dataclasses.is_dataclass(value):
        return tuple(_as_float32(getattr(value, f.name)) for f in dataclasses.fields(value))
    return np.float32(value) if isinstance(value, float) else value


def _pair(tmp_path, family: str, quant: str = "Q8_0"):
    """The GGUF of a tiny `family` model, and the HF checkpoint holding the weights the file holds."""
    src = make_family_model(tmp_path / "src", family, config=CONFIGS.get(family))
    deq = write_family_gguf(src, tmp_path / "m.gguf", quant)
    ref = tmp_path / "ref"
    shutil.copytree(src, ref)
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in deq.items()}, str(ref / "model.safetensors"),
              metadata={"format": "pt"})
    return str(tmp_path / "m.gguf"), ref


@pytest.mark.parametrize("family", ["smollm3", "granite", "granitemoe", "glm4", "glm4_moe", "lfm2", "gpt_oss",
                                    "deepseek_v3"])
def test_a_gguf_is_the_checkpoint_it_was_written_from(tmp_path, monkeypatch, family):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path, ref_dir = _pair(tmp_path, family)
    with (ak.Engine(str(ref_dir), num_slots=1024) as ref,
          ak.Engine(path, num_slots=1024, quantized_weights=False) as exact,
          ak.Engine(path, num_slots=1024) as kept):
        for f in FIELDS:  # (a GGUF holds its multipliers as float32)
            if f == "rope_interleaved" and family in ("glm4", "deepseek_v3"):  # (the conversion reorders the rows)
                assert not exact.model_config.rope_interleaved and ref.model_config.rope_interleaved
                continue
            a, b = getattr(exact.model_config, f), getattr(ref.model_config, f)
            assert _as_float32(a) == _as_float32(b), f
        native = cpu_native.load()
        if family == "gpt_oss" and native is not None and native.qtile_fast:  # the experts in MXFP4 tiles
            expert = kept._core.runner.model.layers[0].mlp.experts[0].gate_up_proj.quantized
            assert expert is not None and expert.tiled and expert.qtype == QUANT_TYPES["MXFP4"][0]
        if family == "deepseek_v3" and native is not None and native.qtile_fast:  # in their blocks, rows reordered
            attn = kept._core.runner.model.layers[0].self_attn
            assert all(getattr(attn, n).quantized is not None for n in ("q_a_proj", "q_proj", "kv_a_proj", "o_proj"))
        ids = ref.tokenizer.encode(TEXT)
        expected = engine_logits(ref, ids)[0]
        assert rel_error(engine_logits(exact, ids)[0], expected) < 1e-4  # the conversion: the same weights
        assert rel_error(engine_logits(kept, ids)[0], expected) < 5e-2  # in their blocks: int8 activations
        out = exact.generate(ids, max_tokens=16, temperature=0.0, ignore_eos=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    greedy = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert out.token_ids == greedy[0, len(ids):].tolist()


@pytest.mark.skipif(cpu_native.load() is None or not cpu_native.load().qtile_fast,
                    reason="the native step needs the C kernels' tiled bodies (AVX-512 VNNI or AVX2)")
@pytest.mark.parametrize("family", ["smollm3", "granite", "glm4", "gpt_oss", "glm4_moe", "granitemoe"])
@pytest.mark.parametrize("batch", [1, 16])
def test_the_native_step_gives_the_python_paths_logits(tmp_path, monkeypatch, family, batch):
    """Layers without rope, Granite's multipliers (embeddings, residuals, scores, logits), GLM-4's
    sandwich with half of each head rotating, gpt-oss (sinks, biases, windows, its MXFP4 experts routed
    and run in the step, their clamped SwiGLU), GLM-4.5 (DeepSeek-V3's router: sigmoid scores, the
    correction bias, two groups of which one is chosen; a shared expert; a dense first layer) and Granite-MoE
    (the residual multiplier on the experts' sum) in the step."""
    if family in ("gpt_oss", "glm4_moe", "granitemoe") and torch.float32 not in cpu_native.load().linear_dtypes:
        pytest.skip("the step's mixture of experts reads its F32 router through the fp32 linear kernel (AVX-512)")
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path, _ = _pair(tmp_path, family, "Q4_0")
    with ak.Engine(path, num_slots=2048) as engine:
        pairs = step_and_python(engine, PROMPTS[:batch], max_tokens=20)
    assert len(pairs) >= 19
    for got, ref, _ in pairs:
        assert torch.equal(got, ref)
