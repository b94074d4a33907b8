"""Attention kernels behind one interface; pick one by name with `get_backend`."""

from agentkv.kernels.base import (
    AttentionBackend,
    AttentionMetadata,
    available_backends,
    get_backend,
)

__all__ = ["AttentionBackend", "AttentionMetadata", "available_backends", "get_backend"]
