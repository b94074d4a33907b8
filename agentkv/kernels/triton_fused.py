"""Fused small ops for a GPU pass, in Triton: RMSNorm, the gated MLP's activation times up, and the rotary
embedding, each one kernel where torch's eager ops make five or six (F.rms_norm and the weight's product;
split, SiLU, product; rotate_half's slices, negation and cat, two products and a sum). At batch 1 a layer's
small ops are more kernels than its matmuls, each a few microseconds of a step whose weights take ~140 us
a layer to read on an H100, so they bound decode there even inside a CUDA graph.

Each kernel rounds where the torch path (and HF) rounds in bf16 / fp16: the normalized row before the
norm's weight, the activation before its product with up, each of rope's two products before their sum.
So the fused path gives the torch path's values, up to the order of a row's sum of squares and the exp
and sigmoid implementations (tests/kernels/test_triton_fused.py bounds the difference).

Importing this module imports triton (done lazily by the model, on CUDA only). On CPU the kernels run
under TRITON_INTERPRET=1 in the tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentkv.kernels.triton_decode import INTERPRETED

MAX_ROW = 16384  # widest row a kernel takes whole (every hidden size and MLP width served is below)


@triton.jit
def _rms_norm_kernel(x, w, out, stride_xt, stride_xh, heads, n, eps, BLOCK: tl.constexpr, ROUND: tl.constexpr):
    pid = tl.program_id(0)
    t = pid // heads
    h = pid % heads
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    xv = tl.load(x + t * stride_xt + h * stride_xh + offs, mask=mask, other=0.0).to(tl.float32)
    y = xv * tl.rsqrt(tl.sum(xv * xv, axis=0) / n + eps)
    if ROUND:  # (normalized in fp32, rounded to the model's dtype, then times the weight: as HF does)
        y = y.to(out.dtype.element_ty).to(tl.float32)
    wv = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + pid * n + offs, (y * wv).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _glu_kernel(gate_up, out, stride_g, width, BLOCK: tl.constexpr, GELU: tl.constexpr, ROUND: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    g = tl.load(gate_up + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * stride_g + width + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:  # the tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 * tl.sigmoid(2.0 * z))
    else:
        a = g * tl.sigmoid(g)
    if ROUND:
        a = a.to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + row * width + cols, (a * u).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(x, cos, sin, out, stride_xt, stride_xh, stride_ct, heads, d, ROT: tl.constexpr,
                 BLOCK_D: tl.constexpr, ROUND: tl.constexpr):
    pid = tl.program_id(0)
    t = pid // heads
    h = pid % heads
    offs = tl.arange(0, BLOCK_D)
    mask = offs < d
    half = ROT // 2
    src = x + t * stride_xt + h * stride_xh
    xv = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    # rotate_half over the first ROT dims: -x[j + half] below half, x[j - half] above; the rest kept (sin 0)
    partner = tl.where(offs < half, offs + half, tl.where(offs < ROT, offs - half, offs))
    rotated = tl.load(src + partner, mask=mask, other=0.0).to(tl.float32)
    rotated = tl.where(offs < half, -rotated, rotated)
    c = tl.load(cos + t * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin + t * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
    a = xv * c
    b = rotated * s
    if ROUND:  # each product rounded before the sum, as torch's `x * cos + rotate_half(x) * sin` in bf16
        a = a.to(out.dtype.element_ty).to(tl.float32)
        b = b.to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + pid * d + offs, (a + b).to(out.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(tokens, heads, token stride, head stride) of x [T, n] or [T, H, n], its last dim contiguous."""
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    return x.shape[0], x.shape[1], x.stride(0), x.stride(1)


def takes(x: torch.Tensor) -> bool:
    """Whether these kernels take x: on the GPU (or the CPU, interpreted), 2-D or 3-D, its rows contiguous
    and at most MAX_ROW wide."""
    return ((x.is_cuda or INTERPRETED) and x.dim() in (2, 3) and x.stride(-1) == 1 and x.shape[-1] <= MAX_ROW
            and x.numel() > 0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dim times `weight` ([T, n] or [T, H, n]; a new contiguous tensor)."""
    T, H, st, sh = _rows(x)
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rms_norm_kernel[(T * H,)](x, weight, out, st, sh, H, n, eps, BLOCK=triton.next_power_of_2(n),
                               ROUND=x.dtype != torch.float32)
    return out


def glu(gate_up: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """act(gate) * up for gate_up [T, 2I] (gate first): SiLU, or GELU's tanh approximation."""
    T, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(T, width, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(width))
    _glu_kernel[(T, triton.cdiv(width, block))](gate_up, out, gate_up.stride(0), width, BLOCK=block, GELU=gelu,
                                                ROUND=gate_up.dtype != torch.float32)
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    """x [T, H, D] rotated (half-split) over its first `rot` dims by cos / sin ([T, 1, D] or [T, D], x's
    dtype: RotaryEmbedding.tables'); a new contiguous tensor."""
    T, H, st, sh = _rows(x)
    d = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rope_kernel[(T * H,)](x, cos, sin, out, st, sh, cos.stride(0), H, d, ROT=rot,
                           BLOCK_D=triton.next_power_of_2(d), ROUND=x.dtype != torch.float32)
    return out
