"""The Triton attention backend: KV store, paged split-KV decode and extend kernels (GPU path).

`prepare` turns the pass's metadata into the small index tensors all layers share; `forward`
stores the new K/V, then runs the decode kernel over the first `num_decodes` tokens and the extend
kernel over the rest. On CPU the kernels run only under `TRITON_INTERPRET=1` (how the tests check
them); without it, asking for this backend on CPU is an error that says so.
"""

from __future__ import annotations

import functools
import os

import torch

from agentkv.errors import RequestError
from agentkv.kernels.base import AttentionBackend, AttentionMetadata


@functools.cache
def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_usable(device: torch.device | str | None = None) -> tuple[bool, str]:
    """(usable, why not): triton installed, and a CUDA device or the interpreter."""
    if not _triton_installed():
        return False, "triton is not installed (pip install triton)"
    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if on_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return True, ""
    return False, "the triton backend needs a CUDA GPU (or TRITON_INTERPRET=1 to check the kernels on CPU)"


def fused_ops_for(option: bool, device: str):
    """The fused Triton ops (kernels/triton_fused.py) a model's norms, gated activation and rotation run on,
    or None for torch's ops: `option` True asks for them (on a CUDA device where triton imports, or under
    TRITON_INTERPRET=1 where the tests run them; elsewhere an error that says why). Off by default until a
    GPU run has checked them compiled (benchmarks/gpu.sh)."""
    if not option:
        return None
    ok, why = triton_usable(device)
    if not ok:
        raise RequestError(f"fused_ops=True, but the fused Triton ops cannot run: {why}; leave fused_ops unset")
    from agentkv.kernels import triton_fused  # (imports triton: seconds, wanted only here)

    return triton_fused


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graphs = True

    def __init__(self):
        ok, why = triton_usable()
        if not ok:
            raise RequestError(why)
        # imported here: triton's import takes seconds, and only an engine on this backend needs it
        from agentkv.kernels import triton_decode, triton_extend, triton_small

        self._decode, self._extend, self._store = (triton_decode.decode_attention, triton_extend.extend_attention,
                                                   triton_small.store_kv)
        # decode's stage 1 a program per KV head's group (None: where the model has GQA) or per query head
        # (False): benchmarks/gpu_kernels.py times both
        self.decode_grouped: bool | None = None

    def prepare(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        dev = meta.req_to_token.device
        nd = meta.num_decodes
        rows = meta.req_rows.to(dev)
        self.decode_rows = rows[:nd]
        self.decode_lens = torch.tensor(meta.seq_lens[:nd], dtype=torch.int64, device=dev)
        self.max_decode_len = max(meta.seq_lens[:nd], default=0)
        ext = meta.extend_lens[nd:]
        starts = [nd]
        for e in ext[:-1]:
            starts.append(starts[-1] + e)
        self.ext_rows = rows[nd:]
        self.ext_seq_lens = torch.tensor(meta.seq_lens[nd:], dtype=torch.int64, device=dev)
        self.ext_lens = torch.tensor(ext, dtype=torch.int64, device=dev)
        self.ext_starts = torch.tensor(starts[:len(ext)], dtype=torch.int64, device=dev)
        self.max_ext = max(ext, default=0)

    def prepare_graph(self, meta: AttentionMetadata, rows: torch.Tensor, lens: torch.Tensor, max_context: int) -> None:
        """A decode-only pass whose index tensors are the static buffers `rows` and `lens` (filled
        before each replay of a CUDA graph). The split count follows `max_context` and the bucket's
        size, not the pass's longest sequence, so the kernels' grid is the same at every replay; each
        request's splits follow its own length (triton_decode.split_range)."""
        self.meta = meta
        self.decode_rows, self.decode_lens, self.max_decode_len = rows, lens, max_context
        self.max_ext = 0

    def forward(self, q, k, v, k_cache, v_cache, scale, window=0, softcap=0.0, sinks=None):
        meta = self.meta
        self._store(k, v, k_cache, v_cache, meta.out_cache_loc)
        T, H, D = q.shape
        out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
        nd = meta.num_decodes
        if nd:
            self._decode(q[:nd], k_cache, v_cache, meta.req_to_token, self.decode_rows, self.decode_lens,
                         self.max_decode_len, scale, out=out[:nd], window=window, softcap=softcap, sinks=sinks,
                         grouped=self.decode_grouped)
        if self.max_ext:
            self._extend(q, k_cache, v_cache, out, meta.req_to_token, self.ext_rows, self.ext_seq_lens,
                         self.ext_lens, self.ext_starts, self.max_ext, scale, window=window, softcap=softcap,
                         sinks=sinks)
        return out.reshape(T, H * D)
