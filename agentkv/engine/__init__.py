"""The LLM engine: model, KV memory, radix cache, scheduler, sampler and the Engine API."""

from agentkv.engine.engine import Engine
from agentkv.engine.outputs import Completion, RequestOutput, StreamDelta, TokenLogprob, Usage
from agentkv.engine.radix_cache import PinHandle
from agentkv.engine.sampling_params import SamplingParams

__all__ = ["Completion", "Engine", "PinHandle", "RequestOutput", "SamplingParams", "StreamDelta", "TokenLogprob", "Usage"]
