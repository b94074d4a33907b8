"""The tiled quantized linear (csrc/cpu_tiles.c, cpu_ktiles.c): Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL
/ MXFP4 blocks, Q4_K / Q5_K / Q6_K / IQ4_XS super-blocks and F16 / BF16 values repacked in tiles of 16 rows,
against a reference written here from the formats alone (x quantized to int8 blocks as llama.cpp does,
times the weights the `gguf` package dequantizes); the plain-C body against the AVX-512 one, bit for
bit; rows read back from tiles; and the vocabulary projection whose top logits are re-scored exactly.
The same again, with the native step's tests, on the AVX2 bodies (test_the_avx2_bodies)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentkv.errors import EngineError
from agentkv.kernels import cpu_native
from agentkv.kernels.cpu_quant import QUANT_TYPES, TILE_ROWS
from tests.kernels.test_quant_kernels import K_QUANTS, _has_avx2, quantized

kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(kernels is None, reason="agentkv's C kernels do not build here")
TILED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16", "BF16", "MXFP4")


def width(name: str) -> int:
    """Columns of a test weight: the embedded model's 576, or for a K-quant three super-blocks (an odd
    count: the even and odd sub-blocks' accumulators both end mid-run)."""
    return 768 if name in K_QUANTS else 576


def tile_row_bytes(name: str, k: int) -> int:
    """A row's bytes in tiles: its blocks' (Q4_K: its 6-bit scales and minimums a byte each, 148 a
    super-block against 144)."""
    own = {"Q4_K": 148, "Q5_K": 180, "IQ4_XS": 138}  # (a byte a scale; Q5_K's fifth bits as q5_bit places them)
    return k // 256 * own[name] if name in own else k // QUANT_TYPES[name][1] * QUANT_TYPES[name][2]


def int8_reference(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the kernel reads it: each block of 32 scaled by amax / 127 and rounded half away
    from zero, in fp64 (numpy's round is half to even, so the rounding is written out)."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    scaled = torch.where(d > 0, blocks / torch.where(d > 0, d, 1), 0)
    q = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    return (q * d).reshape(x.shape)


@pytest.mark.parametrize("name", TILED)
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_linear_matches_the_formats(name, rows, dtype):
    out_features, k = 100, width(name)  # 6 whole tiles and 4 rows of a seventh
    w, deq = quantized(name, out_features, k)
    tiled = kernels.tile(w)
    assert tiled.data.numel() == -(-out_features // TILE_ROWS) * TILE_ROWS * tile_row_bytes(name, k)
    torch.manual_seed(rows)
    x = torch.randn(rows, k).to(dtype)
    bias = torch.randn(out_features).to(dtype)
    residual = torch.randn(rows, out_features).to(dtype)
    got = kernels.qlinear(x, tiled, bias, residual)
    ref = int8_reference(x.float()) @ deq.double().t() + bias.double() + residual.double()
    tol = 1e-5 if dtype == torch.float32 else 3e-2  # (bf16: x, bias, residual and the output each rounded)
    assert ((got.double() - ref).abs() / (ref.abs() + 1)).max() < tol
    plain = kernels.qlinear(x, tiled, bias, residual, generic=True)
    assert torch.equal(got, plain)  # the plain-C body makes the AVX-512 body's operations in its order


@pytest.mark.parametrize("name", TILED)
def test_rows_read_back_from_tiles(name):
    w, deq = quantized(name, 37, 512)
    tiled = kernels.tile(w)
    assert torch.equal(kernels.qdequant(tiled, None, torch.float32), deq)  # (whole: a tile at a time)
    assert torch.equal(kernels.qdequant(tiled, None, torch.bfloat16), deq.bfloat16())
    rows = torch.tensor([36, 0, 17, 17])
    assert torch.equal(kernels.qdequant(tiled, rows, torch.float32), deq[rows])


@pytest.mark.parametrize("name", TILED)
def test_logits_rescore_the_top_exactly(name):
    """The greedy token and the top logits are the fp32 product's; the rest are the int8 product's."""
    k = width(name)
    w, deq = quantized(name, 4000, k, seed=3)
    tiled = kernels.tile(w)
    torch.manual_seed(0)
    x = torch.randn(3, k)
    exact = (x.double() @ deq.double().t()).float()
    got = kernels.qlogits(x, tiled, rescore=32)
    approx = kernels.qlinear(x, tiled)
    for m in range(3):
        top = approx[m].topk(32).indices
        assert torch.allclose(got[m, top], exact[m, top], rtol=1e-5, atol=1e-5)
        rest = torch.ones(4000, dtype=torch.bool)
        rest[top] = False
        assert torch.equal(got[m, rest], approx[m, rest])
        assert got[m].argmax() == exact[m].argmax()
    assert torch.equal(got, kernels.qlogits(x, tiled, rescore=32, generic=True))


def test_exact_linear_of_a_tiled_weight_dequantizes():
    w, deq = quantized("Q8_0", 64, 128)
    x = torch.randn(2, 128)
    got = kernels.qlinear(x, kernels.tile(w), exact=True)
    assert torch.allclose(got, x @ deq.t(), rtol=1e-5, atol=1e-5)


def test_packing_refuses_a_row_of_partial_blocks():
    w, _ = quantized("Q4_K", 16, 256)
    w.in_features = 288  # not whole super-blocks
    with pytest.raises(EngineError, match="refused its shape"):
        kernels.tile(w)
    assert np.array_equal(kernels.tile(quantized("Q4_0", 16, 32)[0]).data.shape, (1, 1, TILE_ROWS * 18))
    assert np.array_equal(kernels.tile(quantized("Q4_K", 16, 512)[0]).data.shape, (1, 2, TILE_ROWS * 148))


@pytest.mark.parametrize("name", TILED)
@pytest.mark.parametrize("rows", [1, 7, 13, 40])
def test_exact_product_is_a_gemm_over_the_tiles(name, rows):
    """agentkv_qtile_exact (csrc/cpu_tgemm.c: a prompt's rows, any number): x in fp32 times the weights
    dequantized a panel of 256 columns at a time (576 columns: two panels and a short one; a K-quant's
    768: three), x's rows in groups of at most 12 (13: 7 + 6); the plain-C body gives the SIMD body's
    bits."""
    w, deq = quantized(name, 100, width(name), seed=rows)
    tiled = kernels.tile(w)
    x = torch.randn(rows, width(name))
    residual = torch.randn(rows, 100)
    got = kernels._qkernel(x, tiled, None, residual, True, False)
    ref = x.double() @ deq.double().t() + residual.double()
    assert ((got.double() - ref).abs() / (ref.abs() + 1)).max() < 1e-5
    assert torch.equal(got, kernels._qkernel(x, tiled, None, residual, True, True))


@pytest.mark.skipif(kernels is None or not kernels.exact_bf16_available, reason="no AVX512_BF16 body here")
@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows", [1, 13, 40])
def test_the_opt_in_bf16_exact_product(name, rows):
    """prompt_precision="bfloat16": x and the dequantized weights rounded to bf16 (nearest even), products
    summed in fp32 (vdpbf16ps), so the result is that of the rounded operands within fp32 summation order,
    and apart from the fp32 body's by bf16's rounding."""
    w, deq = quantized(name, 100, width(name), seed=rows)
    tiled = kernels.tile(w)
    x = torch.randn(rows, width(name))
    residual = torch.randn(rows, 100)
    bf = kernels.with_exact_bf16()
    got = bf._qkernel(x, tiled, None, residual, True, False)
    rounded = x.bfloat16().double() @ deq.bfloat16().double().t() + residual.double()
    assert ((got.double() - rounded).abs() / (rounded.abs() + 1)).max() < 1e-5
    fp32 = kernels._qkernel(x, tiled, None, residual, True, False)
    assert 1e-4 < ((got - fp32).abs() / (fp32.abs() + 1)).max() < 5e-2  # (bf16's rounding, no more)
    assert not kernels.exact_bf16 and torch.equal(kernels._qkernel(x, tiled, None, residual, True, False), fp32)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K"])
def test_a_long_exact_product_takes_x_a_block_at_a_time(name):
    """4096 columns: x's rows go through every tile 4 groups at a time (so that a tile's rows stay in L2),
    100 rows as 9 groups of 11-12 in blocks of 4 + 4 + 1; x in bf16 with a bias and a residual, through
    qlinear as a prompt's pass calls it."""
    w, deq = quantized(name, 40, 4096, seed=3)
    tiled = kernels.tile(w)
    g = torch.Generator().manual_seed(0)
    x, bias, res = (torch.randn(100, 4096, generator=g).bfloat16(), torch.randn(40, generator=g).bfloat16(),
                    torch.randn(100, 40, generator=g).bfloat16())
    got = kernels.qlinear(x, tiled, bias, res, exact=True)
    ref = x.double() @ deq.double().t() + bias.double() + res.double()
    scale = x.double().abs() @ deq.double().abs().t() + bias.double().abs() + res.double().abs()
    assert got.dtype == torch.bfloat16
    assert ((got.double() - ref).abs() / (ref.abs() + 1)).max() < 1e-2  # (bf16's rounding of the output)
    fp32 = kernels.qlinear(x.float(), tiled, bias.float(), res.float(), exact=True)
    assert ((fp32.double() - ref).abs() / scale).max() < 1e-6  # (fp32 sums of 4096 products, in order)
    assert torch.equal(got, fp32.bfloat16())
    assert torch.equal(fp32, kernels.qlinear(x.float(), tiled, bias.float(), res.float(), exact=True, generic=True))


def test_rows_by_kind_are_computed_as_alone():
    """linear.by_row_kind: in a pass mixing a prompt's rows (exact) and written ones (int8), each written
    row is what it is alone (its numbers never depend on its pass), and the prompt's rows are their
    exact product."""
    from agentkv.engine.linear import by_row_kind

    w, _ = quantized("Q4_1", 64, 128)
    tiled = kernels.tile(w)
    x = torch.randn(20, 128)
    kinds = torch.tensor([i % 3 == 0 for i in range(20)])

    def run(exact, xs, adds):
        return kernels.qlinear(xs, tiled, None, adds, exact=exact)

    got = by_row_kind(run, x, None, kinds)
    for i in (~kinds).nonzero().squeeze(1).tolist():
        assert torch.equal(got[i], kernels.qlinear(x[i : i + 1], tiled)[0])
    assert torch.equal(got[kinds], kernels.qlinear(x[kinds], tiled, exact=True))
    assert torch.equal(by_row_kind(run, x, None, None), kernels.qlinear(x, tiled))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not _has_avx2()
                    or bool(os.environ.get("AGENTKV_CPU_ARCH")),
                    reason="needs an x86 CPU with AVX2, FMA and F16C (and this is not that run already)")
def test_the_avx2_bodies(tmp_path):
    """The tiles built for an AVX2 CPU without AVX-512 (-march=haswell: two halves of 8 rows a tile,
    maddubs for the dots), which this host runs too: this file's tests and the native step's pass on
    them, the embedded model's greedy parity with its near tie included."""
    env = {**os.environ, "AGENTKV_CPU_ARCH": "haswell", "AGENTKV_CACHE_DIR": str(tmp_path)}
    step_tests = Path(__file__).resolve().parents[1] / "engine" / "test_native_step.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, str(step_tests),
                           "-k", "not avx2_bodies and not opt_in_bf16"],  # (an AVX2 build has no bf16 body)
                          env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-3000:]


@pytest.mark.parametrize("name", ["MXFP4", "Q8_0", "Q4_K"])
def test_grouped_products_are_each_alone(name):
    """qlinear_grouped (csrc/cpu_tgroup.c: a mixture of experts' chosen experts as one call): each
    product's rows the bits qlinear gives them, whatever the threads (3: a thread's share of the run
    starts inside a product's tiles), with biases and without."""
    k = width(name)
    weights = [kernels.tile(quantized(name, 200, k, seed=s)[0]) for s in range(3)]
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(m, k, generator=g) for m in (1, 4, 2)]
    biases = [torch.randn(200, generator=g), None, torch.randn(200, generator=g)]
    alone = [kernels.qlinear(x, w, b) for x, w, b in zip(xs, weights, biases)]
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            for got, ref in zip(kernels.qlinear_grouped(xs, weights, biases), alone):
                assert torch.equal(got, ref)
    finally:
        torch.set_num_threads(threads)
