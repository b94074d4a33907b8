"""/v1/responses: OpenAI's Responses API over the same plan as chat (responses_items.py turns its
items into chat messages and back; the prompt, grammar, tool format and reasoning are chat.py's).

A stored response (`store`, the default) keeps its conversation for `previous_response_id`, and
the conversation's tokens stay pinned in the radix cache while it is stored (within the pin budget;
a continued response moves the pin to the longer conversation), so the next turn starts from cache
rather than from a re-sent transcript.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agentkv.chat.carry import TokenCarry
from agentkv.errors import CacheError, EngineClosedError, RequestError
from agentkv.server.chat import ChatPlan, _run, chain, generate_checked, hint
from agentkv.server.protocol import APIError
from agentkv.server.responses_items import (
    ResponsesRequest,
    chat_body,
    conversation,
    output_items,
    response_object,
    responses_names,
)
from agentkv.server.responses_stream import ItemStream
from agentkv.server.sessions import Sessions
from agentkv.server.state import StateFile


@dataclass
class Stored:
    response: dict
    messages: list[dict]  # the conversation so far, as chat messages (without the instructions)
    expires: float
    pin: Any = None
    tokens: list[int] = field(default_factory=list)
    carry: TokenCarry | None = None  # its prompt and reply as tokens, for the response that continues it
    adapter: str | None = None  # the LoRA adapter it ran with (its tokens' KV is that adapter's)


class ResponseStore:
    """Stored responses, at most `capacity`, each for `ttl_s` seconds; the oldest go first. With a
    `state` file (server/state.py), each is written there as it is stored and the store starts with
    what an earlier run kept (not pinned again: their KV is on disk where the engine has a tier)."""

    def __init__(self, engine, capacity: int = 1024, ttl_s: float = 3600.0, state: StateFile | None = None):
        self.engine, self.capacity, self.ttl_s, self.state = engine, capacity, ttl_s, state
        self._items: OrderedDict[str, Stored] = OrderedDict()
        for rid, left, record in state.load() if state is not None else ():
            carry = TokenCarry(engine.tokenizer)
            carry.restore(record["carry"])
            self._items[rid] = Stored(record["response"], record["messages"], time.monotonic() + left,
                                      tokens=record["tokens"], carry=carry, adapter=record.get("adapter"))
        self._expire()

    def ids(self) -> list[str]:
        self._expire()
        return list(self._items)

    def get(self, rid: str) -> Stored:
        self._expire()
        if rid not in self._items:
            raise APIError(404, f"no stored response {rid!r} (responses are kept {self.ttl_s:.0f} s, and only "
                                "with store: true)", "previous_response_id", code="response_not_found")
        return self._items[rid]

    async def put(self, rid: str, item: Stored, previous: str | None) -> None:
        """Keep `item`, its tokens pinned; the response it continued gives up its pin (this one's
        tokens start with that one's)."""
        self._items[rid] = item
        if self.state is not None:  # (before the route answers: a client that has the id can continue it)
            record = {"response": item.response, "messages": item.messages, "tokens": item.tokens,
                      "carry": item.carry.state() if item.carry is not None else [], "adapter": item.adapter}
            await asyncio.to_thread(self.state.put, rid, self.ttl_s, record)
        self._expire()
        if previous in self._items:
            await self._unpin(self._items[previous])
        try:
            item.pin = await asyncio.to_thread(lambda: self.engine.pin(item.tokens, adapter=item.adapter))
        except (CacheError, EngineClosedError, RequestError):  # over the pin budget (or its adapter gone): unpinned
            item.pin = None

    async def delete(self, rid: str) -> None:
        item = self.get(rid)
        del self._items[rid]
        if self.state is not None:
            await asyncio.to_thread(self.state.delete, rid)
        await self._unpin(item)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._items:
            rid, oldest = next(iter(self._items.items()))
            if oldest.expires > now and len(self._items) <= self.capacity:
                break
            del self._items[rid]
            if self.state is not None:
                self.state.delete(rid)
            if oldest.pin is not None:  # posted, not awaited: this runs on the server's event loop
                self.engine.unpin(oldest.pin, wait=False)

    async def _unpin(self, item: Stored) -> None:
        if item.pin is not None:
            pin, item.pin = item.pin, None
            await asyncio.to_thread(self.engine.unpin, pin)


def _plan(engine, req: ResponsesRequest, store: ResponseStore, close_objects: bool) -> tuple[ChatPlan, list[dict]]:
    """The plan of a response; one that continues a stored response starts with that one's tokens."""
    previous = store.get(req.previous_response_id) if req.previous_response_id else None
    messages = (previous.messages if previous else []) + conversation(req.input)
    try:
        return ChatPlan(engine, chat_body(req, messages, close_objects), previous.carry if previous else None), messages
    except APIError as e:  # the chat request's and plan's 400s, in the Responses API's field names
        raise APIError(e.status, responses_names(e.message), responses_names(e.param or "") or None, e.type,
                       e.code) from None


async def create_response(engine, req: ResponsesRequest, model: str, store: ResponseStore,
                          close_objects: bool = True, response_id: str | None = None, resamples: int = 0,
                          sessions: Sessions | None = None) -> dict:
    """The response; `response_id` where the caller chose it (a cluster's ingress, to route the
    response's continuations to this engine)."""
    plan, messages = _plan(engine, req, store, close_objects)
    ids = _prompt_ids(plan)
    rid = response_id or _response_id()
    await hint(sessions, plan)
    out, [(msg, _)], _ = await generate_checked(engine, plan, ids, lambda i: rid[-8:], resamples)
    completion = out.completions[0]
    if sessions is not None:
        await sessions.keep(req.prompt_cache_key, ids + completion.token_ids, plan.params.adapter)
    body = response_object(req, rid, model, output_items(msg, rid), completion.finish_reason, out.usage,
                           reasoning_tokens(engine, msg))
    await _keep(req, store, plan, rid, body, messages, msg, ids, completion)
    return body


async def stream_response(engine, req: ResponsesRequest, model: str, store: ResponseStore, metrics,
                          started: float, done, close_objects: bool = True,
                          response_id: str | None = None) -> AsyncIterator[str]:
    """The typed event stream: response.created and .in_progress, then each output item added,
    its deltas (reasoning text, output text, call arguments) and done, then response.completed."""
    plan, messages = _plan(engine, req, store, close_objects)
    ids = _prompt_ids(plan)
    deltas = engine.stream(ids, plan.params)
    first = await _run(deltas.__anext__())
    rid = response_id or _response_id()
    metrics.first_token(time.perf_counter() - started)

    async def events() -> AsyncIterator[str]:
        items = ItemStream(plan, rid)
        status = 499
        try:
            start = response_object(req, rid, model, [], None, None, 0)
            yield items.event("response.created", response=start)
            yield items.event("response.in_progress", response=start)
            text = ""
            async for d in chain(first, deltas):
                text += d.text
                for event in items.grow(text):
                    yield event
                if d.finish_reason is not None:
                    try:
                        msg, _ = plan.message(d.completion, rid[-8:])
                    except APIError as e:
                        status = e.status
                        yield items.event("error", code=e.code, message=e.message, param=e.param)
                        return
                    final = output_items(msg, rid)
                    for event in items.finish(final):
                        yield event
                    body = response_object(req, rid, model, final, d.completion.finish_reason, d.usage,
                                           reasoning_tokens(engine, msg))
                    await _keep(req, store, plan, rid, body, messages, msg, ids, d.completion)
                    kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
                    yield items.event(kind, response=body)
                    status = 200
                    metrics.request_done("/v1/responses", 200, time.perf_counter() - started, body["usage"])
        finally:
            if status != 200:
                metrics.request_done("/v1/responses", status, time.perf_counter() - started)
            done()

    return events()


async def _keep(req: ResponsesRequest, store: ResponseStore, plan: ChatPlan, rid: str, body: dict,
                messages: list[dict], msg: dict, prompt_ids: list[int], completion) -> None:
    """Store the response with its conversation: the reply as the model wrote it (its reasoning block
    in its content, for the template to keep or drop as the model was trained), and its tokens, pinned
    and carried to the prompt of the response that continues it."""
    if not req.store:
        return
    carry = TokenCarry(plan.engine.tokenizer)
    carry.written(plan.prompt, prompt_ids, completion)
    content = msg.get("content") or ""
    if msg.get("reasoning_content") is not None:
        r = plan.reasoning
        content = r.open_text + msg["reasoning_content"] + r.close_text + content
    reply = {"role": "assistant", "content": content}
    if msg.get("tool_calls"):
        reply["tool_calls"] = msg["tool_calls"]
    await store.put(rid, Stored(body, messages + [reply], time.monotonic() + store.ttl_s,
                                tokens=prompt_ids + list(completion.token_ids), carry=carry,
                                adapter=plan.params.adapter),
                    req.previous_response_id)


def _prompt_ids(plan: ChatPlan) -> list[int]:
    """The prompt's tokens; chat's errors about max_tokens name the Responses field."""
    try:
        return plan.prompt_ids()
    except APIError as e:
        if e.param != "max_tokens":
            raise
        raise APIError(e.status, e.message.replace("max_tokens", "max_output_tokens"), "max_output_tokens") from None


def reasoning_tokens(engine, msg: dict) -> int:
    thought = msg.get("reasoning_content")
    return len(engine.tokenizer.encode(thought)) if thought else 0


def _response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"
