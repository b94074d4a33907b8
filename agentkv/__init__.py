"""agentkv: structured output and agents on an LLM engine that remembers.

`import agentkv as ak` is the whole user surface: `ak.Engine`, `ak.SamplingParams`, and the errors.
"""

from agentkv.engine import Completion, Engine, PinHandle, RequestOutput, SamplingParams, StreamDelta, Usage
from agentkv.errors import (
    AgentKVError,
    CacheError,
    EngineClosedError,
    EngineError,
    ModelLoadError,
    PinBudgetError,
    RequestError,
)

__version__ = "0.1.0"
__all__ = [
    "AgentKVError", "CacheError", "Completion", "Engine", "EngineClosedError", "EngineError", "ModelLoadError",
    "PinBudgetError", "PinHandle", "RequestError", "RequestOutput", "SamplingParams", "StreamDelta", "Usage",
]
