"""Q5_0 and IQ4_NL matrices kept as the Q8_0 blocks that hold the same weights (engine/gguf_transcode.py):
bit for bit the same floats as the `gguf` package dequantizes from the file's blocks, and a GGUF of
such matrices loads into the tiles (no "dequantized at load" notice) with the HF model's logits."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import agentkv as ak
from agentkv.engine.gguf_transcode import to_q8_0
from agentkv.kernels import cpu_native
from tests.engine.test_gguf_families import write_gguf
from tests.reference import engine_logits, rel_error
from tests.tiny import make_tiny_model

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


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


def test_a_row_of_part_blocks_is_refused():
    with pytest.raises(ValueError, match="multiple of 22"):
        to_q8_0(np.zeros((2, 30), dtype=np.uint8), "Q5_0")


def test_a_q5_0_gguf_runs_in_tiles_with_the_same_logits(tmp_path, monkeypatch, caplog):
    from safetensors.numpy import save_file

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "phi3", tie=False)
    deq = write_gguf(src, tmp_path / "m.gguf", "phi3", "Q5_0")
    save_file({k: np.ascontiguousarray(v) for k, v in deq.items()}, str(src / "model.safetensors"))
    text = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
    with caplog.at_level(logging.WARNING, logger="agentkv"), ak.Engine(str(src), num_slots=1024) as ref, \
            ak.Engine(str(tmp_path / "m.gguf"), num_slots=1024) as kept:
        if cpu_native.load() is not None:  # (blocks are kept only where the C kernels run)
            lin = dict(kept._core.runner.model.named_modules())["layers.0.self_attn.qkv_proj"]
            assert lin.quantized is not None and lin.quantized.qtype == 0  # Q8_0's blocks, in tiles where they run
            assert "dequantized at load" not in caplog.text
        ids = ref.tokenizer.encode(text)
        assert rel_error(engine_logits(kept, ids)[0], engine_logits(ref, ids)[0]) < 5e-2  # (int8 x, as Q8_0's)


def test_the_notice_names_a_type_that_is_dequantized_and_only_then(tmp_path, monkeypatch, caplog):
    """Q5_1 has no kernel here: one notice names it. Asked for with quantized_weights=False, the
    dequantization is the user's choice: no notice."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "phi3", tie=False)
    write_gguf(src, tmp_path / "m.gguf", "phi3", "Q5_1")
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        with ak.Engine(str(tmp_path / "m.gguf"), num_slots=512, quantized_weights=False):
            pass
        assert "dequantized at load" not in caplog.text
        with ak.Engine(str(tmp_path / "m.gguf"), num_slots=512):
            pass
    if cpu_native.load() is not None:
        assert "Q5_1 matrices" in caplog.text and "dequantized at load" in caplog.text
