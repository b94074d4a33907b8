"""The rotary embedding's part of a config: `RopeScaling` and how an HF config.json states it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from agentkv.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None  # (yarn, longrope) None: from the factor, as HF computes it
    truncate: bool = True  # (yarn) the correction range rounded out to whole dims (gpt-oss: not)
    # (yarn, DeepSeek) the attention factor's two mscales; mscale_all_dim also scales the softmax
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    # longrope (Phi-3 128k, Phi-4-mini): per-frequency divisors, `short_factor` for positions before
    # original_max_position_embeddings and `long_factor` from there on (see rope.inv_frequencies)
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    # proportional (Gemma 4's full layers): the first `proportion` of a head's frequency pairs rotate, at
    # the frequencies of the whole head's width; the others do not (frequency 0)
    proportion: float = 1.0


def rope_params(cfg: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 writes `rope_parameters`; older configs write `rope_scaling` (+ `rope_theta`).
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return {} if "full_attention" in params else params  # (Gemma 3's per layer type: read by _gemma)


def rope_scaling(cfg: dict[str, Any]) -> RopeScaling:
    rs = rope_params(cfg)
    rope_type = rs.get("rope_type") or rs.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"unsupported rope scaling {rope_type!r}; agentkv implements {SUPPORTED_ROPE_TYPES}")
    known = {f.name for f in dataclasses.fields(RopeScaling)}
    kwargs = {k: v for k, v in rs.items() if k in known}
    kwargs["rope_type"] = rope_type
    if rope_type == "longrope":
        # Phi-3 keeps the pretrained length beside the rope parameters; without a `factor`, HF takes the
        # ratio of the two lengths (what sets the attention factor)
        original = rs.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
        if not original or not rs.get("short_factor") or not rs.get("long_factor"):
            raise ModelLoadError(
                "longrope needs original_max_position_embeddings, short_factor and long_factor "
                "in the config; this one lacks some"
            )
        kwargs.update(
            original_max_position_embeddings=int(original), short_factor=tuple(map(float, rs["short_factor"])),
            long_factor=tuple(map(float, rs["long_factor"])),
            factor=float(rs.get("factor") or int(cfg.get("max_position_embeddings", original)) / int(original)))
    return RopeScaling(**kwargs)


def rotary_dim(head_dim: int, partial: float) -> int:
    """The rotated dims of a head under partial_rotary_factor (0: all); an even count, as HF's int()."""
    if partial == 1.0:
        return 0
    dim = int(head_dim * partial)
    if not 0 < dim <= head_dim or dim % 2:
        raise ModelLoadError(f"partial_rotary_factor={partial} of head_dim {head_dim} gives {dim} rotated dims; "
                             "it must be an even count between 2 and head_dim")
    return dim


def half_split_order(head_dim: int, rotary_dim: int) -> list[int]:
    """A head's dims reordered so that a model rotating adjacent pairs (GLM-4: dims 2i and 2i+1 by
    frequency i) computes its scores under the half-split rotation (dims i and i + rot/2): evens
    first, odds after, the dims that do not rotate kept. q and k reordered alike keep their dot
    product, the only thing read of them."""
    return [*range(0, rotary_dim, 2), *range(1, rotary_dim, 2), *range(rotary_dim, head_dim)]


def rotated_rows_in_half_split(blocks: int, kept: int, rope: int) -> list[int]:
    """Row order for `blocks` runs of `kept` rows that do not rotate then `rope` rows rotating adjacent pairs
    (DeepSeek-V3's q heads; its latent then the shared rotated key part): each run's rotated rows in
    half_split_order, the others kept."""
    order = half_split_order(rope, rope)
    width = kept + rope
    return [b * width + i for b in range(blocks) for i in (*range(kept), *(kept + j for j in order))]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for a context `factor` times the pretrained one (eq. 21: 0.1 m ln s + 1)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0
