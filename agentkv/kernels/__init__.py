"""Attention kernels behind one interface; pick one by name with `get_backend`."""

from agentkv.kernels.base import AttentionBackend, AttentionMetadata
from agentkv.kernels.registry import available_backends, get_backend, register

__all__ = ["AttentionBackend", "AttentionMetadata", "available_backends", "get_backend", "register"]
