"""Paged attention in agentkv's C kernel (csrc/cpu_attention.c) through the cpu backend, against a dense
per-request reference: decodes and extends mixed in one pass, the written tokens' body and a prompt's
tiles' body, 16-bit KV, split long tasks, the fallbacks, and every index checked. Every check runs the
AVX-512 bodies (where this CPU has them) and the plain-C ones."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.kernels import cpu_native, get_backend
from agentkv.kernels.base import AttentionMetadata
from tests.kernels.test_attention import reference
from tests.kernels.test_cpu_kernels import BODIES, DTYPES, _close

kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(
    kernels is None, reason=f"native CPU kernels unavailable: {cpu_native.unavailable_reason()}")
PREFIX_SLOTS = 300  # _batch: cached prefixes live in slots 1..299, new tokens above


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


def _check(meta, q, k, v, k_cache, v_cache, generic, sinks=None):
    """The pass as written tokens (the decode body), then with the first two thirds of each request's
    new tokens a prompt's (their own tiles and body), against the reference (`sinks`: gpt-oss's)."""
    backends = []
    for m in (meta, dataclasses.replace(meta, prompt_lens=[e - e // 3 for e in meta.extend_lens])):
        backend = get_backend("cpu")
        backend.generic = generic
        backend.prepare(m)
        T, H, D = q.shape
        out = backend.forward(q, k, v, k_cache, v_cache, D**-0.5, sinks=sinks).view(T, H, D)
        assert torch.equal(k_cache[m.out_cache_loc], k) and torch.equal(v_cache[m.out_cache_loc], v)
        offset = 0
        for row, (s, e) in enumerate(zip(m.seq_lens, m.extend_lens)):
            slots = m.req_to_token[row, :s]
            expected = reference(q[offset : offset + e].float(), k_cache[slots].float(), v_cache[slots].float(),
                                 D**-0.5, s - e, sinks)
            torch.testing.assert_close(out[offset : offset + e].float(), expected, **_close(q.dtype))
            offset += e
        backends.append(backend)
    (tiles1,), (tiles0,) = backends[1].tiles.values(), backends[0].tiles.values()
    assert int(tiles1[:, 4].sum()) > 0 and int(tiles0[:, 4].sum()) == 0
    return backends[0]


@pytest.mark.parametrize("window", [0, 45])
@pytest.mark.parametrize("prompt", [0, 1])
@pytest.mark.parametrize("generic", BODIES)
def test_a_querys_attention_does_not_depend_on_its_tile(prompt, generic, window):
    """The same 37 tokens after 120 cached ones in tiles of 5 and in tiles of 1, 3, 2, ...: each
    query's output is the same bits, in the written tokens' body and in a prompt's, with a sliding
    window too (each query's window starts elsewhere in its tile's first block)."""
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
                          generic=generic, window=window)
        return out

    grouped = run([5] * 7 + [2])
    assert torch.equal(grouped, run([1, 3, 2, 4, 5, 5, 5, 5, 5, 2]))
    assert torch.equal(grouped, run([1] * 37))


@pytest.mark.parametrize("generic", BODIES)
def test_a_written_tokens_parts_do_not_depend_on_its_tile_or_the_threads(generic):
    """Written tokens whose keys cross the fixed parts' boundary (512): each query's output is the same
    bits in tiles of 5 or of 1, on one thread or two (its keys in the same parts, merged in the same
    order), and close to the reference."""
    heads, kv_heads, D = 9, 3, 64
    meta, q, k, v, kc, vc = _batch([(list(range(1, 491)), 37)], heads, kv_heads, D, torch.float32, seed=7,
                                   prefix_slots=600)
    table = meta.req_to_token

    def run(sizes, threads):
        tiles, at = [], 0
        for n in sizes:
            tiles.append([at, n, 0, 491 + at, 0])
            at += n
        out = torch.empty(37, heads, D)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            kernels.attention(q, k, v, kc, vc, meta.out_cache_loc, table, torch.tensor(tiles), D**-0.5, out,
                              generic=generic)
        finally:
            torch.set_num_threads(before)
        return out

    grouped = run([5] * 7 + [2], 2)
    assert torch.equal(grouped, run([1] * 37, 2))
    assert torch.equal(grouped, run([1] * 37, 1))
    assert torch.equal(grouped, run([4, 5, 5, 5, 5, 5, 5, 3], 1))
    slots = table[0, :527]
    expected = reference(q.float(), kc[slots].float(), vc[slots].float(), D**-0.5, 490)
    torch.testing.assert_close(grouped, expected, **_close(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("heads,kv_heads,D", [(9, 3, 64), (4, 4, 16), (8, 1, 32), (40, 2, 16), (2, 1, 24),
                                              (4, 1, 512)])
def test_attention_mixed_batch_matches_reference(dtype, generic, heads, kv_heads, D):
    """Decodes sharing a prefix, an unrelated decode, a short extend after a cached prefix, a fresh
    prefill and a long extend after a long prefix, in one pass, all in the kernel's tiles. 40 query
    heads of one KV head are more than a task takes (split across tasks); D = 24 has no AVX-512 body;
    D = 512, the widest the kernel takes, is Gemma 4's full layers'."""
    g = torch.Generator().manual_seed(heads * D)
    pool = _prefix_pool(g)
    shared, long_prefix = pool[:40], pool[:276]
    plans = [(shared, 1), (shared[:25], 1), ([], 1), (shared[:30], 7), ([], 75), (long_prefix, 37)]
    meta, q, k, v, kc, vc = _batch(plans, heads, kv_heads, D, dtype, seed=heads + D)
    backend = _check(meta, q, k, v, kc, vc, generic)
    (tiles,) = backend.tiles.values()
    assert backend.native and sum(t[1] for t in tiles.tolist()) == q.shape[0]  # every token in a tile


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", BODIES)
@pytest.mark.parametrize("plans_of,heads,kv_heads,D", [
    (lambda p: [(p[:40], 1), (p[:25], 1), ([], 1), (p[:30], 7), ([], 75), (p[:276], 37)], 9, 3, 64),
    (lambda p: [(p[:40], 1), ([], 33)], 40, 2, 16),  # more query heads of a KV head than a task takes
    (lambda p: [(p[:40], 1), ([], 33)], 2, 1, 24),  # the plain-C body only
    (lambda p: [(p[:1499], 1), (p[1000:2300], 3)], 4, 1, 64),  # long: keys in parts, the sink added once
])
def test_attention_sinks_match_the_reference(dtype, generic, plans_of, heads, kv_heads, D):
    """gpt-oss's sinks: each query head's logit in every one of its softmaxes, in every body and
    through the merge of a long task's parts."""
    g = torch.Generator().manual_seed(heads + D)
    pool = (torch.randperm(2999, generator=g) + 1).tolist()
    meta, q, k, v, kc, vc = _batch(plans_of(pool), heads, kv_heads, D, dtype, seed=5, num_slots=3300,
                                   prefix_slots=3000)
    sinks = torch.randn(heads, generator=g) * 2
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # (the long plan's parts need two threads' worth of tasks)
    try:
        _check(meta, q, k, v, kc, vc, generic, sinks)
    finally:
        torch.set_num_threads(threads)
