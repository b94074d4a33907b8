"""Rotary position embeddings with the scaling variants Llama and Qwen configs use."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentkv.engine.model_config import ModelConfig
from agentkv.engine.rope_config import half_split_order, yarn_mscale
from agentkv.errors import ModelLoadError
from agentkv.kernels.cpu_native import NativeKernels


def inv_frequencies(cfg: ModelConfig, long: bool = False) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies [rotated dims // 2] and the attention (cos/sin) scale, as HF computes
    them. `long` (longrope): the frequencies of positions from original_max_position_embeddings on."""
    dim, base, rs = cfg.rotary_dim or cfg.head_dim, cfg.rope_theta, cfg.rope_scaling
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rs.rope_type == "default":
        return inv_freq, 1.0
    if rs.rope_type == "longrope":
        factors = rs.long_factor if long else rs.short_factor
        if len(factors) != dim // 2:
            raise ModelLoadError(f"longrope's factors have {len(factors)} entries; the model rotates {dim} dims "
                                 f"of each head, so they need {dim // 2}")
        original = rs.original_max_position_embeddings
        attention_factor = rs.attention_factor
        if attention_factor is None:
            attention_factor = math.sqrt(1 + math.log(rs.factor) / math.log(original)) if rs.factor > 1.0 else 1.0
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # (HF's order of operations, to the ulp)
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**shape), float(attention_factor)
    if rs.rope_type == "proportional":  # (pairs i and i + D/2 of the whole head, as its default rope's)
        angles = int(rs.proportion * cfg.head_dim // 2)
        rotated = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / cfg.head_dim))
        return torch.cat([rotated, torch.zeros(cfg.head_dim // 2 - angles, dtype=torch.float32)]) / rs.factor, 1.0
    if rs.rope_type == "linear":
        return inv_freq / rs.factor, 1.0
    original = rs.original_max_position_embeddings or cfg.max_position_embeddings
    if rs.rope_type == "llama3":
        low_wavelen = original / rs.low_freq_factor
        high_wavelen = original / rs.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
        smooth = (original / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if rs.rope_type == "yarn":
        attention_factor = rs.attention_factor
        if attention_factor is None and rs.mscale and rs.mscale_all_dim:  # (DeepSeek's)
            attention_factor = yarn_mscale(rs.factor, rs.mscale) / yarn_mscale(rs.factor, rs.mscale_all_dim)
        elif attention_factor is None:
            attention_factor = yarn_mscale(rs.factor)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(rs.beta_fast), correction_dim(rs.beta_slow)
        if rs.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolation_factor = 1 - ramp
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        inv = (1.0 / (rs.factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
        return inv, float(attention_factor)
    raise AssertionError(f"unhandled rope type {rs.rope_type}")  # ModelConfig validated it


# Passes of up to this many tokens on CPU rotate with one matmul per layer (see `RopeTables`).
ROTATION_MAX_TOKENS = 64
# bf16/fp16 passes do that matmul in fp32 (a bf16 bmm of these shapes is slow on CPU: 17 us at one
# token against 5.6 via fp32), which pays off up to 4 tokens (10.3 vs 12.0 us; 8: 15.1 vs 14.1).
ROTATION_MAX_TOKENS_LOW_PRECISION = 4


@dataclass
class RopeTables:
    """cos, sin [T, 1, D] of one pass's positions, looked up once and used by every layer.

    `rotation` [T, D, D], for small CPU passes, holds each position's rotation as a matrix, so a
    layer rotates q and k with one bmm: 3 us against 18 for the five element-wise ops at one token
    (12 against 26 us at 16), 30 layers a decode step. Same products; the sums may round by an ulp.
    """

    cos: torch.Tensor | None
    sin: torch.Tensor | None
    rotation: torch.Tensor | None = None
    native: NativeRotation | None = None  # the C kernel rotates in place; no per-pass tables
    rot: int | None = None  # the leading dims of a head that rotate (None: all)
    fused: object | None = None  # kernels/triton_fused.py on a GPU (fused_ops): a rotation in one kernel


@dataclass
class NativeRotation:
    kernels: NativeKernels
    positions: torch.Tensor  # [T] int64
    cos: torch.Tensor  # [max_positions, D] fp32: the whole tables, read at `positions`
    sin: torch.Tensor


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for every position, applied with the half-split (NeoX/HF) convention to the first
    `rot` dims of each head (all of them but under partial_rotary_factor; the others pass through:
    their cos is 1 and sin 0 in the tables, which keep the head's width).

    longrope: positions before original_max_position_embeddings rotate by the short factors, the rest
    by the long ones. HF switches the whole sequence to the long factors once it is longer than that
    (the positions computed before keep theirs in its cache); here a position's rotation depends on
    the position alone, as a prefix cache needs, so sequences within that length match HF exactly."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        inv_freq, scale = inv_frequencies(cfg)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        rs = cfg.rope_scaling
        if rs.rope_type == "longrope" and max_positions > rs.original_max_position_embeddings:
            o = rs.original_max_position_embeddings
            freqs[o:] = positions[o:, None] * inv_frequencies(cfg, long=True)[0][None, :]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, rot]
        self.rot = emb.shape[1]
        cos, sin = emb.cos() * scale, emb.sin() * scale
        if self.rot < cfg.head_dim:
            rest = cfg.head_dim - self.rot
            cos = torch.cat([cos, torch.ones(max_positions, rest, dtype=torch.float32)], dim=-1)
            sin = torch.cat([sin, torch.zeros(max_positions, rest, dtype=torch.float32)], dim=-1)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.native: NativeKernels | None = None  # set by CausalLM.finalize
        self.fused = None  # kernels/triton_fused.py on a GPU (fused_ops), set by CausalLM.finalize

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        """The tables for `positions` [T]."""
        if self.native is not None and positions.device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):
            return RopeTables(None, None, native=NativeRotation(self.native, positions, self.cos, self.sin),
                              rot=self.rot)
        cos32, sin32 = self.cos[positions], self.sin[positions]
        rotation = None
        most = ROTATION_MAX_TOKENS if dtype == torch.float32 else ROTATION_MAX_TOKENS_LOW_PRECISION
        if positions.device.type == "cpu" and positions.shape[0] <= most:
            # y = x @ R: R[j, j] = cos_j (1 past the rotated dims), and rotate_half moves x[j + h] to j
            # negated, x[j - h] to j (h: half the rotated dims)
            half = self.rot // 2
            j = torch.arange(half, device=positions.device)
            rotation = torch.diag_embed(cos32)  # fp32 whatever the model's dtype (see apply_one)
            rotation[:, j + half, j] = -sin32[:, :half]
            rotation[:, j, j + half] = sin32[:, half : self.rot]
        cos, sin = cos32.to(dtype), sin32.to(dtype)
        return RopeTables(cos.unsqueeze(1), sin.unsqueeze(1), rotation, rot=self.rot, fused=self.fused)

    @staticmethod
    def apply_one(tables: RopeTables, x: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, D] (any number of q and k heads at once); in place with the C kernel."""
        if tables.native is not None:
            n = tables.native
            return n.kernels.rope_(x, n.positions, n.cos, n.sin, rot=tables.rot)
        if tables.fused is not None and tables.fused.takes(x):  # one kernel; rounds as below
            return tables.fused.rope(x, tables.cos, tables.sin, tables.rot)
        if tables.rotation is not None:
            if x.dtype == tables.rotation.dtype:
                return torch.bmm(x, tables.rotation)
            return torch.bmm(x.float(), tables.rotation).to(x.dtype)
        return x * tables.cos + _rotate_half(x, tables.rot) * tables.sin


def _rotate_half(x: torch.Tensor, rot: int | None = None) -> torch.Tensor:
    """rotate_half of the first `rot` dims (all: None); the dims past them are kept (their sin is 0)."""
    rot = x.shape[-1] if rot is None else rot
    half = rot // 2
    if rot == x.shape[-1]:
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return torch.cat((-x[..., half:rot], x[..., :half], x[..., rot:]), dim=-1)


def halves_from_pairs(rows: torch.Tensor, heads: int, cfg: ModelConfig) -> torch.Tensor:
    """Rows (a weight's [out, ...] or a bias) of `heads` q or k heads of a model that rotates adjacent
    pairs, each head's dims in rope_config.half_split_order (rows move whole: quantized rows too)."""
    order = torch.tensor(half_split_order(cfg.head_dim, cfg.rotary_dim or cfg.head_dim))
    return rows.reshape(heads, cfg.head_dim, *rows.shape[1:])[:, order].reshape(rows.shape)
