"""A model directory's tensors: the safetensors files' by name, read when asked, and a converted GGUF's matrices
kept in their quantized blocks (quant.safetensors, their types in its metadata)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from agentkv.errors import ModelLoadError


class Checkpoint(Mapping):
    """A checkpoint's tensors by name (`rename`d), each read from its file when asked: the loader holds the
    tensors it has made, not a second copy of every file (an 8B model's 16 GB) beside them."""

    def __init__(self, directory: Path, rename: Callable[[str], str] | None = None):
        from safetensors import safe_open

        files = sorted(f for f in directory.glob("*.safetensors") if f.name != "quant.safetensors")
        if not files:
            raise ModelLoadError(
                f"{directory} has no *.safetensors weights; agentkv loads safetensors or GGUF, not .bin/.pt")
        self._where: dict[str, tuple] = {}
        for f in files:
            try:
                handle = safe_open(str(f), "pt")
                names = list(handle.keys())
            except Exception as e:  # safetensors raises its own error types for truncated/corrupt headers
                raise _corrupt(f, e) from None
            self._where.update({rename(n) if rename else n: (handle, n, f) for n in names})

    def __getitem__(self, name: str) -> torch.Tensor:
        handle, stored, f = self._where[name]
        try:
            return handle.get_tensor(stored)
        except Exception as e:  # (a tensor past a truncated file's end)
            raise _corrupt(f, e) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def quantized_kinds(directory: Path) -> dict[str, str]:
    """A converted GGUF's matrices kept in their blocks: name -> quantization (the file's metadata)."""
    path = directory / "quant.safetensors"
    if not path.exists():
        return {}
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return json.loads((f.metadata() or {}).get("types", "{}"))


def read_quantized(directory: Path) -> dict[str, tuple[torch.Tensor, str]]:
    """Those matrices: name -> (uint8 rows, quantization name)."""
    kinds = quantized_kinds(directory)
    if not kinds:
        return {}
    from safetensors.torch import load_file

    return {name: (t, kinds[name]) for name, t in load_file(str(directory / "quant.safetensors")).items()}


def dequantize_blocks(raw: torch.Tensor, kind: str) -> torch.Tensor:
    import gguf

    values = gguf.quants.dequantize(raw.numpy(), getattr(gguf.GGMLQuantizationType, kind))
    return torch.from_numpy(values.astype("float32", copy=False))


def _corrupt(f: Path, e: Exception) -> ModelLoadError:
    return ModelLoadError(f"weights file {f} is corrupt or truncated ({type(e).__name__}: {e})")
