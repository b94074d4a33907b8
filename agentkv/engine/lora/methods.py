"""The Engine's LoRA methods (a mixin of `Engine`, which supplies `adapters`): adapters loaded and unloaded
at run time, and listed."""

from __future__ import annotations

from pathlib import Path

from agentkv.engine.config import EngineConfig
from agentkv.engine.lora.registry import AdapterInfo, Adapters
from agentkv.errors import AdapterError


class LoraMethods:
    adapters: Adapters
    config: EngineConfig

    def load_lora(self, name: str, path: str | Path) -> AdapterInfo:
        """Serve the LoRA adapter at `path` (a PEFT adapter folder or a GGUF LoRA file) as `name`: requests
        give `adapter=name`. AdapterError where it cannot be served (its files, its shapes, a name in use,
        max_loras reached); the engine keeps serving either way."""
        if self.config.tensor_parallel > 1:
            raise AdapterError("LoRA adapters do not work with tensor_parallel > 1 yet (the other ranks would not "
                               "apply them); use one rank")
        return self.adapters.load(name, path)

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` (requests running with it finish with it; its cached KV is evicted in
        time like any other). UnknownAdapterError where none is loaded under that name."""
        self.adapters.unload(name)

    def loras(self) -> list[AdapterInfo]:
        """The adapters loaded now."""
        return self.adapters.list()
