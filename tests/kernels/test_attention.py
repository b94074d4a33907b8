"""The torch attention backend against a dense per-request reference, on both decode routes."""

from __future__ import annotations

import pytest
import torch

from agentkv.errors import RequestError
from agentkv.kernels import available_backends, get_backend, torch_backend
from agentkv.kernels.base import AttentionMetadata


def reference(q, k_all, v_all, scale, prefix_len, sinks=None):
    """Dense causal attention of q [ext, H, D] over k_all/v_all [S, KVH, D], queries at prefix_len..;
    `sinks` [H]: gpt-oss's, one more logit in each softmax (as HF's eager attention adds it)."""
    ext, H, D = q.shape
    g = H // k_all.shape[1]
    k = k_all.repeat_interleave(g, dim=1).transpose(0, 1)  # [H, S, D]
    v = v_all.repeat_interleave(g, dim=1).transpose(0, 1)
    scores = torch.einsum("thd,hsd->hts", q, k) * scale
    S = k_all.shape[0]
    pos = torch.arange(prefix_len, prefix_len + ext, device=q.device)[:, None]
    scores = scores.masked_fill(torch.arange(S, device=q.device)[None, :] > pos, float("-inf"))
    if sinks is None:
        return torch.einsum("hts,hsd->thd", scores.softmax(-1), v)
    both = torch.cat([scores, sinks.float()[:, None, None].expand(H, ext, 1)], dim=-1)
    return torch.einsum("hts,hsd->thd", both.softmax(-1)[..., :-1], v)


@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("route", ["padded", "shared"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("decode_only", [False, True])
def test_mixed_batch_matches_reference(monkeypatch, route, heads, kv_heads, decode_only, sinks):
    """Decodes and extends in one pass, or decodes alone (whose output skips the shared buffer); with
    gpt-oss's sinks too."""
    monkeypatch.setattr(torch_backend, "SHARED_MAX_RATIO", 0.0 if route == "padded" else 1.0)
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    D, num_slots = 16, 400
    k_cache = torch.randn(num_slots, kv_heads, D, generator=g)
    v_cache = torch.randn(num_slots, kv_heads, D, generator=g)
    free = torch.randperm(num_slots - 1, generator=g) + 1
    shared = free[:40].tolist()  # a common prefix held by the first three decodes
    free = free[40:].tolist()
    # (prefix slots, new tokens): 3 decodes sharing a prefix, 1 unrelated decode, 2 extends (one with a prefix hit)
    plans = [(shared + free[:5], 1), (shared + free[5:17], 1), (shared[:25], 1), (free[17:40], 1), ([], 9),
             (shared[:30], 6)]
    plans = plans[:4] if decode_only else plans
    free = free[40:]
    table = torch.zeros(8, 128, dtype=torch.int64)
    seq_lens, ext_lens, out_loc = [], [], []
    for row, (prefix, ext) in enumerate(plans):
        new = [free.pop() for _ in range(ext)]
        slots = prefix + new
        table[row, : len(slots)] = torch.tensor(slots)
        seq_lens.append(len(slots))
        ext_lens.append(ext)
        out_loc += new
    T = sum(ext_lens)
    q = torch.randn(T, heads, D, generator=g)
    k_new = torch.randn(T, kv_heads, D, generator=g)
    v_new = torch.randn(T, kv_heads, D, generator=g)
    meta = AttentionMetadata(table, torch.arange(len(plans)), seq_lens, ext_lens, 4, torch.tensor(out_loc))
    backend = get_backend("torch")
    backend.prepare(meta)
    assert (backend.shared_slots is not None) == (route == "shared")
    kc, vc = k_cache.clone(), v_cache.clone()
    sink = torch.randn(heads, generator=g) * 2 if sinks else None
    out = backend.forward(q, k_new, v_new, kc, vc, D**-0.5, sinks=sink).view(T, heads, D)
    offset = 0
    for row, (s, e) in enumerate(zip(seq_lens, ext_lens)):
        slots = table[row, :s]
        expected = reference(q[offset : offset + e], kc[slots], vc[slots], D**-0.5, s - e, sink)
        torch.testing.assert_close(out[offset : offset + e], expected, rtol=1e-5, atol=1e-5)
        offset += e
    assert torch.equal(kc[torch.tensor(out_loc)], k_new)  # new K/V written to their slots


def test_backend_registry():
    assert {"torch", "cpu", "triton", "flashinfer"} <= set(available_backends())
    assert get_backend("auto", "cpu", native=False).name == "torch"
    with pytest.raises(RequestError, match="unknown attention backend"):
        get_backend("cuda-magic")


@pytest.mark.parametrize("in_order", [True, False])
def test_single_decode_reads_a_run_of_slots_in_place(in_order):
    """One decoding request whose slots are one run reads K/V as views of the pool (no gather); the
    output is the same as the reference either way."""
    g = torch.Generator().manual_seed(7)
    heads, kv_heads, D, num_slots, seq = 6, 2, 16, 200, 37
    k_cache = torch.randn(num_slots, kv_heads, D, generator=g)
    v_cache = torch.randn(num_slots, kv_heads, D, generator=g)
    slots = torch.arange(50, 50 + seq) if in_order else torch.randperm(num_slots - 1, generator=g)[:seq] + 1
    table = torch.zeros(2, 64, dtype=torch.int64)
    table[0, :seq] = slots
    q = torch.randn(1, heads, D, generator=g)
    k_new, v_new = torch.randn(1, kv_heads, D, generator=g), torch.randn(1, kv_heads, D, generator=g)
    meta = AttentionMetadata(table, torch.arange(1), [seq], [1], 1, slots[-1:], host_table=table)
    backend = get_backend("torch")
    backend.prepare(meta)
    assert (backend.decode_run is not None) == in_order
    out = backend.forward(q, k_new, v_new, k_cache, v_cache, D**-0.5).view(1, heads, D)
    expected = reference(q, k_cache[slots], v_cache[slots], D**-0.5, seq - 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(k_cache[slots[-1]], k_new[0])
