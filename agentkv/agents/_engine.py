"""What an agent needs of an engine: the methods `agentkv.engine.Engine` has, as a Protocol.

The agent layer is typed against this, not the engine class, so it imports neither the engine nor
torch, and a test double (or a client of a remote engine) that has these methods runs an agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from agentkv.chat.formats import ToolFormat
from agentkv.chat.reasoning import ReasoningFormat


class AgentTokenizer(Protocol):
    eos_ids: Any  # a container of the ids that end a turn

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class AgentEngine(Protocol):
    tool_format: ToolFormat  # how the model offers tools and writes its calls
    reasoning: ReasoningFormat | None  # its reasoning block, where it has one
    tokenizer: AgentTokenizer
    config: Any  # the engine's config: `config.cache.enable_radix_cache` says whether a pin helps

    def render(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
               add_generation_prompt: bool = True, **template_kwargs: Any) -> str: ...

    def conversation_prefix(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                            **template_kwargs: Any) -> list[int]: ...

    def pin(self, prefix: Any, *, tools: Sequence[dict] | None = None, adapter: str | None = None) -> Any: ...

    def unpin(self, handle: Any, wait: bool = True) -> None: ...

    def stream(self, prompt: Any, params: Any = None, **sampling: Any) -> AsyncIterator[Any]: ...
