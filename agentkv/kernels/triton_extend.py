"""Extend attention in Triton: new tokens after a cached prefix, one online softmax over both.

Each program takes BLOCK_M new tokens of one request and one query head. The new tokens' K/V are
already in the pool (the backend stores them first), so prefix and new keys alike are read through
the request's row of the slot table: positions 0 .. seq_len, new token j at position prefix + j
seeing positions up to its own. The key loop stops at the block's last visible position, so the
causal part costs half of the square, and a prefix hit costs only the reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentkv.kernels.triton_decode import INTERPRETED, paged_kv_offsets, tile_scores

# The interpreter has no bf16 matrix product (numpy): there the products run in fp32 on the
# converted values, which still checks everything else; a GPU multiplies bf16 tiles natively.


@triton.jit
def _extend_kernel(q, k_cache, v_cache, out, req_to_token, req_rows, seq_lens, ext_lens, ext_starts, scale, window,
                   softcap, sinks,
                   stride_qt, stride_qh, stride_ct, stride_ch, stride_ot, stride_oh, stride_r2t,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr, HAS_SINKS: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    mblock = tl.program_id(2)
    kvh = h // GROUP
    ext = tl.load(ext_lens + r).to(tl.int32)  # (int32 like `first`: Triton's if-blocks keep types)
    if mblock * BLOCK_M >= ext:
        return
    row = tl.load(req_rows + r)
    seq_len = tl.load(seq_lens + r).to(tl.int32)
    tok0 = tl.load(ext_starts + r)
    prefix = seq_len - ext
    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = offs_m < ext
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    qb = tl.load(q + (tok0 + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                 mask=mmask[:, None] & dmask[None, :], other=0.0)
    if FP32_DOT:
        qb = qb.to(tl.float32)
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    last = tl.minimum(seq_len, prefix + (mblock + 1) * BLOCK_M)  # keys past this no query here sees
    first = 0
    if window > 0:  # keys before the block's first query's window: no query here sees them
        first = tl.maximum(prefix + mblock * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N
    for n0 in range(first, last, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < seq_len
        kv_off, kvmask = paged_kv_offsets(req_to_token, row, offs_n, nmask, kvh, offs_d, dmask, stride_r2t,
                                          stride_ct, stride_ch)
        kb = tl.load(k_cache + kv_off, mask=kvmask, other=0.0).to(qb.dtype)
        scores = tile_scores(qb, kb, scale, softcap, FP32_DOT)
        visible = (offs_n[None, :] <= (prefix + offs_m)[:, None]) & nmask[None, :]
        if window > 0:
            visible = visible & (offs_n[None, :] > (prefix + offs_m)[:, None] - window)
        scores = tl.where(visible, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # a row with no key visible yet (a window's queries past the first block's) keeps max -inf:
        # subtract 0 there, not -inf, so its weights are 0 rather than NaN
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        vb = tl.load(v_cache + kv_off, mask=kvmask, other=0.0).to(qb.dtype)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    if HAS_SINKS:  # gpt-oss: the head's logit, one more term of each row's sum (rows past the extend: m_i -inf)
        l_i += tl.where(m_i > -float("inf"), tl.exp(tl.load(sinks + h).to(tl.float32) - m_i), 0.0)
    res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # (0 only in rows past the extend, never stored)
    tl.store(out + (tok0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             res.to(out.dtype.element_ty), mask=mmask[:, None] & dmask[None, :])


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                     req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                     ext_lens: torch.Tensor, ext_starts: torch.Tensor, max_ext: int, scale: float,
                     block_m: int = 32, block_n: int = 32, window: int = 0, softcap: float = 0.0,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D] holds every request's new tokens, request r's from token ext_starts[r] on; the
    result goes to the same rows of `out`. All per-request tensors are int64 on q's device.
    `window` > 0: each query sees its last `window` keys."""
    R = int(ext_lens.shape[0])
    if R == 0:
        return out
    H, D = q.shape[1], q.shape[2]
    kvh = k_cache.shape[1]
    _extend_kernel[(R, H, triton.cdiv(max_ext, block_m))](
        q, k_cache, v_cache, out, req_to_token, req_rows, seq_lens, ext_lens, ext_starts, scale, window, float(softcap),
        seq_lens if sinks is None else sinks,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        req_to_token.stride(0), GROUP=H // kvh, D=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n, FP32_DOT=q.dtype == torch.float32 or INTERPRETED,
        HAS_SINKS=sinks is not None)
    return out
