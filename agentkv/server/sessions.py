"""The clients' cache hints, honoured with pins that have a lifetime (engine/pin_leases.py).

- `prompt_cache_key` (OpenAI's, on chat and Responses requests): after each turn the session's whole
  conversation (the prompt and the reply, as the tokens the engine computed, or where the template
  writes the reply back in another form, the next turn's start: server/history.py) stays pinned for
  `ttl_s`, so the next turn starts from cache however much other traffic came between. One pin per
  session, moved to the longer conversation each turn; where the pin budget is full, the least
  recently used sessions give theirs up first.
- `cache_control` (Anthropic's, also taken on chat content parts and tools): the conversation's
  prefix up to the last marked system message or tool is pinned for `ttl_s` (each request through it
  renews it), as Anthropic keeps an ephemeral cache breakpoint.

A pin is a hint kept where it fits: a pin that does not fit the budget leaves the request served
as it would be without it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from agentkv.errors import CacheError, EngineClosedError, RequestError

MAX_SESSIONS = 4096


class Sessions:
    def __init__(self, engine, ttl_s: float = 300.0):
        self.engine, self.ttl_s = engine, ttl_s
        self._by_key: OrderedDict[str, Any] = OrderedDict()  # prompt_cache_key -> PinHandle, least recent first
        self._prefixes: dict[tuple, Any] = {}  # (adapter, a cache_control prefix) -> its PinHandle

    async def keep(self, key: str | None, ids: Sequence[int], adapter: str | None = None) -> None:
        """After a turn of session `key`: pin its conversation `ids` (prompt and reply; of LoRA `adapter`, whose
        KV is its own), for `ttl_s`."""
        if not key or not ids:
            return
        key = key if adapter is None else f"{adapter}\n{key}"  # (a session of each adapter: their KV differs)
        old = self._by_key.pop(key, None)
        handle = await self._pin(list(ids), adapter)
        if old is not None:
            await asyncio.to_thread(self.engine.unpin, old)
        if handle is not None:
            self._by_key[key] = handle
            while len(self._by_key) > MAX_SESSIONS:
                await asyncio.to_thread(self.engine.unpin, self._by_key.popitem(last=False)[1])

    async def hinted(self, messages: list[dict], tools: list[dict] | None, marked: int | None,
                     adapter: str | None = None) -> None:
        """Pin the conversation's prefix through message `marked` (with the tools; marked is -1 where
        only a tool carries the hint; of LoRA `adapter`), once per distinct prefix while its pin lives."""
        if marked is None:
            return
        head = messages[: marked + 1] if marked >= 0 else messages[:1]
        ids = tuple(await asyncio.to_thread(self.engine.conversation_prefix, head, tools=tools))
        key = (adapter, ids)
        held = self._prefixes.get(key)
        if held is not None and held.id in {p.id for p in await asyncio.to_thread(self.engine.pins)}:
            return  # alive, and this request renews it
        handle = await self._pin(list(ids), adapter)
        if handle is not None:
            self._prefixes[key] = handle

    def held(self) -> list[Any]:
        """The pins these hints hold now (each ends with its time to live)."""
        return [*self._by_key.values(), *self._prefixes.values()]

    async def _pin(self, ids: list[int], adapter: str | None = None):
        """A pin of `ids` (of `adapter`) for `ttl_s`, making room by ending the least recently used sessions'
        pins; None where it does not fit even so (or the engine keeps no cache)."""
        while True:
            try:
                return await asyncio.to_thread(lambda: self.engine.pin(ids, ttl_s=self.ttl_s, adapter=adapter))
            except (CacheError, RequestError, EngineClosedError):  # over the budget (or no cache): a hint
                if not self._by_key:
                    return None
                await asyncio.to_thread(self.engine.unpin, self._by_key.popitem(last=False)[1])


def marked_prefix(messages: list[dict], tools: list[dict] | None) -> int | None:
    """The index of the last system message with a `cache_control` part, -1 where only a tool has
    one, None where nothing is marked."""
    last = None
    for i, m in enumerate(messages):
        content = m.get("content")
        if m.get("role") in ("system", "developer") and (m.get("cache_control") or isinstance(content, list) and any(
                isinstance(p, dict) and p.get("cache_control") for p in content)):
            last = i
    if last is None and any(isinstance(t, dict) and t.get("cache_control") for t in tools or []):
        return -1
    return last
