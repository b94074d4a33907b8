"""The native decode step on Gemma 4 GGUFs (csrc/cpu_step_gemma4.h, and cpu_step.c's shapes a layer) against
the Python path running the same kernels: the same logits and final states, bit for bit, at batch 1 and 16,
over windows and over keys in parts, for E2B's form (full layers of wider heads and one KV head whose values
are their keys' projection, layers reading earlier layers' KV with a wider MLP, per-layer inputs from a table
in the file's blocks, a scalar a layer), the dense form (no per-layer inputs, no shared KV) and 26B-A4B's
(experts beside each layer's MLP, routed from the residual normed on its own, a scale per expert, each branch
normed)."""

from __future__ import annotations

import pytest
import torch

import agentkv as ak
from tests.engine.test_gemma4_gguf import MOE, write_gemma4_gguf
from tests.engine.test_native_step import PROMPTS, assert_extends_are_the_python_paths, kernels, step_and_python
from tests.tiny_families import make_family_model

pytestmark = pytest.mark.skipif(kernels is None or not kernels.qtile_fast,
                                reason="the native step needs the C kernels' tiled bodies (AVX-512 VNNI or AVX2)")

FORMS = {  # (tests/tiny_families.py's gemma4_text, its per-layer inputs whole blocks of 32 wide)
    "e2b": {"hidden_size_per_layer_input": 32},
    "dense": {"hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "use_double_wide_mlp": False},
    "moe": MOE,
}


def gemma4_gguf(tmp_path, form: str, quant: str, **config) -> str:
    src = make_family_model(tmp_path / "src", "gemma4_text", config=FORMS[form] | config)
    write_gemma4_gguf(src, tmp_path / "g.gguf", quant)
    return str(tmp_path / "g.gguf")


def assert_step_is_python(engine: ak.Engine, prompts: list[str], max_tokens: int) -> None:
    runner = engine._core.runner
    assert runner.native_step is not None, "the native step did not take the model"
    pairs = step_and_python(engine, prompts, max_tokens=max_tokens)
    assert len(pairs) >= max_tokens - 1  # every decode pass went native
    for got, ref, _ in pairs:
        assert got.shape == ref.shape
        assert torch.equal(got, ref)


@pytest.mark.parametrize("form,quant", [("e2b", "Q8_0"), ("e2b", "Q4_0"), ("dense", "Q4_1"), ("moe", "Q8_0")])
@pytest.mark.parametrize("batch", [1, 16])
def test_gemma4_step_logits_are_the_python_paths(tmp_path, monkeypatch, form, quant, batch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    with ak.Engine(gemma4_gguf(tmp_path, form, quant), num_slots=2048) as engine:
        model = engine._core.runner.model
        if form == "e2b":  # (what the step reads: the table in its blocks, a layer reading another's KV)
            assert type(model.per_layer_inputs.table).__name__ == "QuantEmbedding"
            assert model.layers[-1].self_attn.source != len(model.layers) - 1
        if form == "moe":  # (experts whose scales make a difference)
            assert model.layers[0].moe is not None and not torch.all(model.layers[0].moe.expert_scale == 1)
        assert_step_is_python(engine, PROMPTS[:batch], max_tokens=20)


def test_gemma4_extends_are_the_python_paths(tmp_path, monkeypatch, fixed_draft_cost):
    """Jump-forward's forced runs and n-gram drafts in the step: a pass's tokens of one request, each seeing the
    earlier ones through the KV its layer (or, for a shared layer, the layer it reads) wrote in the pass."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    assert_extends_are_the_python_paths(gemma4_gguf(tmp_path, "e2b", "Q8_0"))


@pytest.mark.parametrize("form", ["e2b", "moe"])
def test_gemma4_on_the_plain_c_bodies_stays_close(tmp_path, monkeypatch, form):
    """The step's plain-C bodies (what a CPU without AVX-512 runs beside its tiles) near the Python path's."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    with ak.Engine(gemma4_gguf(tmp_path, form, "Q8_0"), num_slots=1024) as engine:
        engine._core.runner.native_step.generic = True
        pairs = step_and_python(engine, PROMPTS[:4], max_tokens=8)
    assert len(pairs) >= 7
    for got, ref, _ in pairs:  # (the generic bodies round their exps and sums their own way)
        assert torch.allclose(got, ref, rtol=1e-3, atol=1e-3)


def test_gemma4_over_a_16_bit_kv_pool_is_the_python_paths(tmp_path, monkeypatch):
    """The values normed, then rounded to bf16 as torch rounds them, by both paths."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    with ak.Engine(gemma4_gguf(tmp_path, "e2b", "Q8_0"), num_slots=2048, kv_dtype="bfloat16") as engine:
        assert_step_is_python(engine, PROMPTS[:4], max_tokens=12)


def test_gemma4_keys_in_parts_are_the_python_paths(tmp_path, monkeypatch):
    """Past 512 keys a full layer's are attended in parts and merged (the windowed layers' stay one part)."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    long = " ".join(f"word{i}" for i in range(90))  # ~600 tokens of the byte tokenizer
    with ak.Engine(gemma4_gguf(tmp_path, "e2b", "Q8_0", max_position_embeddings=2048), num_slots=4096) as engine:
        assert len(engine.tokenizer.encode(long)) > 520
        assert_step_is_python(engine, [long, long[:300]], max_tokens=6)


def test_the_engine_says_why_a_gemma4_is_not_the_steps(tmp_path, monkeypatch, caplog):
    """The engine says so at start, once, where a file's blocks run in tiles but decode is not the step's (here
    per-layer inputs 16 wide, not whole blocks of 32); a model the step takes starts without a word of it."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_family_model(tmp_path / "narrow", "gemma4_text", config={"hidden_size_per_layer_input": 16})
    write_gemma4_gguf(src, tmp_path / "narrow.gguf", "Q8_0")
    with caplog.at_level("WARNING", logger="agentkv"), ak.Engine(str(tmp_path / "narrow.gguf")) as e:
        assert e._core.runner.native_step is None
    said = [r.getMessage() for r in caplog.records if "Python path" in r.getMessage()]
    assert len(said) == 1 and "per-layer inputs' width 16" in said[0], said
    caplog.clear()
    with caplog.at_level("WARNING", logger="agentkv"), ak.Engine(gemma4_gguf(tmp_path, "e2b", "Q8_0")) as e:
        assert e._core.runner.native_step is not None
    assert "Python path" not in caplog.text
