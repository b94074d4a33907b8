"""The engine's loaded LoRA adapters by name: loaded at start or at run time, unloaded at run time, each
request holding the adapter object it was given until it ends (an unload or a reload under the same name
never changes what a request in flight computes with)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from agentkv.engine.lora.adapter import LoraAdapter
from agentkv.engine.lora.files import load_adapter
from agentkv.engine.model_config import ModelConfig
from agentkv.errors import AdapterError, UnknownAdapterError

BASE = "base"  # a name that means no adapter (a server adds its model's name: alias_base)


@dataclass(frozen=True)
class AdapterInfo:
    """What the API lists of a loaded adapter."""

    name: str
    source: str
    rank: int
    alpha: float
    targets: tuple[str, ...]
    hash: str
    nbytes: int


class Adapters:
    def __init__(self, cfg: ModelConfig, max_loras: int, device: str = "cpu"):
        self.cfg, self.max_loras, self.device = cfg, max_loras, device
        self._loaded: dict[str, LoraAdapter] = {}
        self._lock = threading.Lock()
        self.base_names = {BASE}  # the names a request gives for the base model

    def alias_base(self, name: str) -> None:
        """`name` means the base model too (a server's model id: its requests name it)."""
        with self._lock:
            if name in self._loaded:
                raise AdapterError(f"a LoRA adapter is loaded as {name!r}, the name the base model is served as; "
                                   f"load the adapter under another name")
            self.base_names.add(name)

    def load(self, name: str, path: str | Path) -> AdapterInfo:
        """Read the adapter at `path` and serve it as `name`; AdapterError where its files cannot be served,
        the name is taken or max_loras are loaded (the engine keeps serving either way)."""
        if not isinstance(name, str) or not name or name in self.base_names:
            raise AdapterError(f"LoRA adapter name {name!r} is not usable: give a non-empty name other than the "
                               f"base model's ({sorted(self.base_names)})")
        with self._lock:
            self._check_room(name)
        adapter = load_adapter(name, path, self.cfg).to(self.device)  # (read outside the lock: it takes a while)
        with self._lock:
            self._check_room(name)
            self._loaded[name] = adapter
        return info(adapter)

    def _check_room(self, name: str) -> None:
        if name in self._loaded:
            raise AdapterError(f"a LoRA adapter named {name!r} is loaded already; unload it first (or pick "
                               f"another name)")
        if len(self._loaded) >= self.max_loras:
            raise AdapterError(f"{len(self._loaded)} LoRA adapters are loaded, the most max_loras="
                               f"{self.max_loras} allows; unload one or raise max_loras")

    def unload(self, name: str) -> None:
        """Stop serving `name`; requests already running with it finish with it."""
        with self._lock:
            if self._loaded.pop(name, None) is None:
                raise UnknownAdapterError(self._unknown(name))

    def resolve(self, name: str | None) -> LoraAdapter | None:
        """The adapter a request names (None, or "base": none)."""
        if name is None or name in self.base_names:
            return None
        with self._lock:
            adapter = self._loaded.get(name)
        if adapter is None:
            raise UnknownAdapterError(self._unknown(name))
        return adapter

    def by_hash(self, digest: str) -> LoraAdapter | None:
        """The loaded adapter of this content (a pin a restart brings back), if any."""
        with self._lock:
            return next((a for a in self._loaded.values() if a.hash == digest), None)

    def _unknown(self, name: str) -> str:
        loaded = sorted(self._loaded)
        return (f"no LoRA adapter named {name!r} is loaded; loaded: {loaded}" if loaded else
                f"no LoRA adapter named {name!r} is loaded (none are); load it with Engine(lora={{...}}), "
                f"Engine.load_lora or `agentkv serve --lora NAME=PATH`")

    def list(self) -> list[AdapterInfo]:
        with self._lock:
            return [info(a) for a in self._loaded.values()]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._loaded)


def info(adapter: LoraAdapter) -> AdapterInfo:
    return AdapterInfo(adapter.name, adapter.source, adapter.rank, adapter.alpha,
                       tuple(sorted(adapter.targets)), adapter.hash, adapter.nbytes)
