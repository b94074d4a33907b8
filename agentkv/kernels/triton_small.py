"""Two small Triton kernels: the KV store (new tokens' K/V into their pool slots) and the grammar
token-bitmask apply (disallowed logits to -inf, in place).

Importing this module imports triton; the backends import it lazily. On a machine without a GPU
the kernels run under `TRITON_INTERPRET=1` (set before triton is imported) on CPU tensors, which is
how the tests check them against the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k, v, k_cache, v_cache, loc, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_ct, stride_ch, KVH: tl.constexpr, D: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(loc + t)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < KVH) & (offs_d[None, :] < D)
    src_k = k + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = v + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst = slot * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(k_cache + dst, tl.load(src_k, mask=mask).to(k_cache.dtype.element_ty), mask=mask)
    tl.store(v_cache + dst, tl.load(src_v, mask=mask).to(v_cache.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             loc: torch.Tensor) -> None:
    """k, v [T, KVH, D] (last dim contiguous) -> k_cache[loc[t]], v_cache[loc[t]] ([slots, KVH, D])."""
    T, kvh, d = k.shape
    if T == 0:
        return
    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    _store_kv_kernel[(T,)](k, v, k_cache, v_cache, loc, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           k_cache.stride(0), k_cache.stride(1), KVH=kvh, D=d,
                           BLOCK_H=triton.next_power_of_2(kvh), BLOCK_D=triton.next_power_of_2(d))


@triton.jit
def _bitmask_kernel(logits, bitmask, vocab, stride_lb, stride_bb, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < vocab
    words = tl.load(bitmask + b * stride_bb + offs // 32, mask=inside, other=0)
    allowed = ((words >> (offs % 32)) & 1) == 1
    x = tl.load(logits + b * stride_lb + offs, mask=inside)
    tl.store(logits + b * stride_lb + offs, tl.where(allowed, x, float("-inf")), mask=inside)


def apply_token_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor, block: int = 1024) -> None:
    """logits [B, V] (rows contiguous); bitmask [B, ceil(V / 32)] int32, bit i of word i // 32 = token i."""
    B, vocab = logits.shape
    assert logits.stride(1) == 1 and bitmask.dtype == torch.int32 and bitmask.stride(1) == 1
    _bitmask_kernel[(B, triton.cdiv(vocab, block))](logits, bitmask, vocab, logits.stride(0), bitmask.stride(0),
                                                     BLOCK=block)
