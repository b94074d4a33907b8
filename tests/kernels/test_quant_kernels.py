"""The quantized linear kernel (csrc/cpu_quant.c) against dequantize-then-matmul: GGUF's Q8_0, Q4_0 and
Q4_1 blocks (made by the `gguf` package, as llama.cpp writes them) and Q4_K / Q6_K super-blocks (random
bytes with small scales: the package dequantizes them, it cannot make them), 1-40 rows, fp32 and bf16,
bias and residual, and the row dequantization an embedding lookup uses."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from agentkv.engine.gguf_transcode import mxfp4_held
from agentkv.kernels import cpu_native, cpu_quant
from agentkv.kernels.cpu_quant import QUANT_TYPES, ROW_MAJOR_TYPES, QuantWeight

gguf = pytest.importorskip("gguf")
kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(kernels is None, reason="agentkv's C kernels do not build here")


K_QUANTS = ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
# the types the row-major kernels multiply (the others run in tiles only: test_tiles.py)
ROW_MAJOR = sorted(name for name, (code, _, _) in QUANT_TYPES.items() if code in ROW_MAJOR_TYPES)


def width(name: str, k: int) -> int:
    """`k` rounded up to whole blocks of the type (256 weights for a K-quant)."""
    block = QUANT_TYPES[name][1]
    return -(-k // block) * block


def k_blocks(kind, shape: tuple[int, ...], rng) -> np.ndarray:
    """Random K-quant blocks for weights of `shape` (rows of blocks, as a GGUF holds them), their fp16
    scales small enough for weights of about +-0.5."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    n = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)

    def halves(lo, hi):
        return rng.uniform(lo, hi, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)

    if kind in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K):
        raw[:, 0:2], raw[:, 2:4] = halves(2e-4, 6e-4), halves(1e-4, 4e-4)  # d, dmin
    elif kind == gguf.GGMLQuantizationType.IQ4_NL:  # (the gguf package does not quantize to it)
        raw[:, 0:2] = halves(1e-3, 4e-3)  # d, for values of +-127
    elif kind == gguf.GGMLQuantizationType.IQ4_XS:
        raw[:, 0:2] = halves(3e-5, 1e-4)  # d, for scales of +-32 times values of +-127
    else:
        raw[:, 208:210] = halves(5e-5, 1.5e-4)  # Q6_K's d, after its quants and scales
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def quantized(name: str, out_features: int, in_features: int, seed: int = 0):
    """(QuantWeight, the fp32 weights its blocks hold)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_features, in_features)) * 0.2).astype(np.float32)
    kind = getattr(gguf.GGMLQuantizationType, name)
    raw = k_blocks(kind, w.shape, rng) if name in (*K_QUANTS, "IQ4_NL") else gguf.quants.quantize(w, kind)
    deq = gguf.quants.dequantize(raw, kind).reshape(out_features, in_features)
    raw = np.ascontiguousarray(raw).view(np.uint8)  # (F16's values as their bytes, as the loader keeps them)
    if name == "MXFP4":  # (as the loader holds it: IQ4_NL's blocks, the scale in fp16)
        raw = mxfp4_held(raw)
    return QuantWeight(torch.from_numpy(raw), QUANT_TYPES[name][0], in_features, out_features), \
        torch.from_numpy(deq.copy())


def int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x as the fast path reads it: per block of 32, int8 at scale amax / 127 (rounded half away from
    zero, as C's roundf), back in fp32."""
    v = x.float().reshape(x.shape[0], -1, 32)
    d = v.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, v / torch.where(d > 0, d, 1), 0)
    q = torch.sign(q) * torch.floor(q.abs() + 0.5)
    return (q * d).reshape(x.shape)


@pytest.mark.parametrize("name", ROW_MAJOR)
@pytest.mark.parametrize("rows", [0, 1, 3, 16, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("exact", [True, False])
def test_qlinear_matches_dequantized_matmul(name, rows, dtype, exact):
    """The exact path equals dequantize-then-matmul; the fast path equals it on x read as int8 blocks
    (rows past 16 whose weight is small go through torch on the dequantized weight: exact either way)."""
    k = width(name, 160)
    w, dense = quantized(name, 96, k, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).to(dtype)
    bias, res = torch.randn(96, generator=g).to(dtype), torch.randn(rows, 96, generator=g).to(dtype)
    fast = not exact and kernels.qlinear_fast and rows <= 16
    for b, r in ((None, None), (bias, None), (bias, res)):
        expected = (int8_blocks(x) if fast and rows else x.float()) @ dense.t()
        if b is not None:
            expected += b.float()
        if r is not None:
            expected += r.float()
        got = kernels.qlinear(x, w, b, r, exact=exact)
        assert got.dtype == dtype and got.shape == (rows, 96)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ROW_MAJOR)
def test_fast_path_stays_close_to_the_exact_one(name):
    """What int8 activations cost: on a realistic layer (576 in; 768 for the K-quants' super-blocks), the
    fast path's outputs within 2% of the exact path's scale."""
    k = width(name, 576) if name not in K_QUANTS else 768
    w, dense = quantized(name, 256, k)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(1))
    exact, fast = kernels.qlinear(x, w, exact=True), kernels.qlinear(x, w)
    assert (fast - exact).abs().max() / exact.abs().max() < 2e-2


@pytest.mark.parametrize("name", sorted(QUANT_TYPES))
def test_rows_dequantize_exactly(name):
    w, dense = quantized(name, 50, width(name, 64))
    rows = torch.tensor([3, 0, 49, 3])
    assert torch.equal(kernels.qdequant(w, rows, torch.float32), dense[rows])
    assert torch.equal(kernels.qdequant(w, None, torch.float32), dense)
    assert torch.equal(kernels.qdequant(w, rows, torch.bfloat16), dense[rows].bfloat16())


@pytest.mark.parametrize("name", ["Q4_1", "Q4_K"])
@pytest.mark.parametrize("rows", [40, 70])
def test_long_inputs_on_a_large_weight(name, rows, monkeypatch):
    """A weight past QLINEAR_DEQUANT_MAX (made small here): 64 rows of x and more multiply slices of its
    rows dequantized (7 rows a slice here, the last one short), fewer go through the kernel 16 rows at
    a time; bias and residual added either way."""
    monkeypatch.setattr(cpu_quant, "QLINEAR_DEQUANT_MAX", 2000)
    k = width(name, 160)
    w, dense = quantized(name, 96, k, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x, bias, res = torch.randn(rows, k, generator=g), torch.randn(96, generator=g), torch.randn(rows, 96, generator=g)
    torch.testing.assert_close(kernels.qlinear(x, w, bias, res, exact=True), x @ dense.t() + bias + res,
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kernels.qlinear(x, w, exact=True), x @ dense.t(), rtol=1e-4, atol=1e-4)


def _has_avx2() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags and " f16c" in flags


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not _has_avx2()
                    or bool(os.environ.get("AGENTKV_CPU_ARCH")),
                    reason="needs an x86 CPU with AVX2, FMA and F16C (and this is not that run already)")
def test_the_avx2_bodies(tmp_path):
    """The kernels built for an AVX2 CPU without AVX-512 or VNNI (-march=haswell: the 256-bit bodies,
    maddubs for the integer dots), which this host runs too: every test above passes on them."""
    env = {**os.environ, "AGENTKV_CPU_ARCH": "haswell", "AGENTKV_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "not avx2_bodies"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-3000:]
