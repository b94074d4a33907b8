"""gpt-oss's experts as its checkpoints hold them, into the layout of agentkv's MLP.

A checkpoint holds every layer's experts stacked: gate_up [E, hidden, 2 * width] (input-major, the
gate's and up's columns interleaved) with its bias [E, 2 * width], down [E, width, hidden] with its bias
[E, hidden]; the published ones hold the two matrices in MXFP4 (`*_blocks` [E, out, in / 32, 16]: two
E2M1 values a byte, the low nibble first; `*_scales` [E, out, in / 32]: a power of two, biased by 127,
for each 32). Each expert becomes an MLP's gate_up [2 * width, hidden] (gate rows first) and down
[hidden, width], with its biases.
"""

from __future__ import annotations

import torch

from agentkv.engine.model_config import ModelConfig
from agentkv.errors import ModelLoadError


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 blocks [..., groups, 16] (uint8) and scales [..., groups] (uint8) -> fp32 [..., groups * 32]: as
    a GGUF's MXFP4 rows (mxfp4_file_rows), which the `gguf` package dequantizes, the same values."""
    import gguf  # (its import is paid only where a checkpoint's experts are dequantized)

    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ModelLoadError(f"MXFP4 blocks {tuple(blocks.shape)} ({blocks.dtype}) and scales {tuple(scales.shape)} "
                             f"({scales.dtype}) do not match; the checkpoint is damaged")
    rows = mxfp4_file_rows(blocks, scales)
    return torch.from_numpy(gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType.MXFP4))


def mxfp4_file_rows(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A checkpoint's MXFP4 (blocks [..., groups, 16], scales [..., groups]) as a GGUF's rows of MXFP4 blocks
    [..., groups * 17]: the same exponent byte (2^(e - 127) times E2M1 values is 2^(e - 128) times their
    doubles, GGUF's table), the codes in GGUF's nibble order (weight j low, j + 16 high; the checkpoint's
    byte j holds weights 2j and 2j + 1)."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [..., groups, 32] in weight order
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return torch.cat([scales[..., None], qs], dim=-1).flatten(-2)


def gpt_oss_experts(hf: dict, take, block: str, o: str, cfg: ModelConfig, keep=None) -> dict:
    """One layer's experts (HF names under `block`) as `o`experts.N.gate_up_proj / down_proj weights
    [out, in] and biases. `keep` (the loader's: parts [(uint8 rows, type)] -> a QuantWeight, or None
    where they cannot stay in blocks): MXFP4 experts kept in their blocks where it takes them."""
    x = block + "experts."
    if x + "gate_up_proj_blocks" in hf and keep is not None and (kept := _kept_experts(hf, x, o, cfg, keep)):
        return {**kept, **_biases(take, x, o, cfg)}
    if x + "gate_up_proj_blocks" in hf:  # MXFP4, output-major
        gate_up = dequantize_mxfp4(hf[x + "gate_up_proj_blocks"], hf[x + "gate_up_proj_scales"])
        down = dequantize_mxfp4(hf[x + "down_proj_blocks"], hf[x + "down_proj_scales"])
    else:  # input-major
        gate_up, down = take(x + "gate_up_proj").transpose(1, 2), take(x + "down_proj").transpose(1, 2)
    e, width, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    if gate_up.shape != (e, 2 * width, hidden) or down.shape != (e, hidden, width):
        raise ModelLoadError(f"{x}: experts' matrices {tuple(gate_up.shape)} and {tuple(down.shape)}, where the config "
                             f"implies {(e, 2 * width, hidden)} and {(e, hidden, width)}; config and weights disagree")
    if not (torch.isfinite(gate_up).all() and torch.isfinite(down).all()):
        raise ModelLoadError(f"{x}: the experts' weights hold NaN or infinite values; the weights are corrupt")
    out = _biases(take, x, o, cfg)
    for n in range(e):  # (the gate's rows are the even ones, up's the odd ones)
        out[o + f"experts.{n}.gate_up_proj.weight"] = torch.cat([gate_up[n, 0::2], gate_up[n, 1::2]]).float()
        out[o + f"experts.{n}.down_proj.weight"] = down[n].float()
    return out


def _biases(take, x: str, o: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    gate_up_bias, down_bias = take(x + "gate_up_proj_bias"), take(x + "down_proj_bias")
    out = {}
    for n in range(cfg.num_experts):
        out[o + f"experts.{n}.gate_up_proj.bias"] = torch.cat([gate_up_bias[n, 0::2], gate_up_bias[n, 1::2]])
        out[o + f"experts.{n}.down_proj.bias"] = down_bias[n]
    return out


def _kept_experts(hf: dict, x: str, o: str, cfg: ModelConfig, keep) -> dict:
    """The experts' matrices in their MXFP4 blocks through `keep` (empty where it cannot keep them)."""
    e, width, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    gate_up = mxfp4_file_rows(hf[x + "gate_up_proj_blocks"], hf[x + "gate_up_proj_scales"])
    down = mxfp4_file_rows(hf[x + "down_proj_blocks"], hf[x + "down_proj_scales"])
    if gate_up.shape != (e, 2 * width, hidden // 32 * 17) or down.shape != (e, hidden, width // 32 * 17):
        return {}  # (the dequantizing path names the mismatch)
    out = {}
    for n in range(e):
        gu = keep([(gate_up[n, 0::2].contiguous(), "MXFP4"), (gate_up[n, 1::2].contiguous(), "MXFP4")])
        dn = keep([(down[n].contiguous(), "MXFP4")])
        if gu is None or dn is None:
            return {}
        out[o + f"experts.{n}.gate_up_proj.weight"], out[o + f"experts.{n}.down_proj.weight"] = gu, dn
    return out
