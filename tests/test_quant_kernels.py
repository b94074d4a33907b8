"""The quantized linear kernel (csrc/cpu_quant.c) against dequantize-then-matmul: GGUF's Q8_0, Q4_0 and
Q4_1 blocks (made by the `gguf` package, as llama.cpp writes them), 1-40 rows, fp32 and bf16, bias and
residual, and the row dequantization an embedding lookup uses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.kernels import cpu_native
from agentkv.kernels.cpu_native import QUANT_TYPES, QuantWeight

gguf = pytest.importorskip("gguf")
kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(kernels is None, reason="agentkv's C kernels do not build here")


def quantized(name: str, out_features: int, in_features: int, seed: int = 0):
    """(QuantWeight, the fp32 weights its blocks hold)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_features, in_features)) * 0.2).astype(np.float32)
    kind = getattr(gguf.GGMLQuantizationType, name)
    raw = gguf.quants.quantize(w, kind)
    deq = gguf.quants.dequantize(raw, kind).reshape(out_features, in_features)
    return QuantWeight(torch.from_numpy(np.ascontiguousarray(raw)), QUANT_TYPES[name][0], in_features, out_features), \
        torch.from_numpy(deq.copy())


@pytest.mark.parametrize("name", sorted(QUANT_TYPES))
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qlinear_matches_dequantized_matmul(name, rows, dtype):
    w, dense = quantized(name, 96, 160, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 160, generator=g).to(dtype)
    bias, res = torch.randn(96, generator=g).to(dtype), torch.randn(rows, 96, generator=g).to(dtype)
    for b, r in ((None, None), (bias, None), (bias, res)):
        expected = x.float() @ dense.t()
        if b is not None:
            expected += b.float()
        if r is not None:
            expected += r.float()
        got = kernels.qlinear(x, w, b, r)
        assert got.dtype == dtype and got.shape == (rows, 96)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", sorted(QUANT_TYPES))
def test_rows_dequantize_exactly(name):
    w, dense = quantized(name, 50, 64)
    rows = torch.tensor([3, 0, 49, 3])
    assert torch.equal(kernels.qdequant(w, rows, torch.float32), dense[rows])
    assert torch.equal(kernels.qdequant(w, None, torch.float32), dense)
    assert torch.equal(kernels.qdequant(w, rows, torch.bfloat16), dense[rows].bfloat16())
