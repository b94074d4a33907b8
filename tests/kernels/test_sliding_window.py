"""Sliding-window attention (and Gemma 2's soft-capped scores) in every backend that does it
(torch's padded, shared and in-place decode routes and its extends; the C kernel's AVX-512 and
plain-C bodies, with split keys; Triton's decode and extend kernels, interpreted on CPU) against
a dense reference that masks keys more than `window - 1` positions before each query. The
model-level check against HF is in test_model_parity.py (Mistral, Qwen2's upper layers,
Mixtral)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import agentkv as ak
from agentkv.kernels import cpu_native, get_backend, torch_backend
from agentkv.kernels.base import AttentionMetadata


def reference(q, k_all, v_all, scale, prefix_len, window, softcap=0.0):
    ext, H, D = q.shape
    g = H // k_all.shape[1]
    k = k_all.repeat_interleave(g, dim=1).transpose(0, 1)
    v = v_all.repeat_interleave(g, dim=1).transpose(0, 1)
    scores = torch.einsum("thd,hsd->hts", q, k) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    keys = torch.arange(k_all.shape[0])[None, :]
    pos = torch.arange(prefix_len, prefix_len + ext)[:, None]
    outside = (keys > pos) | (keys <= pos - window) if window else keys > pos
    scores = scores.masked_fill(outside, float("-inf"))
    return torch.einsum("hts,hsd->thd", scores.softmax(-1), v)


def mixed_batch(seed, heads, kv_heads, decode_only=False, long=False):
    """Decodes (three sharing a prefix, one alone) and extends (one fresh, one after a prefix hit)."""
    g = torch.Generator().manual_seed(seed)
    D, num_slots = 16, 3000
    k_cache = torch.randn(num_slots, kv_heads, D, generator=g)
    v_cache = torch.randn(num_slots, kv_heads, D, generator=g)
    free = (torch.randperm(num_slots - 1, generator=g) + 1).tolist()
    shared, free = free[:40], free[40:]
    if long:  # one decode of 1,200 keys (the C kernel splits its keys across threads), a 70-token prompt
        plans = [(free[:1199], 1), ([], 70)]
        free = free[1199:]
    else:
        plans = [(shared + free[:5], 1), (shared + free[5:17], 1), (shared[:25], 1), (free[17:40], 1),
                 ([], 9), (shared[:30], 6)]
        free = free[40:]
        plans = plans[:4] if decode_only else plans
    table = torch.zeros(8, 1300, dtype=torch.int64)
    seq_lens, ext_lens, out_loc = [], [], []
    for row, (prefix, ext) in enumerate(plans):
        new = [free.pop() for _ in range(ext)]
        table[row, : len(prefix) + ext] = torch.tensor(prefix + new)
        seq_lens.append(len(prefix) + ext)
        ext_lens.append(ext)
        out_loc += new
    T = sum(ext_lens)
    q, k_new, v_new = (torch.randn(T, h, D, generator=g) for h in (heads, kv_heads, kv_heads))
    nd = sum(e == 1 for e in ext_lens[:4])
    meta = AttentionMetadata(table, torch.arange(len(plans)), seq_lens, ext_lens, nd, torch.tensor(out_loc))
    return meta, q, k_new, v_new, k_cache, v_cache


def check(backend, batch, window, tol=1e-5, softcap=0.0):
    meta, q, k_new, v_new, k_cache, v_cache = batch
    T, H, D = q.shape
    backend.prepare(meta)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = backend.forward(q, k_new, v_new, kc, vc, D**-0.5, window, softcap).view(T, H, D)
    offset = 0
    for row, (s, e) in enumerate(zip(meta.seq_lens, meta.extend_lens)):
        slots = meta.req_to_token[row, :s]
        expected = reference(q[offset : offset + e], kc[slots], vc[slots], D**-0.5, s - e, window, softcap)
        torch.testing.assert_close(out[offset : offset + e], expected, rtol=tol, atol=tol)
        offset += e


@pytest.mark.parametrize("window", [1, 5, 16, 40])
@pytest.mark.parametrize("route", ["padded", "shared", "long"])
@pytest.mark.parametrize("decode_only", [False, True])
def test_torch_backend_windows(monkeypatch, window, route, decode_only):
    monkeypatch.setattr(torch_backend, "SHARED_MAX_RATIO", 0.0 if route != "shared" else 1.0)
    backend = get_backend("torch")
    batch = mixed_batch(window, 6, 2, decode_only, long=route == "long")
    check(backend, batch, window)
    assert (backend.shared_slots is not None) == (route == "shared")
    check(backend, batch, 0)  # the same pass without a window (another layer of it)
    check(backend, batch, window, softcap=0.7)  # scores capped as Gemma 2's, which bites at 0.7
    check(backend, batch, 0, softcap=0.7)


@pytest.mark.parametrize("in_place", [True, False])
def test_torch_single_decode_window(in_place):
    g = torch.Generator().manual_seed(3)
    seq, D = 37, 16
    k_cache, v_cache = torch.randn(200, 2, D, generator=g), torch.randn(200, 2, D, generator=g)
    slots = torch.arange(50, 50 + seq) if in_place else torch.randperm(199, generator=g)[:seq] + 1
    table = torch.zeros(2, 64, dtype=torch.int64)
    table[0, :seq] = slots
    batch = (AttentionMetadata(table, torch.arange(1), [seq], [1], 1, slots[-1:], host_table=table),
             torch.randn(1, 6, D, generator=g), torch.randn(1, 2, D, generator=g), torch.randn(1, 2, D, generator=g),
             k_cache, v_cache)
    backend = get_backend("torch")
    check(backend, batch, 9)
    assert (backend.decode_run is not None) == in_place


needs_native = pytest.mark.skipif(cpu_native.load() is None, reason="agentkv's C kernels do not build here")


@needs_native
@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("window", [1, 5, 16, 40, 700])
@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("prompt", [False, True])
def test_cpu_kernel_windows(generic, window, long, prompt):
    """The decode body, and (`prompt`) the prompt tiles' body for each request's new tokens."""
    backend = get_backend("cpu")
    backend.generic = generic
    batch = mixed_batch(window + long, 8, 2, long=long)
    if prompt:
        batch = (dataclasses.replace(batch[0], prompt_lens=list(batch[0].extend_lens)), *batch[1:])
    check(backend, batch, window, tol=2e-5)
    check(backend, batch, window, tol=2e-5, softcap=0.7)


def test_triton_windows():
    pytest.importorskip("triton")
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("triton without TRITON_INTERPRET=1 and no GPU")
    backend = get_backend("triton")
    for window in (5, 16):
        check(backend, mixed_batch(window, 6, 2), window)
        check(backend, mixed_batch(window, 6, 2, long=True), window)
        check(backend, mixed_batch(window, 6, 2), window, softcap=0.7)


def test_flashinfer_refuses_a_windowed_model(tmp_path):
    from tests.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "m", "mistral", sliding_window=8)
    pytest.importorskip("flashinfer")
    with pytest.raises(ak.RequestError, match="sliding-window"):
        ak.Engine(str(path), attention_backend="flashinfer")
