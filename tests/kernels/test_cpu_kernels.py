"""agentkv's C kernels for CPU (kernels/cpu_native.py) against torch references: each element-wise
step, the fp32 / bf16 linear, and the engine on them. Every check runs the AVX-512 bodies (where this CPU
has them) and the plain-C ones. Paged attention: test_cpu_attention.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentkv.engine.rope import _rotate_half
from agentkv.kernels import cpu_native, get_backend
from agentkv.kernels.cpu_backend import CpuAttentionBackend

kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(
    kernels is None, reason=f"native CPU kernels unavailable: {cpu_native.unavailable_reason()}")
DTYPES = [torch.float32, torch.bfloat16]
BODIES = [False, True]  # generic: False runs the AVX-512 bodies where the CPU has AVX-512


def _close(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}


def _hf_rms_norm(x, w, eps):
    """HF's LlamaRMSNorm: fp32 variance, normalized in fp32, cast back, then times the weight."""
    xf = x.float()
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("n", [576, 50])
def test_rms_norm_matches_hf(dtype, generic, n):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(33, n, generator=g) * 3).to(dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(dtype)
    out = kernels.rms_norm(x, w, 1e-5, generic=generic)
    ref = _hf_rms_norm(x, w, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, ref, **_close(dtype))
    if dtype == torch.bfloat16:  # rounded where HF rounds: only a sum's order can move a last bit
        assert (out == ref).float().mean() > 0.995


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
def test_rms_norm_per_head_of_a_strided_view(dtype, generic):
    """Qwen3's q/k norms: [T, heads, D] views into the fused qkv output, each head normalized alone."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(7, 6 * 32, generator=g).to(dtype)
    q = qkv[:, 32 : 5 * 32].view(7, 4, 32)
    w = (torch.rand(32, generator=g) + 0.5).to(dtype)
    torch.testing.assert_close(kernels.rms_norm(q, w, 1e-6, generic=generic), _hf_rms_norm(q, w, 1e-6), **_close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("n", [1536, 40])
@pytest.mark.parametrize("gelu", [False, True])
def test_glu_mul_matches_torch(dtype, generic, n, gelu):
    """silu(gate) * up, and GELU's tanh form (Gemma's) as x / (1 + e^-2y), against that form in fp64
    rounded once (torch's own tanh form loses a small negative x's value to 1 + tanh(y) ~ 0: relative
    errors up to 1 here, and in bf16 it rounds 13% of activations otherwise)."""
    g = torch.Generator().manual_seed(n)
    gate_up = (torch.randn(17, 2 * n, generator=g) * 4).to(dtype)
    gate, up = gate_up.split(n, dim=-1)
    out = kernels.glu_mul(gate_up, gelu, generic=generic)
    if gelu:
        x = gate.double()
        ref = (x / (1 + torch.exp(-2 * 0.7978845608028654 * (x + 0.044715 * x**3)))).to(dtype) * up
    else:
        ref = F.silu(gate) * up
    torch.testing.assert_close(out, ref, **_close(dtype))
    if dtype == torch.bfloat16:  # (GELU's fp32 exponent lands the odd activation across a bf16 rounding)
        assert (out == ref).float().mean() > (0.99 if gelu else 0.995)


@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("n", [1536, 40])
def test_clamped_swiglu_matches_torch(generic, n):
    """gpt-oss's clamped SwiGLU: gate clamped above, up on both sides, gate * sigmoid(alpha gate) * (up + 1),
    against HF's torch ops (values wide enough that both clamps bite)."""
    g = torch.Generator().manual_seed(n)
    gate_up = torch.randn(17, 2 * n, generator=g) * 6
    gate, up = gate_up.split(n, dim=-1)
    out = kernels.glu_mul(gate_up, generic=generic, clamp=(7.0, 1.702))
    gate, up = gate.clamp(max=7.0), up.clamp(min=-7.0, max=7.0)
    torch.testing.assert_close(out, gate * torch.sigmoid(gate * 1.702) * (up + 1), rtol=1e-5, atol=1e-5)
    assert (gate_up.abs() > 7).any()


@pytest.mark.parametrize("norm", [False, True])
def test_moe_routing_matches_torch(norm):
    """Each row's top k experts (in descending order) and their weights: the softmax's over all experts, or
    renormalized over the k, as torch's softmax and topk give them; times a scaling factor."""
    g = torch.Generator().manual_seed(int(norm))
    logits = torch.randn(40, 32, generator=g) * 3
    idx, w = kernels.moe_route(logits, 4, norm, scaling=2.5)
    ref_w, ref_idx = torch.softmax(logits, dim=-1).topk(4, dim=-1)
    if norm:
        ref_w = ref_w / ref_w.sum(dim=-1, keepdim=True)
    assert torch.equal(idx, ref_idx)
    torch.testing.assert_close(w, ref_w * 2.5, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("groups,chosen", [(1, 1), (4, 2), (8, 3)])
def test_grouped_sigmoid_routing_matches_torch(groups, chosen):
    """DeepSeek-V3's (GLM-4.5's) routing: sigmoid scores, chosen by score + bias among the best groups (a group's
    worth its two best), weighed by the scores renormalized, times the routed scaling; against torch's ops."""
    g = torch.Generator().manual_seed(groups)
    logits, bias = torch.randn(40, 32, generator=g) * 2, torch.randn(32, generator=g) * 0.3
    idx, w = kernels.moe_route_groups(logits, bias, 4, groups, chosen, True, scaling=2.5)
    scores = logits.sigmoid()
    choice = scores + bias
    if groups > 1:
        grouped = choice.view(40, groups, -1)
        best = grouped.topk(2, dim=-1).values.sum(dim=-1).topk(chosen, dim=-1).indices
        keep = torch.zeros(40, groups, dtype=torch.bool).scatter_(1, best, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(40, 32)
    ref_idx = choice.topk(4, dim=-1).indices
    ref_w = scores.gather(1, ref_idx)
    assert torch.equal(idx, ref_idx)
    torch.testing.assert_close(w, ref_w / ref_w.sum(dim=-1, keepdim=True) * 2.5, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("D", [64, 16, 12])
def test_rope_rotates_in_place_as_the_reference(dtype, generic, D):
    """q and k heads side by side in the fused qkv output (a strided view), rotated in place."""
    g = torch.Generator().manual_seed(D)
    cos, sin = torch.randn(100, D, generator=g), torch.randn(100, D, generator=g)
    qkv = torch.randn(9, 8 * D, generator=g).to(dtype)
    qk = qkv[:, : 6 * D].view(9, 6, D)
    v_before = qkv[:, 6 * D :].clone()
    pos = torch.randint(0, 100, (9,), generator=g)
    c, s = cos[pos][:, None], sin[pos][:, None]
    expected = (qk.float() * c + _rotate_half(qk.float()) * s).to(dtype)  # fp32, rounded once
    out = kernels.rope_(qk, pos, cos, sin, generic=generic)
    assert out.data_ptr() == qkv.data_ptr()
    torch.testing.assert_close(qkv[:, : 6 * D].view(9, 6, D), expected, **_close(dtype))
    assert torch.equal(qkv[:, 6 * D :], v_before)  # v untouched


def test_auto_picks_the_cpu_backend_and_builds_once(tmp_path, monkeypatch):
    assert get_backend("auto", "cpu").name == "cpu"
    assert get_backend("auto", "cpu", native=False).name == "torch"
    assert isinstance(get_backend("cpu"), CpuAttentionBackend)
    path = cpu_native._library()
    assert path.exists() and cpu_native._library() == path  # cached: the second call compiles nothing


def test_without_a_compiler_they_are_off_and_say_why(tmp_path, monkeypatch):
    from agentkv.errors import RequestError

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path))  # nothing cached there
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    cpu_native._load.cache_clear()
    try:
        assert cpu_native.load() is None
        assert "no-such-cc" in cpu_native.unavailable_reason()
        with pytest.raises(RequestError, match="native_kernels=True"):
            cpu_native.for_engine(True, "cpu", "float32")
        assert cpu_native.for_engine(None, "cpu", "float32") is None
        assert get_backend("auto", "cpu").name == "torch"
        with pytest.raises(RequestError, match="attention_backend='torch'"):
            get_backend("cpu")
        monkeypatch.setenv("AGENTKV_NATIVE_KERNELS", "0")
        cpu_native._load.cache_clear()
        assert "AGENTKV_NATIVE_KERNELS=0" in cpu_native.unavailable_reason()
    finally:
        cpu_native._load.cache_clear()
    with pytest.raises(RequestError, match="float16"):
        cpu_native.for_engine(True, "cpu", "float16")
    assert cpu_native.for_engine(None, "cpu", "float16") is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_on_native_kernels_matches_torch_ops(tiny_dir, dtype):
    """The same engine with the C kernels and with torch ops only: logits of a prefill and of cached
    prefixes agree, and so do greedy outputs of a batch (decodes through the kernel)."""
    import agentkv as ak
    from tests.reference import engine_logits, rel_error

    prompts = [[5 + i, 17, 33 + 2 * i, 9] * (3 + i) for i in range(6)]
    results = {}
    for native in (True, False):
        with ak.Engine(str(tiny_dir), dtype=dtype, num_slots=2048, native_kernels=native) as engine:
            assert engine._core.parts.runner.backend.name == ("cpu" if native else "torch")
            full, _ = engine_logits(engine, prompts[0])
            cached, hit = engine_logits(engine, prompts[0] + [3, 4, 5], cached_prefix=len(prompts[0]))
            assert hit == len(prompts[0])
            outs = engine.generate(prompts, max_tokens=16, temperature=0.0, ignore_eos=True)
            results[native] = full, cached, [o.token_ids for o in outs]
    (full, cached, tokens), (full_t, cached_t, tokens_t) = results[True], results[False]
    tol = 1e-5 if dtype == "float32" else 3e-2
    assert rel_error(full, full_t) < tol and rel_error(cached, cached_t) < tol
    if dtype == "float32":
        assert tokens == tokens_t


def _needs_linear(dtype):
    ok = kernels is not None and dtype in kernels.linear_dtypes
    return pytest.param(
        dtype,
        marks=pytest.mark.skipif(
            not ok, reason=f"csrc/cpu_linear.c is not built for {dtype} on this CPU (AVX-512; bf16 needs AVX512_BF16)"),
    )


LINEAR_DTYPES = [_needs_linear(torch.float32), _needs_linear(torch.bfloat16)]


@pytest.mark.parametrize("dtype", LINEAR_DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("n", [48, 40, 200])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True), (True, True)])
def test_linear_matches_exact_matmul(dtype, rows, n, bias, residual):
    """Decode's row counts (one block of up to 16 rows) and prefill's (blocks of 12), column counts
    that are not a multiple of 16, bias and residual added before the one rounding."""
    g = torch.Generator().manual_seed(rows * n)
    k = 96
    w = (torch.randn(k, n, generator=g) / 8).to(dtype)
    x = torch.randn(rows + 3, k, generator=g).to(dtype)[2 : 2 + rows]  # a view with an offset
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    r = torch.randn(rows, n, generator=g).to(dtype) if residual else None
    out = kernels.linear(x, kernels.pack_linear(w), b, r)
    exact = x.double() @ w.double() + (b.double() if bias else 0) + (r.double() if residual else 0)
    assert out.shape == (rows, n) and out.dtype == dtype
    if dtype == torch.bfloat16:  # fp32 sums in another order, then one rounding: within one bf16 ulp
        torch.testing.assert_close(out.double(), exact, rtol=2**-8, atol=1e-3)
    else:
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", LINEAR_DTYPES)
def test_linear_and_logits_modules_take_the_kernel(dtype):
    from agentkv.engine.model import Linear, LogitsProjection

    g = torch.Generator().manual_seed(5)
    lin = Linear(64, 72, bias=True)
    lin.weight.data = torch.randn(64, 72, generator=g).to(dtype)
    lin.bias.data = torch.randn(72, generator=g).to(dtype)
    weight, bias = lin.weight.data.double(), lin.bias.data.double()
    lin.pack(keep_plain=True, native=kernels)
    assert lin.native_weight is not None and lin.weight is None and lin.packed is None  # the only copy
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    for rows in (1, 9):
        x, res = torch.randn(rows, 64, generator=g).to(dtype), torch.randn(rows, 72, generator=g).to(dtype)
        torch.testing.assert_close(lin(x, res).double(), x.double() @ weight + bias + res.double(), **tol)
    table = torch.randn(100, 64, generator=g).to(dtype)  # [vocab, hidden], as the embedding
    logits = LogitsProjection(table, kernels)
    assert logits.native_weight is not None and logits.packed is None
    torch.testing.assert_close(logits(x).double(), x.double() @ table.double().t(), **tol)
