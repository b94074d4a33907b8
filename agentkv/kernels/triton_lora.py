"""LoRA updates of a pass's rows on the GPU, each row by its own adapter (Punica's BGMV: a batched gather
matrix-vector product): the shrink t = x A^T and the expand y += t B, one program per (row, block of ranks)
and per (row, block of output columns), the adapter's weights gathered by the row's slot in stacked
tensors (engine/lora/slots.py keeps every adapter a pass needs in a slot: A [slots, R, K], B [slots, R, N],
the scale and a fused linear's pieces folded into B).

Importing this module imports triton; on a machine without a GPU the kernels run under `TRITON_INTERPRET=1`
on CPU tensors, which is how the tests check them against torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(x, a, slot, t, K, R, stride_xt, stride_as, stride_ar, stride_tt,
                   BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0)
    s = tl.load(slot + row)
    k_live = tl.where(s >= 0, K, 0)  # (a row without an adapter reads nothing)
    s = tl.maximum(s, 0)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        in_k = offs_k < k_live
        xv = tl.load(x + row * stride_xt + offs_k, mask=in_k, other=0.0).to(tl.float32)
        av = tl.load(a + s * stride_as + offs_r[:, None] * stride_ar + offs_k[None, :],
                     mask=(offs_r[:, None] < R) & in_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(t + row * stride_tt + offs_r, acc, mask=offs_r < R)


@triton.jit
def _expand_kernel(t, b, slot, y, N, R, stride_tt, stride_bs, stride_br, stride_yt,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0)
    s = tl.load(slot + row)
    n_live = tl.where(s >= 0, N, 0)  # (a row without an adapter is left as it is)
    s = tl.maximum(s, 0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = offs_n < n_live
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        in_r = offs_r < R
        tv = tl.load(t + row * stride_tt + offs_r, mask=in_r, other=0.0)
        bv = tl.load(b + s * stride_bs + offs_r[:, None] * stride_br + offs_n[None, :],
                     mask=in_r[:, None] & in_n[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(tv[:, None] * bv, axis=0)
    dst = y + row * stride_yt + offs_n
    old = tl.load(dst, mask=in_n, other=0.0)
    tl.store(dst, (old.to(tl.float32) + acc).to(y.dtype.element_ty), mask=in_n)


def lora_update(x: torch.Tensor, y: torch.Tensor, slot: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """In place: y [T, N] += (x [T, K] A[slot]^T) B[slot] per row (a slot < 0: none); a [S, R, K] and b [S, R, N]
    stacked adapters (B with its scale), any float dtype, the sums in fp32."""
    T, K = x.shape
    R, N = a.shape[1], b.shape[2]
    if T == 0 or R == 0:
        return
    assert x.stride(1) == 1 and y.stride(1) == 1 and a.stride(2) == 1 and b.stride(2) == 1 and slot.is_contiguous()
    t = torch.empty(T, R, dtype=torch.float32, device=x.device)
    block_r = min(triton.next_power_of_2(R), 64)
    _shrink_kernel[(T, triton.cdiv(R, block_r))](x, a, slot, t, K, R, x.stride(0), a.stride(0), a.stride(1),
                                                  t.stride(0), BLOCK_K=min(triton.next_power_of_2(K), 128),
                                                  BLOCK_R=block_r)
    block_n = min(triton.next_power_of_2(N), 128)
    _expand_kernel[(T, triton.cdiv(N, block_n))](t, b, slot, y, N, R, t.stride(0), b.stride(0), b.stride(1),
                                                  y.stride(0), BLOCK_N=block_n, BLOCK_R=min(triton.next_power_of_2(R),
                                                                                            32))
