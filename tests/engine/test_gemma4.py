"""Gemma 4 beyond its logits (tests/engine/test_families_parity.py): the multimodal checkpoint Google
publishes serves its language model, the pool holds no KV for the layers that read others' (and the disk
tier keeps the rest across a restart), and what is not served says so."""

from __future__ import annotations

import json

import pytest
import torch

import agentkv as ak
from agentkv.engine.memory import KVPool
from agentkv.engine.model_config import ModelConfig
from agentkv.engine.sharding import local_config
from agentkv.errors import AdapterError, ModelLoadError, RequestError
from agentkv.kernels import cpu_native
from tests.reference import assert_matches_hf, assert_restart_restores
from tests.tiny_families import make_family_model, make_gemma4_multimodal

transformers = pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    return make_family_model(tmp_path_factory.mktemp("gemma4") / "text", "gemma4_text")


def test_the_multimodal_checkpoint_serves_its_language_model(gemma4, tmp_path):
    """Gemma4ForConditionalGeneration (Gemma 4 as published: `model.language_model.*` beside a vision
    tower, the text config nested) gives the text model's logits and greedy tokens."""
    mm = make_gemma4_multimodal(gemma4, tmp_path / "mm")
    assert json.loads((mm / "config.json").read_text())["architectures"] == ["Gemma4ForConditionalGeneration"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma4, dtype=torch.float32).eval()
    assert_matches_hf(mm, hf, TEXT, 8)


def test_the_pool_holds_no_kv_for_the_layers_that_read_others(gemma4, tmp_path):
    """Per token: layers 0, 1, 3 (windowed: 2 KV heads of 16) and 2 (full: one of 32, K and V), nothing
    for 4 and 5, which read 3's and 2's; the disk tier stores and restores that row across a restart."""
    mc = ModelConfig.from_hf(json.loads((gemma4 / "config.json").read_text()))
    assert KVPool.bytes_per_token(mc, torch.float32) == (3 * 2 * 2 * 16 + 2 * 32) * 4
    assert_restart_restores(gemma4, TEXT, tmp_path / "kv")


def test_what_gemma4_is_not_served_with_says_so(gemma4, tmp_path):
    mc = ModelConfig.from_hf(json.loads((gemma4 / "config.json").read_text()))
    with pytest.raises(RequestError, match="tensor_parallel=1"):
        local_config(mc, 2)
    with pytest.raises(AdapterError, match="Gemma 4"):
        ak.Engine(str(gemma4), num_slots=256, lora={"a": str(tmp_path)})


def test_a_config_gemma4_does_not_write_is_refused():
    base = {"architectures": ["Gemma4ForCausalLM"], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}
    with pytest.raises(ModelLoadError, match="per_layer_config"):
        ModelConfig.from_hf({**base, "per_layer_config": {"0": {"head_dim": 32}}})
    with pytest.raises(ModelLoadError, match="vocab_size_per_layer_input"):
        ModelConfig.from_hf({**base, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 100})
    with pytest.raises(ModelLoadError, match="no earlier layer"):
        ModelConfig.from_hf({**base, "num_kv_shared_layers": 1})


def test_full_layers_wider_than_the_c_kernel_take_run_beside_it(tmp_path):
    """Full layers wider than the C attention kernel's heads (512, Gemma 4's own) go the torch route within
    the same pass as the windowed layers' C kernel, and the logits stay HF's."""
    kernels = cpu_native.load()
    if kernels is None:
        pytest.skip("agentkv's C kernels are off or do not build here")
    wide = kernels.max_head_dim + 64
    path = make_family_model(tmp_path / "wide", "gemma4_text", config={"global_head_dim": wide})
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert_matches_hf(path, hf, TEXT, 8, native_kernels=True, attention_backend="cpu")
