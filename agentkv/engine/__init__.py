"""The LLM engine: model, KV memory, radix cache, scheduler, sampler and the Engine API.

The names load on first use (PEP 562): `from agentkv.engine import SamplingParams` (or the outputs)
imports neither torch nor the model code, so the agent, chat and DSL layers take them at the top.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_WHERE = {"Engine": "agentkv.engine.engine", "Completion": "agentkv.engine.outputs",
          "RequestOutput": "agentkv.engine.outputs", "StreamDelta": "agentkv.engine.outputs",
          "TokenLogprob": "agentkv.engine.outputs", "Usage": "agentkv.engine.outputs",
          "PinHandle": "agentkv.engine.radix_cache", "SamplingParams": "agentkv.engine.sampling_params"}

if TYPE_CHECKING:
    from agentkv.engine.engine import Engine
    from agentkv.engine.outputs import Completion, RequestOutput, StreamDelta, TokenLogprob, Usage
    from agentkv.engine.radix_cache import PinHandle
    from agentkv.engine.sampling_params import SamplingParams


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentkv.engine' has no attribute {name!r}")


__all__ = [
    "Completion", "Engine", "PinHandle", "RequestOutput", "SamplingParams", "StreamDelta", "TokenLogprob", "Usage"]
