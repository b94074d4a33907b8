"""Building agentkv's C sources into a shared library on first use, cached by what went into it.

Both native parts use this: the CPU kernels (agentkv/kernels/cpu_native.py: -march for this CPU,
OpenMP linked against torch's runtime) and the grammar's token walk (agentkv/grammar/native.py:
portable C, no torch). A library is kept in `$AGENTKV_CACHE_DIR/<folder>/` under a hash of its
sources, the compiler, the flags and anything else the caller names (the CPU for -march=native);
processes that build at once each write a whole file and the last rename wins.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agentkv.env import cache_root


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler found (install gcc or clang, or set CC)")
    return cc


def build(folder: str, name: str, sources: Sequence[Path], flags: Sequence[str] = (),
          fallback_flags: Sequence[str] | None = None, link: Sequence[str] = (),
          key: Sequence[bytes] = ()) -> Path:
    """The library built from `sources` (with the headers beside them), from the cache where it is
    there. `fallback_flags` replace `flags` for a compiler that refuses them (-march=native); a source
    that fails under flags the compiler takes is an error, not a reason to build it without them (the
    plain-C bodies run many times slower)."""
    cc = compiler()
    digest = hashlib.sha256()
    folders = {Path(s).parent for s in sources}
    headers = sorted(p for d in folders for p in d.glob("*.h"))
    for part in [*(Path(p).read_bytes() for p in [*sorted(sources), *headers]), compiler_version(cc),
                 repr((list(flags), list(link))).encode(), *key]:
        digest.update(part)
    out = cache_root() / folder / f"{name}-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        if fallback_flags is not None and not _takes(cc, flags, Path(tmp)):
            flags = fallback_flags
        objects = []
        for src in sources:
            obj = Path(tmp) / (Path(src).stem + ".o")
            run([cc, "-O3", "-fPIC", "-std=gnu11", "-c", str(src), "-o", str(obj), *flags])
            objects.append(obj)
        so = Path(tmp) / out.name
        run([cc, "-shared", "-o", str(so), *map(str, objects), *link, "-lm"])
        os.replace(so, out)  # atomic: processes building at once (tensor-parallel ranks) all load a whole file
    return out


def _takes(cc: str, flags: Sequence[str], tmp: Path) -> bool:
    """Whether the compiler builds an empty source with `flags`."""
    src = tmp / "empty.c"
    src.write_text("int agentkv_empty;\n")
    return subprocess.run([cc, "-c", str(src), "-o", str(tmp / "empty.o"), *flags], capture_output=True).returncode == 0


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} ... failed: {proc.stderr.strip()[-600:]}")


def compiler_version(cc: str) -> bytes:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return b""
