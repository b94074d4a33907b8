"""The Engine's LoRA methods (a mixin of `Engine`, which supplies `adapters`): adapters loaded and unloaded
at run time, and listed."""

from __future__ import annotations

from pathlib import Path

from agentkv.engine.lora.registry import AdapterInfo, Adapters


class LoraMethods:
    adapters: Adapters

    def load_lora(self, name: str, path: str | Path) -> AdapterInfo:
        """Serve the LoRA adapter at `path` (a PEFT adapter folder or a GGUF LoRA file) as `name`: requests
        give `adapter=name`. AdapterError where it cannot be served (its files, its shapes, a name in use,
        max_loras reached); the engine keeps serving either way."""
        return self.adapters.load(name, path)

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` (requests running with it finish with it; its cached KV is evicted in
        time like any other). UnknownAdapterError where none is loaded under that name."""
        self.adapters.unload(name)

    def loras(self) -> list[AdapterInfo]:
        """The adapters loaded now."""
        return self.adapters.list()
