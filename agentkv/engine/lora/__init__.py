"""LoRA adapters served beside the base model (docs/lora.md): read (files.py), described (adapter.py), held by
name (registry.py) and applied to each pass's rows by their requests' adapters (apply.py)."""

from agentkv.engine.lora.adapter import LoraAdapter
from agentkv.engine.lora.registry import BASE, AdapterInfo, Adapters

__all__ = ["BASE", "AdapterInfo", "Adapters", "LoraAdapter"]
