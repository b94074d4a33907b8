"""agentkv's C kernels for CPU (kernels/cpu_native.py) against torch references: each element-wise
step, and paged attention through the cpu backend against a dense per-request reference. Every
check runs the AVX-512 bodies (where this CPU has them) and the plain-C ones."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.engine.rope import _rotate_half
from agentkv.kernels import cpu_native, get_backend
from agentkv.kernels.base import AttentionMetadata
from agentkv.kernels.cpu_backend import CpuAttentionBackend
from tests.kernels.test_attention import reference

kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(
    kernels is None, reason=f"native CPU kernels unavailable: {cpu_native.unavailable_reason()}")
DTYPES = [torch.float32, torch.bfloat16]
BODIES = [False, True]  # generic: False runs the AVX-512 bodies where the CPU has AVX-512
PREFIX_SLOTS = 300  # _batch: cached prefixes live in slots 1..299, new tokens above


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


def _batch(plans, heads, kv_heads, D, dtype, seed, num_slots=700, prefix_slots=PREFIX_SLOTS):
    """A pool, a slot table and new q/k/v for `plans`: (cached prefix slots, all under prefix_slots;
    new tokens) per request, the new tokens' slots drawn above. k and v are strided views of one fused
    buffer, as the model hands them over."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_slots, kv_heads, D, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, D, generator=g).to(dtype)
    free = (torch.randperm(num_slots - prefix_slots, generator=g) + prefix_slots).tolist()
    width = max(512, max(len(p) + e for p, e in plans))
    table = torch.zeros(len(plans) + 2, width, dtype=torch.int64)
    seq_lens, ext_lens, out_loc = [], [], []
    for row, (prefix, ext) in enumerate(plans):
        new, free = free[:ext], free[ext:]
        table[row, : len(prefix) + ext] = torch.tensor(prefix + new)
        seq_lens.append(len(prefix) + ext)
        ext_lens.append(ext)
        out_loc += new
    T = sum(ext_lens)
    fused = torch.randn(T, (heads + 2 * kv_heads) * D, generator=g).to(dtype)
    q = fused[:, : heads * D].view(T, heads, D)
    k = fused[:, heads * D : (heads + kv_heads) * D].view(T, kv_heads, D)
    v = fused[:, (heads + kv_heads) * D :].view(T, kv_heads, D)
    num_decodes = next((i for i, e in enumerate(ext_lens) if e != 1), len(ext_lens))
    meta = AttentionMetadata(table, torch.arange(len(plans)), seq_lens, ext_lens, num_decodes, torch.tensor(out_loc))
    return meta, q, k, v, k_cache, v_cache


def _prefix_pool(g: torch.Generator) -> list[int]:
    return (torch.randperm(PREFIX_SLOTS - 1, generator=g) + 1).tolist()


def _check(meta, q, k, v, k_cache, v_cache, generic):
    """The pass as written tokens (the decode body), then with the first two thirds of each request's
    new tokens a prompt's (their own tiles and body), against the reference."""
    backends = []
    for m in (meta, dataclasses.replace(meta, prompt_lens=[e - e // 3 for e in meta.extend_lens])):
        backend = get_backend("cpu")
        backend.generic = generic
        backend.prepare(m)
        T, H, D = q.shape
        out = backend.forward(q, k, v, k_cache, v_cache, D**-0.5).view(T, H, D)
        assert torch.equal(k_cache[m.out_cache_loc], k) and torch.equal(v_cache[m.out_cache_loc], v)
        offset = 0
        for row, (s, e) in enumerate(zip(m.seq_lens, m.extend_lens)):
            slots = m.req_to_token[row, :s]
            expected = reference(q[offset : offset + e].float(), k_cache[slots].float(), v_cache[slots].float(),
                                 D**-0.5, s - e)
            torch.testing.assert_close(out[offset : offset + e].float(), expected, **_close(q.dtype))
            offset += e
        backends.append(backend)
    assert int(backends[1].tiles[:, 4].sum()) > 0 and int(backends[0].tiles[:, 4].sum()) == 0
    return backends[0]


@pytest.mark.parametrize("prompt", [0, 1])
@pytest.mark.parametrize("generic", BODIES)
def test_a_querys_attention_does_not_depend_on_its_tile(prompt, generic):
    """The same 37 tokens after 120 cached ones in tiles of 5 and in tiles of 1, 3, 2, ...: each
    query's output is the same bits, in the written tokens' body and in a prompt's."""
    heads, kv_heads, D = 9, 3, 64
    meta, q, k, v, kc, vc = _batch([(list(range(1, 121)), 37)], heads, kv_heads, D, torch.float32, seed=5)
    table = meta.req_to_token

    def run(sizes):
        tiles, at = [], 0
        for n in sizes:
            tiles.append([at, n, 0, 121 + at, prompt])
            at += n
        out = torch.empty(37, heads, D)
        kernels.attention(q, k, v, kc, vc, meta.out_cache_loc, table, torch.tensor(tiles), D**-0.5, out,
                          generic=generic)
        return out

    grouped = run([5] * 7 + [2])
    assert torch.equal(grouped, run([1, 3, 2, 4, 5, 5, 5, 5, 5, 2]))
    assert torch.equal(grouped, run([1] * 37))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("heads,kv_heads,D", [(9, 3, 64), (4, 4, 16), (8, 1, 32), (40, 2, 16), (2, 1, 24)])
def test_attention_mixed_batch_matches_reference(dtype, generic, heads, kv_heads, D):
    """Decodes sharing a prefix, an unrelated decode, a short extend after a cached prefix, a fresh
    prefill and a long extend after a long prefix, in one pass, all in the kernel's tiles. 40 query
    heads of one KV head are more than a task takes (split across tasks); D = 24 has no AVX-512 body."""
    g = torch.Generator().manual_seed(heads * D)
    pool = _prefix_pool(g)
    shared, long_prefix = pool[:40], pool[:276]
    plans = [(shared, 1), (shared[:25], 1), ([], 1), (shared[:30], 7), ([], 75), (long_prefix, 37)]
    meta, q, k, v, kc, vc = _batch(plans, heads, kv_heads, D, dtype, seed=heads + D)
    backend = _check(meta, q, k, v, kc, vc, generic)
    assert backend.native and sum(t[1] for t in backend.tiles.tolist()) == q.shape[0]  # every token in a tile


@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("heads,kv_heads,D", [(9, 3, 64), (8, 1, 32), (2, 1, 24)])
def test_attention_keeps_16_bit_kv_under_fp32_activations(generic, heads, kv_heads, D):
    """fp32 q/k/v over a bf16 pool: the new K/V stored rounded as torch rounds them, every query
    attending over the bf16 keys and values in fp32 (the fp32 reference over the same values)."""
    g = torch.Generator().manual_seed(D)
    pool = (torch.randperm(1999, generator=g) + 1).tolist()
    plans = [(pool[:40], 1), ([], 1), (pool[:30], 7), ([], 75), (pool[:1300], 3)]
    meta, q, k, v, kc, vc = _batch(plans, heads, kv_heads, D, torch.float32, seed=D, num_slots=2200,
                                   prefix_slots=2000)
    kc, vc = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    backend = get_backend("cpu")
    backend.generic = generic
    backend.prepare(meta)
    out = backend.forward(q, k, v, kc, vc, D**-0.5).view(*q.shape)
    assert backend.native and out.dtype == torch.float32
    loc = meta.out_cache_loc
    assert torch.equal(kc[loc], k.to(torch.bfloat16)) and torch.equal(vc[loc], v.to(torch.bfloat16))
    offset = 0
    for row, (seq, ext) in enumerate(zip(meta.seq_lens, meta.extend_lens)):
        slots = meta.req_to_token[row, :seq]
        expected = reference(q[offset : offset + ext], kc[slots].float(), vc[slots].float(), D**-0.5, seq - ext)
        torch.testing.assert_close(out[offset : offset + ext], expected, **_close(torch.float32))
        offset += ext


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 90), st.integers(1, 40)), min_size=1, max_size=6),
    st.sampled_from([(6, 2, 16), (3, 3, 32), (12, 4, 48)]),
    st.sampled_from(DTYPES),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_attention_matches_reference_for_any_lengths(shapes, heads_dim, dtype, generic, seed):
    """Random prefixes and extend lengths (tiles cut anywhere, blocks of 16 keys partly filled)."""
    heads, kv_heads, D = heads_dim
    shapes = sorted(shapes, key=lambda s: s[1] != 1)  # decodes first, as the scheduler orders them
    g = torch.Generator().manual_seed(seed)
    pool = _prefix_pool(g)
    plans = [(pool[:prefix], ext) for prefix, ext in shapes]  # prefixes overlap, as cached ones do
    meta, q, k, v, kc, vc = _batch(plans, heads, kv_heads, D, dtype, seed)
    _check(meta, q, k, v, kc, vc, generic)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("plans_of,heads,kv_heads", [
    (lambda p: [(p[:1499], 1), (p[:20], 1)], 4, 1),  # two decodes, one long: its keys in parts
    (lambda p: [(p[:2600], 1)], 6, 2),  # one decode, two KV heads
    (lambda p: [(p[1000:2300], 3)], 3, 1),  # a short extend after a long prefix: one tile in parts
])
def test_attention_splits_few_long_tasks_into_parts(dtype, generic, plans_of, heads, kv_heads):
    """With fewer tasks than twice the threads and a long context, a task's keys are split across
    threads and the parts merged (parts of a short tile are empty): the same result as the reference."""
    g = torch.Generator().manual_seed(11)
    pool = (torch.randperm(2999, generator=g) + 1).tolist()
    meta, q, k, v, kc, vc = _batch(
        plans_of(pool), heads, kv_heads, 64, dtype, seed=3, num_slots=3100, prefix_slots=3000)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the split needs at least two threads' worth of tasks to make
    try:
        _check(meta, q, k, v, kc, vc, generic)
    finally:
        torch.set_num_threads(threads)


def test_float16_and_head_dims_over_the_kernel_fall_back_to_torch():
    for dtype, D in ((torch.float16, 16), (torch.float32, kernels.max_head_dim + 16)):
        meta, q, k, v, kc, vc = _batch([([], 1), ([], 5)], 2, 1, D, torch.float32, seed=1)
        q, k, v, kc, vc = (t.to(dtype) for t in (q, k, v, kc, vc))
        backend = get_backend("cpu")
        backend.prepare(meta)
        out = backend.forward(q, k, v, kc, vc, D**-0.5)
        assert not backend.native and out.shape == (6, 2 * D)


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


def test_attention_checks_every_index_before_it_touches_memory():
    """A slot past the pool, in the new tokens' slots or in the table, is refused with nothing written."""
    from agentkv.errors import EngineError

    meta, q, k, v, kc, vc = _batch([([1, 2, 3], 1), ([], 2)], 4, 2, 16, torch.float32, seed=2)
    out = torch.empty(3, 4, 16)
    tiles = torch.tensor([[0, 1, 0, 4, 0], [1, 2, 1, 1, 1]])
    before = kc.clone()
    bad_loc = meta.out_cache_loc.clone()
    bad_loc[1] = kc.shape[0]
    with pytest.raises(EngineError, match="new token's slot"):
        kernels.attention(q, k, v, kc, vc, bad_loc, meta.req_to_token, tiles, 0.25, out)
    table = meta.req_to_token.clone()
    table[0, 1] = -5
    with pytest.raises(EngineError, match="slot in the table"):
        kernels.attention(q, k, v, kc, vc, meta.out_cache_loc, table, tiles, 0.25, out)
    with pytest.raises(EngineError, match="a tile"):
        kernels.attention(q, k, v, kc, vc, meta.out_cache_loc, meta.req_to_token,
                          tiles + torch.tensor([0, 0, 0, 999, 0]), 0.25, out)
    assert torch.equal(kc, before)
    kernels.attention(q, k, v, kc, vc, meta.out_cache_loc, meta.req_to_token, tiles, 0.25, out)  # the valid pass runs
    assert torch.equal(kc[meta.out_cache_loc], k)
