"""Paged decode attention in Triton: one new query token per request, K/V read through the slot table.

Split-KV (flash-decoding): stage 1 gives each (request, head, split) program one stretch of the
sequence; it gathers that stretch's slots from `req_to_token`, runs an online softmax over tiles of
BLOCK_N keys and writes a partial output with its log-sum-exp. Stage 2 merges the splits of each
(request, head). Long sequences thus spread over many programs even at batch 1. GQA: query head h
reads KV head h // (H // KVH).

Two stage-1 kernels. With grouped-query attention (H > KVH) a program takes a KV head's whole group of
query heads (`_decode_grouped_kernel`): each tile of keys and values is read once for the group, and the
group's scores and outputs are tensor-core products (tl.dot, the group padded to 16 rows). A program per
query head (`_decode_split_kernel`) reads the tile once per head of the group: on an H200 it ran at half
the torch route's speed at batch 64 and 8k context (benchmarks/results/2026-12-04-gpu-h200.md), where the
4 heads of Llama-3's groups read the same KV 4 times. It remains for H == KVH.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def paged_kv_offsets(req_to_token, row, offs_n, nmask, kvh, offs_d, dmask, stride_r2t, stride_ct, stride_ch):
    """Offsets into a K/V cache of keys `offs_n` of slot-table row `row` (KV head `kvh`), and their mask:
    the gather through the slot table that the decode and extend kernels share."""
    slots = tl.load(req_to_token + row * stride_r2t + offs_n, mask=nmask, other=0)
    return slots[:, None] * stride_ct + kvh * stride_ch + offs_d[None, :], nmask[:, None] & dmask[None, :]


@triton.jit
def soft_cap(scores, softcap):
    """Gemma 2's cap on scores, softcap * tanh(score / softcap) (tanh as 2 sigmoid(2x) - 1); none where 0."""
    if softcap > 0:
        scores = softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)
    return scores


@triton.jit
def tile_scores(q, k, scale, softcap, FP32_DOT: tl.constexpr):
    """A tile of queries' scores against a tile of keys [queries, keys], scaled and capped: the product
    in fp32 where FP32_DOT (the interpreter's bf16 dot is wrong), else at the tensor cores' precision."""
    if FP32_DOT:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        scores = tl.dot(q, tl.trans(k)) * scale
    return soft_cap(scores, softcap)


@triton.jit
def split_range(seq_len, s, num_splits, window, BLOCK_N: tl.constexpr):
    """Keys [start, end) of split `s` of a request: the keys its query sees (the last `window` of them with
    a window) cut into `num_splits` runs of whole tiles, each request by its own length; runs past the
    end are empty (they weigh 0 in the merge)."""
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    length = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
    start = first + s * length
    return start, tl.minimum(start + length, seq_len)


@triton.jit
def _decode_split_kernel(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, mid_o, mid_lse, scale,
                         num_splits, window, softcap, stride_qt, stride_qh, stride_ct, stride_ch, stride_r2t,
                         stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    kvh = h // GROUP
    row = tl.load(req_rows + b)
    seq_len = tl.load(seq_lens + b).to(tl.int32)  # (int32 like the split bounds: Triton's if-blocks keep types)
    start, end = split_range(seq_len, s, num_splits, window, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    qv = tl.load(q + b * stride_qt + h * stride_qh + offs_d, mask=dmask, other=0.0).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        kv_off, kvmask = paged_kv_offsets(req_to_token, row, offs_n, nmask, kvh, offs_d, dmask, stride_r2t,
                                          stride_ct, stride_ch)
        kk = tl.load(k_cache + kv_off, mask=kvmask, other=0.0).to(tl.float32)
        scores = soft_cap(tl.sum(kk * qv[None, :], axis=1) * scale, softcap)
        scores = tl.where(nmask, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        vv = tl.load(v_cache + kv_off, mask=kvmask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vv, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    # An empty split (past the end of a short sequence) leaves weight 0 for the merge.
    lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), -float("inf"))
    out = acc / tl.where(l_i > 0, l_i, 1.0)
    tl.store(mid_o + b * stride_mb + h * stride_mh + s * stride_ms + offs_d, out, mask=dmask)
    tl.store(mid_lse + b * stride_lb + h * stride_lh + s, lse)


@triton.jit
def _decode_grouped_kernel(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, mid_o, mid_lse, scale,
                           num_splits, window, softcap, stride_qt, stride_qh, stride_ct, stride_ch, stride_r2t,
                           stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                           GROUP: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
    """Stage 1 for a (request, KV head, split): the KV head's GROUP query heads as rows of one product."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    row = tl.load(req_rows + b)
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    start, end = split_range(seq_len, s, num_splits, window, BLOCK_N)
    offs_h = tl.arange(0, BLOCK_H)
    hmask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    qv = tl.load(q + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                 mask=hmask[:, None] & dmask[None, :], other=0.0)
    if FP32_DOT:
        qv = qv.to(tl.float32)
    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        kv_off, kvmask = paged_kv_offsets(req_to_token, row, offs_n, nmask, kvh, offs_d, dmask, stride_r2t,
                                          stride_ct, stride_ch)
        kk = tl.load(k_cache + kv_off, mask=kvmask, other=0.0).to(qv.dtype)
        scores = tile_scores(qv, kk, scale, softcap, FP32_DOT)  # [BLOCK_H, BLOCK_N]
        scores = tl.where(nmask[None, :], scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # (every tile holds a key: m_new is finite)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        vv = tl.load(v_cache + kv_off, mask=kvmask, other=0.0).to(qv.dtype)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, vv, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), -float("inf"))
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(mid_o + b * stride_mb + heads[:, None] * stride_mh + s * stride_ms + offs_d[None, :], out,
             mask=hmask[:, None] & dmask[None, :])
    tl.store(mid_lse + b * stride_lb + heads * stride_lh + s, lse, mask=hmask)


@triton.jit
def _decode_merge_kernel(mid_o, mid_lse, out, sinks, num_splits, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         stride_ob, stride_oh, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                         HAS_SINKS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    smask = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    lse = tl.load(mid_lse + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=-float("inf"))
    m = tl.max(lse, axis=0)
    if HAS_SINKS:  # gpt-oss: the head's logit, one more term of the sum (no value follows it)
        sink = tl.load(sinks + h).to(tl.float32)
        m = tl.maximum(m, sink)
    w = tl.where(smask & (lse > -float("inf")), tl.exp(lse - m), 0.0)
    o = tl.load(mid_o + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :],
                mask=smask[:, None] & dmask[None, :], other=0.0)
    total = tl.sum(w, axis=0)
    if HAS_SINKS:
        total += tl.exp(sink - m)
    res = tl.sum(w[:, None] * o, axis=0) / total
    tl.store(out + b * stride_ob + h * stride_oh + offs_d, res.to(out.dtype.element_ty), mask=dmask)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def split_count(rows: int, max_seq_len: int, block_n: int, device: torch.device) -> int:
    """Splits of each request's keys when `rows` (request, head) pairs decode: enough that the stage-1 grid
    fills the device's multiprocessors about four times over (a long context at batch 1 spreads over all of
    them), and no more than the longest sequence has runs of two tiles. Each request's split length then
    follows its own length (split_range), so with CUDA graphs, where `max_seq_len` is the context bound,
    a bucket's grid is the same at every replay and every split still works."""
    return max(1, min(triton.cdiv(4 * _multiprocessors(device), rows), triton.cdiv(max_seq_len, 2 * block_n)))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                     req_rows: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, scale: float,
                     out: torch.Tensor | None = None, num_splits: int | None = None, block_n: int = 32,
                     window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                     grouped: bool | None = None, launch: dict | None = None) -> torch.Tensor:
    """q [B, H, D] (one token per request) -> [B, H, D]; seq_lens [B] int64 on q's device;
    `window` > 0: each query sees its last `window` keys; `sinks` [H] fp32: each head's logit in its
    softmax's sum (gpt-oss). `grouped`: a program per KV head's group (None: where H > KVH). `num_splits`:
    the stage-1 programs a (request, head) pair's keys are split over (None: split_count's). `launch`:
    Triton's launch options for stage 1 (num_warps, num_stages; benchmarks/gpu_kernels.py --sweep)."""
    B, H, D = q.shape
    kvh = k_cache.shape[1]
    grouped = grouped if grouped is not None else H > kvh
    num_splits = num_splits or split_count(B * (kvh if grouped else H), max_seq_len, block_n, q.device)
    mid_o = torch.empty(B, H, num_splits, D, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q) if out is None else out
    if B == 0:
        return out
    block_d = triton.next_power_of_2(D)
    args = (q, k_cache, v_cache, req_to_token, req_rows, seq_lens, mid_o, mid_lse, scale, num_splits, window,
            float(softcap), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), req_to_token.stride(0),
            mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    if grouped:
        # (tl.dot takes 16 rows and columns at least; fp32 multiplies in full precision, not TF32, and so
        # does the interpreter, which has no bf16 product: triton_extend.py)
        _decode_grouped_kernel[(B, kvh, num_splits)](
            *args, GROUP=H // kvh, BLOCK_H=max(16, triton.next_power_of_2(H // kvh)), D=D,
            BLOCK_D=max(16, block_d), BLOCK_N=max(16, block_n),
            FP32_DOT=q.dtype == torch.float32 or INTERPRETED, **(launch or {}))
    else:
        _decode_split_kernel[(B, H, num_splits)](*args, GROUP=H // kvh, D=D, BLOCK_D=block_d, BLOCK_N=block_n,
                                                 **(launch or {}))
    _decode_merge_kernel[(B, H)](
        mid_o, mid_lse, out, mid_lse if sinks is None else sinks, num_splits, mid_o.stride(0), mid_o.stride(1),
        mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1),
        D=D, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits), HAS_SINKS=sinks is not None)
    return out
