"""The attention backends by name: the built-in four and any a user registers; "auto" picks one
for the device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentkv.errors import RequestError
from agentkv.kernels import cpu_native
from agentkv.kernels.base import AttentionBackend
from agentkv.kernels.cpu_backend import CpuAttentionBackend
from agentkv.kernels.flashinfer_backend import FlashInferAttentionBackend
from agentkv.kernels.torch_backend import TorchAttentionBackend
from agentkv.kernels.triton_backend import TritonAttentionBackend, triton_usable

# the built-in ones; cpu, triton and flashinfer refuse with a clear error where they cannot run
_REGISTRY: dict[str, Callable[[], AttentionBackend]] = {
    "torch": TorchAttentionBackend,
    "cpu": CpuAttentionBackend,
    "triton": TritonAttentionBackend,
    "flashinfer": FlashInferAttentionBackend,
}


def register(name: str, factory: Callable[[], AttentionBackend]) -> None:
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str, device: str | None = None, native: bool = True) -> AttentionBackend:
    """`native` False keeps "auto" off agentkv's C kernel (the engine's native_kernels=False)."""
    if name == "auto":
        name = auto_backend(device, native)
    if name not in _REGISTRY:
        raise RequestError(f"unknown attention backend {name!r}; choose one of {available_backends()} or 'auto'")
    return _REGISTRY[name]()


def auto_backend(device: str | None = None, native: bool = True) -> str:
    """For a CUDA device (`device` None: CUDA if there is one), Triton where triton imports; on CPU,
    agentkv's C kernels where they build (kernels/cpu_native.py); the torch reference elsewhere (on
    CPU the Triton kernels only run interpreted, far slower than torch). FlashInfer is chosen by
    name only until it has been checked on a GPU (benchmarks/gpu.sh)."""
    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if on_cuda:
        return "triton" if triton_usable("cuda")[0] else "torch"
    return "cpu" if native and cpu_native.load() is not None else "torch"

