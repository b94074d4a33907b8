"""gpt-oss beyond the parity of tests/engine/test_families_parity.py: its experts as published (MXFP4
blocks and scales) dequantized as transformers dequantizes them, a checkpoint holding them the same
model as one holding their values (dequantized at load, or kept in their blocks in tiles), its harmony
tool format end to end on its own architecture, and its chosen experts' products grouped."""

from __future__ import annotations

import json

import pytest
import torch

import agentkv as ak
from agentkv.engine.gpt_oss_weights import dequantize_mxfp4
from agentkv.kernels import cpu_native
from agentkv.kernels.cpu_quant import QUANT_TYPES
from tests.reference import engine_logits, rel_error
from tests.tiny_families import make_family_model

transformers = pytest.importorskip("transformers")
TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


def _random_mxfp4(g: torch.Generator, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks [*shape, 16] and scales [*shape] (powers of two near 1/4, as trained weights' are)."""
    blocks = torch.randint(0, 256, (*shape, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(122, 127, shape, generator=g, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_dequantizes_as_transformers_does():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4(torch.Generator().manual_seed(0), 3, 10, 4)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2), theirs)
    assert set(dequantize_mxfp4(blocks[:1, :1, :1], torch.full((1, 1, 1), 127, dtype=torch.uint8)).flatten().tolist()
               ) <= {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0}


def test_a_checkpoint_with_mxfp4_experts_is_the_model_of_their_values(tmp_path):
    """The published layout (experts' matrices as MXFP4 blocks and scales, output-major) against the
    same model with the values written out as transformers holds them, and against HF's logits."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    src = make_family_model(tmp_path / "plain", "gpt_oss")
    cfg = json.loads((src / "config.json").read_text())
    hidden, width, experts = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    tensors = load_file(str(src / "model.safetensors"))
    packed = dict(tensors)
    g = torch.Generator().manual_seed(1)
    for i in range(cfg["num_hidden_layers"]):
        x = f"model.layers.{i}.mlp.experts."
        for name, out_features, in_features in (("gate_up_proj", 2 * width, hidden), ("down_proj", hidden, width)):
            blocks, scales = _random_mxfp4(g, experts, out_features, in_features // 32)
            del packed[x + name]
            packed[x + name + "_blocks"], packed[x + name + "_scales"] = blocks, scales
            tensors[x + name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    mx = tmp_path / "mxfp4"
    mx.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (mx / f.name).write_bytes(f.read_bytes())
    save_file(packed, str(mx / "model.safetensors"), metadata={"format": "pt"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with (ak.Engine(str(src), num_slots=1024) as plain,
          ak.Engine(str(mx), num_slots=1024, quantized_weights=False) as exact,
          ak.Engine(str(mx), num_slots=1024) as kept):
        ids = plain.tokenizer.encode(TEXT)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours, _ = engine_logits(exact, ids)  # dequantized at load
        assert rel_error(ours, ref) < 1e-4 and torch.equal(ours, engine_logits(plain, ids)[0])
        native = cpu_native.load()
        if native is not None and native.qtile_fast:  # kept in their blocks, in tiles (written rows in int8)
            expert = kept._core.runner.model.layers[0].mlp.experts[0]
            for lin in (expert.gate_up_proj, expert.down_proj):
                assert lin.quantized.tiled and lin.quantized.qtype == QUANT_TYPES["MXFP4"][0]
            assert kept.stats()["weight_bytes"] < 0.6 * exact.stats()["weight_bytes"]
        assert rel_error(engine_logits(kept, ids)[0], ref) < 5e-2


def test_harmony_tool_calls_on_gpt_oss_itself(tmp_path):
    """The harmony format (detected from the template) writes a call the tool's schema validates, on
    a tiny gpt-oss (sinks, windows, experts) carrying gpt-oss's template and special tokens."""
    import jsonschema

    from agentkv.chat.formats import Harmony

    path = make_family_model(tmp_path / "m", "gpt_oss", chat="gpt_oss", config={"max_position_embeddings": 4096})
    add = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a"], "additionalProperties": False}}}
    with ak.Engine(str(path), num_slots=8192, seed=0) as engine:
        assert type(engine.tool_format) is Harmony and engine.model_config.attention_sinks
        out = engine.chat([{"role": "user", "content": "add 1"}], tools=[add], tool_choice="required",
                          max_tokens=120, temperature=1.0, seed=5, n=3)
    calls = [c for comp in out.completions for c in comp.tool_calls]
    assert calls
    for call in calls:
        assert call.name == "add"
        jsonschema.validate(call.arguments, add["function"]["parameters"])


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_grouped_experts_are_each_expert_alone(tmp_path, monkeypatch, rows):
    """The chosen experts' products as one native call per kind (csrc/cpu_tgroup.c) give every row the
    bits the experts' own calls give it, on MXFP4 tiles (a GGUF's gpt-oss)."""
    from agentkv.engine.mlp import MoE
    from agentkv.kernels import cpu_native
    from tests.tiny_families import write_family_gguf

    native = cpu_native.load()
    if native is None or not native.qtile_fast:
        pytest.skip("the tiled kernels do not run here")
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_family_model(tmp_path / "src", "gpt_oss", config={"swiglu_limit": 7.0, "num_hidden_layers": 2})
    write_family_gguf(src, tmp_path / "m.gguf")
    with ak.Engine(str(tmp_path / "m.gguf"), num_slots=1024) as engine:
        moe = engine._core.runner.model.layers[0].mlp
        x = torch.randn(rows, engine.model_config.hidden_size, generator=torch.Generator().manual_seed(rows))
        threads = torch.get_num_threads()
        with torch.inference_mode():
            chosen = [moe.experts[i] for i in sorted(set(moe.route(x, None)[0].flatten().tolist()))]
            assert MoE._grouped(chosen, None) and not MoE._grouped(chosen, torch.ones(rows, dtype=torch.bool))
            try:  # (3 threads: a thread's share of the run begins inside an expert's tiles)
                grouped = []
                for n in (1, 2, 3):
                    torch.set_num_threads(n)
                    grouped.append(moe(x, None))
            finally:
                torch.set_num_threads(threads)
            monkeypatch.setattr(MoE, "_grouped", staticmethod(lambda *args: False))
            alone = moe(x, None)
    assert all(torch.equal(g, alone) for g in grouped)
