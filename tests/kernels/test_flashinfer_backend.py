"""The FlashInfer backend: refused with a clear error without CUDA; on a GPU, equal to the torch backend."""

from __future__ import annotations

import pytest
import torch

from agentkv.errors import RequestError
from agentkv.kernels import get_backend
from agentkv.kernels.base import AttentionMetadata
from agentkv.kernels.flashinfer_backend import flashinfer_usable


@pytest.mark.skipif(flashinfer_usable()[0], reason="flashinfer runs here")
def test_flashinfer_backend_refuses_clearly_where_it_cannot_run():
    with pytest.raises(RequestError, match="CUDA GPU|not installed"):
        get_backend("flashinfer")


@pytest.mark.skipif(not flashinfer_usable()[0], reason=flashinfer_usable()[1] or "flashinfer runs")
@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (8, 8)])
def test_flashinfer_backend_matches_torch_backend(heads, kv_heads):
    g = torch.Generator().manual_seed(heads)
    D, dev, dtype = 128, "cuda", torch.bfloat16
    lens, exts = [300, 17, 520, 64, 200], [1, 1, 1, 64, 40]  # 3 decodes, a fresh prompt, a prefix hit
    slots = (torch.randperm(2000, generator=g) + 1)[:sum(lens)]
    table = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    at = 0
    for i, n in enumerate(lens):
        table[i, :n] = slots[at:at + n]
        at += n
    table = table.to(dev)
    k_cache = torch.randn(2001, kv_heads, D, generator=g).to(dtype).to(dev)
    v_cache = torch.randn(2001, kv_heads, D, generator=g).to(dtype).to(dev)
    T = sum(exts)
    q, k, v = (torch.randn(T, h, D, generator=g).to(dtype).to(dev) for h in (heads, kv_heads, kv_heads))
    out_loc = torch.cat([table[i, n - e:n] for i, (n, e) in enumerate(zip(lens, exts))])
    meta = AttentionMetadata(table, torch.arange(len(lens), device=dev), lens, exts, 3, out_loc)
    outs = []
    for name in ("torch", "flashinfer"):
        backend = get_backend(name)
        backend.prepare(meta)
        kc, vc = k_cache.clone(), v_cache.clone()
        outs.append(backend.forward(q, k, v, kc, vc, D**-0.5).float())
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)
