"""The disk tier an engine's configuration asks for, keyed to the model it loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentkv.engine.config import EngineConfig
from agentkv.engine.disk.fingerprint import fingerprint
from agentkv.engine.disk.tier import DiskTier, KVLayout
from agentkv.engine.memory import token_shape


def tier_for(cfg: EngineConfig, model_dir: Path, model_config: Any, kv_dtype: torch.dtype,
             native: bool) -> DiskTier | None:
    """A DiskTier under `cfg.cache.kv_dir` for this model (None without kv_dir)."""
    if cfg.cache.kv_dir is None:
        return None
    quantized = cfg.quantized_weights and native and cfg.device == "cpu"
    fp = fingerprint(model_dir, model_config, dtype=cfg.dtype, kv_dtype=str(kv_dtype).removeprefix("torch."),
                     quantized=quantized, native=native)
    layout = KVLayout(token_shape(model_config), kv_dtype)
    return DiskTier(cfg.cache.kv_dir, cfg.cache.kv_disk_bytes, fp, layout, cfg.cache.kv_block_tokens)
