"""The FlashInfer attention backend (CUDA only): our slot pool read as a paged cache with page size 1.

Each pool slot is one page, so a request's row of the slot table is its page list as it stands:
nothing is copied or re-laid out. `prepare` builds the page lists (indptr / indices) once per pass;
the first `forward` of the pass plans the decode and prefill wrappers (head counts and dtypes are
known only then), every layer then runs them. New K/V are stored by plain indexing first. Extends
are FlashInfer's causal prefill over the paged cache, queries aligned to the end of each sequence
(the cached prefix comes first), which is our extend.

It needs `flashinfer-python` (the `[gpu]` extra) and a CUDA device; elsewhere asking for it is an
error that says so. It has not run on a GPU yet: `benchmarks/gpu.sh` checks it against the torch
backend (tests/kernels/test_flashinfer_backend.py) when one is lent.
"""

from __future__ import annotations

import torch

from agentkv.errors import RequestError
from agentkv.kernels.base import AttentionBackend, AttentionMetadata

WORKSPACE_BYTES = 256 * 1024 * 1024


def flashinfer_usable() -> tuple[bool, str]:
    """(usable, why not)."""
    if not torch.cuda.is_available():
        return False, "the flashinfer backend needs a CUDA GPU; use 'torch' (or 'auto') here"
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False, "flashinfer is not installed (pip install 'agentkv[gpu]')"
    return True, ""


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self):
        ok, why = flashinfer_usable()
        if not ok:
            raise RequestError(why)
        import flashinfer

        self._fi = flashinfer
        self._decode = self._prefill = None

    def _wrappers(self, device) -> None:
        if self._decode is None:
            ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            self._decode = self._fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
            self._prefill = self._fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")

    def prepare(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        dev = meta.req_to_token.device
        self._wrappers(dev)
        nd = meta.num_decodes
        self.decode_pages = _pages(meta, range(nd), dev)
        self.prefill_pages = _pages(meta, range(nd, len(meta.seq_lens)), dev)
        ext = meta.extend_lens[nd:]
        self.qo_indptr = torch.tensor([0] + _cumsum(ext), dtype=torch.int32, device=dev)
        self.planned = False

    def _plan(self, q: torch.Tensor, k_cache: torch.Tensor, scale: float) -> None:
        H, D, kvh = q.shape[1], q.shape[2], k_cache.shape[1]
        common = dict(q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale)
        if self.meta.num_decodes:
            indptr, indices, last = self.decode_pages
            self._decode.plan(indptr, indices, last, H, kvh, D, 1, **common)
        if len(self.meta.seq_lens) > self.meta.num_decodes:
            indptr, indices, last = self.prefill_pages
            self._prefill.plan(self.qo_indptr, indptr, indices, last, H, kvh, D, 1, causal=True, **common)
        self.planned = True

    def forward(self, q, k, v, k_cache, v_cache, scale, window=0, softcap=0.0, sinks=None):
        # (its wrappers take window_left and sinks at plan time, one plan per layer kind: not wired yet)
        if window or softcap or sinks is not None:
            raise RequestError("the flashinfer backend does not do sliding-window attention, soft caps or attention "
                               "sinks yet; this model has them: use attention_backend='triton'")
        meta = self.meta
        k_cache[meta.out_cache_loc] = k.to(k_cache.dtype)
        v_cache[meta.out_cache_loc] = v.to(v_cache.dtype)
        if not self.planned:
            self._plan(q, k_cache, scale)
        T, H, D = q.shape
        out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
        kv = (k_cache.unsqueeze(1), v_cache.unsqueeze(1))  # [pages, page_size 1, KVH, D]
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode.run(q[:nd].contiguous(), kv)
        if T > nd:
            out[nd:] = self._prefill.run(q[nd:].contiguous(), kv)
        return out.reshape(T, H * D)


def _cumsum(xs) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


def _pages(meta: AttentionMetadata, reqs, dev):
    """(indptr, indices, last_page_len) int32 of the requests' sequences, page size 1."""
    reqs = list(reqs)
    lens = [meta.seq_lens[i] for i in reqs]
    rows = meta.rows()
    parts = [meta.req_to_token[rows[i], :meta.seq_lens[i]] for i in reqs]
    indices = torch.cat(parts).to(torch.int32) if parts else torch.zeros(0, dtype=torch.int32, device=dev)
    indptr = torch.tensor([0] + _cumsum(lens), dtype=torch.int32, device=dev)
    return indptr, indices, torch.ones(len(reqs), dtype=torch.int32, device=dev)
