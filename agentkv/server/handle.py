"""What the HTTP routes run on: an `EngineHandle` (as vLLM's server runs over its EngineClient).

The routes (app.py) own the HTTP contract: the API key, the model check, body limits, admission
(429 past the in-flight limit) and /metrics. Behind them, a handle answers each validated request:
`LocalHandle` with one engine in this process (`agentkv serve`), the cluster's handle with Ray Serve
replicas (server/cluster/handle.py, `agentkv serve --replicas N`). Both take the validated request
and the body it came from: a local engine reads the first, a replica is sent the second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from agentkv.chat.carry import TokenCarry
from agentkv.errors import AdapterError, UnknownAdapterError
from agentkv.server.anthropic import CountTokensRequest, MessagesRequest, count_tokens, create_message
from agentkv.server.anthropic_stream import stream_message
from agentkv.server.chat import ChatPlan, chat_completion, chat_stream
from agentkv.server.completions import completion, completion_stream
from agentkv.server.metrics import Metrics
from agentkv.server.protocol import APIError, ChatRequest, CompletionRequest, no_pin
from agentkv.server.responses import ResponseStore, create_response, stream_response
from agentkv.server.responses_items import ResponsesRequest
from agentkv.server.sessions import Sessions
from agentkv.server.state import StateFile, tokenizer_key

REPLIES = 1024  # replies whose tokens the chat routes carry, the least recent out first


class EngineHandle(Protocol):
    """An engine (or several) as the routes see it. The `*_stream` methods return the server-sent
    events; their first is computed before they return (a request that cannot run fails with its
    HTTP status), and `done()` runs when the stream ends, however it ends."""

    async def chat(self, req: ChatRequest, body: dict) -> dict: ...

    async def chat_stream(self, req: ChatRequest, body: dict, metrics: Metrics, started: float,
                          done: Callable[[], None]) -> AsyncIterator[str]: ...

    async def completion(self, req: CompletionRequest, body: dict) -> dict: ...

    async def completion_stream(self, req: CompletionRequest, body: dict, metrics: Metrics, started: float,
                                done: Callable[[], None]) -> AsyncIterator[str]: ...

    async def create_response(self, req: ResponsesRequest, body: dict) -> dict: ...

    async def stream_response(self, req: ResponsesRequest, body: dict, metrics: Metrics, started: float,
                              done: Callable[[], None]) -> AsyncIterator[str]: ...

    async def get_response(self, response_id: str) -> dict: ...

    async def message(self, req: MessagesRequest, body: dict) -> dict: ...

    async def message_stream(self, req: MessagesRequest, body: dict, metrics: Metrics, started: float,
                             done: Callable[[], None]) -> AsyncIterator[str]: ...

    async def count_tokens(self, req: CountTokensRequest, body: dict) -> dict: ...

    async def delete_response(self, response_id: str) -> None: ...

    async def pin(self, req: ChatRequest, body: dict) -> dict: ...

    async def unpin(self, pin_id: str) -> None: ...

    def pins(self) -> list[dict]: ...

    async def stats(self) -> dict: ...

    def adapters(self) -> list[dict]: ...  # the LoRA adapters served: {"id": name, "root": its files}

    async def load_lora(self, name: str, path: str) -> None: ...

    async def unload_lora(self, name: str) -> None: ...


class LocalHandle:
    """One engine in this process. Stored responses and pins are kept here, their tokens pinned in
    the engine's radix cache."""

    def __init__(self, engine, model_name: str, close_objects: bool = True, stored_responses: int = 1024,
                 response_ttl_s: float = 3600.0, resamples: int = 2, session_ttl_s: float = 300.0,
                 state_dir: str | None = None):
        self.engine, self.model_name, self.close_objects = engine, model_name, close_objects
        self.sessions = Sessions(engine, session_ttl_s)  # prompt_cache_key and cache_control hints
        self.replies = TokenCarry(engine.tokenizer, REPLIES)  # a transcript sent back meets its replies' tokens
        self.resamples = resamples  # an output failing a relaxed keyword is generated again, this many times
        state = StateFile(state_dir, tokenizer_key(engine.tokenizer)) if state_dir is not None else None
        self.responses = ResponseStore(engine, stored_responses, response_ttl_s, state)
        self._pins: dict[str, tuple[Any, int]] = {}  # id -> (PinHandle, tokens)
        self.id_prefix = "pin-"
        engine.adapters.alias_base(model_name)  # a request naming the served model runs on the base

    async def chat(self, req: ChatRequest, body: dict) -> dict:
        return await chat_completion(self.engine, req, self.model_name, self.resamples, self.sessions, self.replies)

    async def chat_stream(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await chat_stream(self.engine, req, self.model_name, metrics, started, done, self.sessions,
                                 self.replies)

    async def completion(self, req: CompletionRequest, body: dict) -> dict:
        return await completion(self.engine, req, self.model_name)

    async def completion_stream(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await completion_stream(self.engine, req, self.model_name, metrics, started, done)

    async def create_response(self, req: ResponsesRequest, body: dict, response_id: str | None = None) -> dict:
        return await create_response(self.engine, req, self.model_name, self.responses, self.close_objects,
                                     response_id, self.resamples, self.sessions)

    async def stream_response(self, req, body, metrics, started, done,
                              response_id: str | None = None) -> AsyncIterator[str]:
        return await stream_response(self.engine, req, self.model_name, self.responses, metrics, started, done,
                                     self.close_objects, response_id)

    async def get_response(self, response_id: str) -> dict:
        return self.responses.get(response_id).response

    async def message(self, req: MessagesRequest, body: dict) -> dict:
        return await create_message(self.engine, req, self.model_name, self.close_objects, self.resamples,
                                    self.sessions, self.replies)

    async def message_stream(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await stream_message(self.engine, req, self.model_name, metrics, started, done, self.close_objects,
                                    self.replies)

    async def count_tokens(self, req: CountTokensRequest, body: dict) -> dict:
        return await count_tokens(self.engine, req, self.close_objects)

    async def delete_response(self, response_id: str) -> None:
        await self.responses.delete(response_id)

    async def pin(self, req: ChatRequest, body: dict) -> dict:
        """Pin the prefix every conversation with these messages and tools starts with."""
        ttl = (req.model_extra or {}).get("ttl_s")
        if ttl is not None and (not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or ttl <= 0):
            raise APIError(400, "ttl_s must be a positive number of seconds (the pin ends when that long passes "
                                "without a request that starts with it)", "ttl_s")
        plan = ChatPlan(self.engine, req)  # rendered as a chat request with these messages and tools renders them
        ids = self.engine.conversation_prefix(plan.messages, tools=plan.template_tools)
        handle = await asyncio.to_thread(lambda: self.engine.pin(ids, ttl_s=ttl, adapter=plan.params.adapter))
        pin_id = f"{self.id_prefix}{handle.id}"
        self._pins[pin_id] = (handle, len(ids))
        return {"id": pin_id, "object": "pin", "tokens": len(ids)}

    async def unpin(self, pin_id: str) -> None:
        if pin_id not in self._pins:
            raise no_pin(pin_id)
        handle, _ = self._pins.pop(pin_id)
        await asyncio.to_thread(self.engine.unpin, handle)

    def pins(self) -> list[dict]:
        active = {p.id for p in self.engine.pins()}  # (a pin whose time to live ran out is gone)
        self._pins = {k: v for k, v in self._pins.items() if v[0].id in active}
        return [{"id": k, "object": "pin", "tokens": n} for k, (_, n) in self._pins.items()]

    async def stats(self) -> dict:
        return await asyncio.to_thread(self.engine.stats)

    def adapters(self) -> list[dict]:
        return [{"id": a.name, "root": a.source} for a in self.engine.loras()]

    async def load_lora(self, name: str, path: str) -> None:
        """An adapter that cannot be loaded (its files, a name in use, max_loras) is a 400 naming why."""
        try:
            await asyncio.to_thread(self.engine.load_lora, name, path)
        except AdapterError as e:
            raise APIError(400, str(e), "lora_path", code="lora_adapter_error") from None

    async def unload_lora(self, name: str) -> None:
        try:
            await asyncio.to_thread(self.engine.unload_lora, name)
        except UnknownAdapterError as e:
            raise APIError(404, str(e), "lora_name", code="lora_adapter_not_found") from None
