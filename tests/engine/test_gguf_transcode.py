"""Which blocks a GGUF's matrices run in (engine/gguf_transcode.py): Q5_0, Q5_1, IQ4_NL and MXFP4 in tiles of
their own, a linear whose parts' types differ as a stack of parts, Q5_0, IQ4_NL and MXFP4 as the Q8_0 blocks
that hold the same weights where the tiles do not run (bit for bit the same floats as the `gguf`
package dequantizes from the file's blocks), the same logits as the HF model, and a "dequantized at
load" notice only where a type has no kernel."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import agentkv as ak
from agentkv.engine.gguf_transcode import kept_parts, to_q8_0
from agentkv.kernels import cpu_native
from agentkv.kernels.cpu_quant import QUANT_TYPES
from tests.engine.test_gguf_families import write_gguf
from tests.reference import engine_logits, rel_error
from tests.tiny import make_tiny_model

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    bits = [x.astype(np.float32).view(np.uint32) for x in (a, b)]
    return a.shape == b.shape and np.array_equal(*bits)


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 640)], ids=["matrix", "experts"])
def test_q5_0_blocks_are_the_same_weights_as_q8_0(shape):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 0.05, 3.0], size=shape[:-1] + (1,))).astype(np.float32)
    x[..., :32] = 0.0  # a block of zeros (its scale 0)
    q = gguf.quants.quantize(x, T.Q5_0)
    assert same_bits(gguf.quants.dequantize(to_q8_0(q, "Q5_0"), T.Q8_0), gguf.quants.dequantize(q, T.Q5_0))


def test_iq4_nl_blocks_are_the_same_weights_as_q8_0():
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, size=(6 * 4, 18), dtype=np.uint8)  # every code, in both nibbles
    blocks[:, :2] = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16).view(np.uint8).reshape(-1, 2)
    raw = blocks.reshape(6, 4 * 18)
    assert same_bits(gguf.quants.dequantize(to_q8_0(raw, "IQ4_NL"), T.Q8_0), gguf.quants.dequantize(raw, T.IQ4_NL))


def test_mxfp4_blocks_are_held_and_rewritten_as_the_same_weights():
    """MXFP4 (gpt-oss): held as IQ4_NL-shaped blocks (the power-of-two scale as fp16) and, where the tiles
    do not run, as Q8_0: the same floats as the `gguf` package dequantizes from the file's blocks; a
    scale fp16 cannot hold makes the linear dequantized."""
    from agentkv.engine.gguf_transcode import mxfp4_held

    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(6 * 4, 17), dtype=np.uint8)  # every code, in both nibbles
    blocks[:, 0] = rng.integers(104, 144, size=len(blocks))  # every scale fp16 holds, subnormal ones too
    raw = blocks.reshape(6, 4 * 17)
    held = mxfp4_held(raw)
    assert held.shape == (6, 4 * 18)
    expected = gguf.quants.dequantize(raw, T.MXFP4)
    assert same_bits(gguf.quants.dequantize(to_q8_0(held, "MXFP4"), T.Q8_0), expected)
    (runs, kind), = kept_parts([(raw, "MXFP4")], tiles=True)
    assert kind == "MXFP4" and np.array_equal(runs, held)
    assert kept_parts([(raw, "MXFP4")], tiles=False)[0][1] == "Q8_0"
    raw[0, 0] = 103  # 2^-25: below fp16's least subnormal
    assert mxfp4_held(raw) is None and kept_parts([(raw, "MXFP4")], tiles=True) is None


def test_a_row_of_part_blocks_is_refused():
    with pytest.raises(ValueError, match="multiple of 22"):
        to_q8_0(np.zeros((2, 30), dtype=np.uint8), "Q5_0")


def test_parts_keep_the_files_bytes_where_a_kernel_takes_them():
    q5 = gguf.quants.quantize(np.ones((2, 64), dtype=np.float32), T.Q5_0)
    q8 = gguf.quants.quantize(np.ones((2, 64), dtype=np.float32), T.Q8_0)
    assert kept_parts([(q5, "Q5_0"), (q8, "Q8_0")], tiles=True)[0][0] is q5  # in tiles as the file holds them
    assert [k for _, k in kept_parts([(q5, "Q5_0"), (q8, "Q8_0")], tiles=False)] == ["Q8_0", "Q8_0"]
    assert kept_parts([(q5, "Q5_1")], tiles=False) is None  # Q5_1 has no row-major kernel


@pytest.mark.parametrize("quant,kinds,parts", [
    ("Q5_0", None, ()),
    ("Q5_1", None, ()),
    ("Q5_0", {"attn_v.weight": "Q8_0"}, ("Q5_0", "Q5_0", "Q8_0")),  # Gemma 3 270M Q4_K_M's mixture
    ("Q4_0", {"attn_k.weight": "Q4_1", "ffn_up.weight": "Q8_0"}, ("Q4_0", "Q4_1", "Q4_0")),
])
def test_a_gguf_of_mixed_types_runs_in_its_files_types_with_the_same_logits(
        tmp_path, monkeypatch, caplog, quant, kinds, parts):
    """Each matrix in tiles of its file's type, a linear whose parts' types differ as a stack of parts
    (the native step's too: test_native_step.py), the HF model's logits."""
    from safetensors.numpy import save_file

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "qwen2", tie=False)
    deq = write_gguf(src, tmp_path / "m.gguf", "qwen2", quant, kinds)
    save_file({k: np.ascontiguousarray(v) for k, v in deq.items()}, str(src / "model.safetensors"))
    with caplog.at_level(logging.WARNING, logger="agentkv"), ak.Engine(str(src), num_slots=1024) as ref, \
            ak.Engine(str(tmp_path / "m.gguf"), num_slots=1024) as kept:
        native = cpu_native.load()
        if native is not None and native.qtile_fast:  # (blocks are kept in tiles where their bodies run)
            modules = dict(kept._core.runner.model.named_modules())
            qkv, up = modules["layers.0.self_attn.qkv_proj"].quantized, modules["layers.0.mlp.gate_up_proj"].quantized
            names = {code: name for name, (code, _, _) in QUANT_TYPES.items()}
            assert qkv.tiled and tuple(names[p.qtype] for p in qkv.parts) == parts
            assert not parts or qkv.qtype == -1 and sum(p.out_features for p in qkv.parts) == qkv.out_features
            assert up.tiled and (up.qtype == QUANT_TYPES[quant][0]) == (kinds is None or "ffn_up.weight" not in kinds)
            assert "dequantized at load" not in caplog.text
        ids = ref.tokenizer.encode(TEXT)
        assert rel_error(engine_logits(kept, ids)[0], engine_logits(ref, ids)[0]) < 5e-2  # (int8 x)


def test_the_notice_names_what_is_dequantized_and_only_then(tmp_path, monkeypatch, caplog):
    """A linear with a part in a type no kernel takes (v in TQ2_0) is dequantized whole: one notice names
    the types, its other parts' included. Asked for with quantized_weights=False, the dequantization is
    the user's choice: no notice."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "qwen2", tie=False, hidden=256, intermediate=512)
    write_gguf(src, tmp_path / "m.gguf", "qwen2", "Q4_0", {"attn_v.weight": "TQ2_0"})
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        with ak.Engine(str(tmp_path / "m.gguf"), num_slots=512, quantized_weights=False):
            pass
        assert "dequantized at load" not in caplog.text
        with ak.Engine(str(tmp_path / "m.gguf"), num_slots=512):
            pass
    if cpu_native.load() is not None:
        assert "Q4_0/TQ2_0 matrices" in caplog.text and "dequantized at load" in caplog.text


@pytest.mark.parametrize("quant", ["Q5_0", "Q5_1", "IQ4_NL", "Q5_K", "IQ4_XS", "F16", "BF16", "Q4_K", "Q6_K"])
def test_every_common_gguf_type_loads_without_a_dequantized_notice(tmp_path, monkeypatch, caplog, quant):
    """Each type a Q4_K_M, Q5_K_M, Q6_K, IQ4_XS or float file holds is kept in tiles of its own bytes."""
    native = cpu_native.load()
    if native is None or not native.qtile_fast:
        pytest.skip("the tiles' bodies (AVX-512 VNNI or AVX2) do not run here")
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "qwen2", tie=False, hidden=256, intermediate=512)
    write_gguf(src, tmp_path / "m.gguf", "qwen2", quant)
    with caplog.at_level(logging.WARNING, logger="agentkv"), \
            ak.Engine(str(tmp_path / "m.gguf"), num_slots=512) as engine:
        down = dict(engine._core.runner.model.named_modules())["layers.0.mlp.down_proj"].quantized
        assert down.tiled and down.qtype == QUANT_TYPES[quant][0]
        assert engine.generate("hi", max_tokens=2, temperature=0).completions[0].token_ids
    assert "dequantized at load" not in caplog.text
