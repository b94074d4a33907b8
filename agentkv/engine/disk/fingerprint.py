"""What makes stored KV valid for an engine: the fingerprint a disk tier is kept under.

KV is a function of the weights' bytes, the architecture and its rope settings, the dtype the model
computes in and the pool stores, the tokenizer (which token ids a text becomes) and the kernels'
numerics (quantized weights kept in their blocks round differently from dequantized ones). Any
change among them makes every stored block wrong, so each is part of the fingerprint; a tier under
another fingerprint is never read.

Hashing a multi-gigabyte model on every start would cost seconds, so the weights' hash is kept in
`AGENTKV_CACHE_DIR` by file path, size and modification time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from agentkv.env import cache_root

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".json")
_NOT_WEIGHTS = set(_TOKENIZER_FILES) | {"config.json", "generation_config.json", "special_tokens_map.json"}


def file_digest(path: Path) -> str:
    """blake2b of the file's bytes, remembered by (path, size, mtime) so a start hashes it once."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    memo = cache_root() / "digests.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    known[key] = digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(".tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(memo)
    except OSError:
        pass  # a read-only cache only costs the hash again next start
    return digest


def _files_digest(directory: Path, names) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(names):
        h.update(name.encode() + b"\0" + file_digest(directory / name).encode())
    return h.hexdigest()


def fingerprint(directory: Path, model_config: Any, *, dtype: str, kv_dtype: str, quantized: bool,
                native: bool) -> dict[str, str]:
    """The fingerprint of the model in `directory` as this engine runs it: field -> value, each a
    short string, so that a mismatch can be named."""
    files = [p.name for p in directory.iterdir() if p.is_file()]
    weights = [n for n in files if n.endswith(_WEIGHT_SUFFIXES) and n not in _NOT_WEIGHTS]
    config = dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config) else dict(model_config)
    return {
        "weights": _files_digest(directory, weights),
        "architecture": hashlib.blake2b(json.dumps(config, sort_keys=True, default=str).encode(),
                                        digest_size=16).hexdigest(),
        "tokenizer": _files_digest(directory, [n for n in files if n in _TOKENIZER_FILES]),
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "kernels": ("quantized" if quantized else "dequantized") + ("+native" if native else "+torch"),
    }


def tier_id(fp: dict[str, str]) -> str:
    """The fingerprint as a short name (the tier's folder under kv_dir)."""
    return hashlib.blake2b(json.dumps(fp, sort_keys=True).encode(), digest_size=8).hexdigest()


def differences(stored: dict[str, str], current: dict[str, str]) -> list[str]:
    """The fields of a fingerprint that differ, by name ("weights", "tokenizer", ...)."""
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
