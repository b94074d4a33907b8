"""The environment variables agentkv reads, in one place.

- `AGENTKV_CACHE_DIR`: where converted GGUF models and the compiled CPU kernels are kept
  (default `~/.cache/agentkv`).
- `AGENTKV_NATIVE_KERNELS=0`: run the torch ops instead of the C kernels on CPU (agentkv/kernels/cpu_native.py).
- `AGENTKV_NATIVE_GRAMMAR=0`: walk grammar tokens in Python instead of C (agentkv/grammar/native.py):
  the same masks, slower.
- `AGENTKV_CPU_ARCH`: the CPU the C kernels are built for (gcc's -march; default "native"), e.g.
  "haswell" for the AVX2 bodies on a host that has more.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("AGENTKV_CACHE_DIR") or Path.home() / ".cache" / "agentkv")


def native_kernels_allowed() -> bool:
    return os.environ.get("AGENTKV_NATIVE_KERNELS", "1") != "0"


def native_grammar_allowed() -> bool:
    return os.environ.get("AGENTKV_NATIVE_GRAMMAR", "1") != "0"


def cpu_arch() -> str:
    return os.environ.get("AGENTKV_CPU_ARCH") or "native"
