"""The routes' engine handle over Ray Serve replicas (deploy.py's EngineReplica): each request's
OpenAI body goes to the replica the cache-aware router picks (ray_router.py), with the keys that
address a replica where only one can answer: a pin's, a stored response's (its reads and its
continuations go where it is stored), or one replica's stats.

Errors raised in a replica come back as the error they were (Ray wraps them, with the original as
`.cause`), so they keep their HTTP status and OpenAI shape. A stream's metrics are taken here, as
its events pass through: time to first event, time between events, its usage where it ends.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agentkv.errors import AgentKVError
from agentkv.server.chat import chain
from agentkv.server.cluster.ray_router import PIN, PIN_ID, REPLICA, RESPONSE_ID, RESPONSE_OF
from agentkv.server.metrics import ENGINE_GAUGE_KEYS, Metrics
from agentkv.server.protocol import APIError, no_pin

# the engine gauges /metrics shows, added up over the replicas (the hit rate is their mean)
_SUMMED = tuple(key for key in ENGINE_GAUGE_KEYS if key != "cache_hit_rate")


class ClusterHandle:
    def __init__(self, engines: Any, replicas: int, loras: dict[str, str] | None = None):
        self.engines, self.replicas = engines, replicas  # a DeploymentHandle of EngineReplica
        self._pins: dict[str, tuple[dict, int]] = {}  # pin id -> (the body it was made from, tokens)
        self.loras = dict(loras or {})  # the LoRA adapters every replica loaded at start: name -> files

    async def chat(self, req, body: dict) -> dict:
        return await _answer(self.engines.chat.remote(body))

    async def chat_stream(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await self._stream("chat_stream", body, "/v1/chat/completions", metrics, started, done)

    async def completion(self, req, body: dict) -> dict:
        return await _answer(self.engines.completion.remote(body))

    async def completion_stream(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await self._stream("completion_stream", body, "/v1/completions", metrics, started, done)

    async def create_response(self, req, body: dict) -> dict:
        return await _answer(self.engines.create_response.remote(_response_body(req, body)))

    async def stream_response(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await self._stream("stream_response", _response_body(req, body), "/v1/responses", metrics, started,
                                  done)

    async def message(self, req, body: dict) -> dict:
        return await _answer(self.engines.message.remote(body))

    async def message_stream(self, req, body, metrics, started, done) -> AsyncIterator[str]:
        return await self._stream("message_stream", body, "/v1/messages", metrics, started, done)

    async def count_tokens(self, req, body: dict) -> dict:
        return await _answer(self.engines.count_tokens.remote(body))

    async def get_response(self, response_id: str) -> dict:
        return await _answer(self.engines.get_response.remote({RESPONSE_OF: response_id}))

    async def delete_response(self, response_id: str) -> None:
        await _answer(self.engines.delete_response.remote({RESPONSE_OF: response_id}))

    async def pin(self, req, body: dict) -> dict:
        """The router sends the body like a chat request with the same messages and tools; the replica
        it lands on pins the prefix, and the router keeps that prefix's requests there from now on."""
        out = await _answer(self.engines.pin.remote({**body, PIN: "create"}))
        self._pins[out["id"]] = (body, out["tokens"])
        return out

    async def unpin(self, pin_id: str) -> None:
        if pin_id not in self._pins:
            raise no_pin(pin_id)
        body, _ = self._pins[pin_id]
        await _answer(self.engines.unpin.remote({**body, PIN: "delete", PIN_ID: pin_id}))  # routed to the pin
        del self._pins[pin_id]

    def pins(self) -> list[dict]:
        """The pins made here that their replicas still hold: each replica, asked by index (on the
        route's worker thread), names its live pins, and a pin of a replica that answered and no longer
        holds it (its time to live ran out there) is dropped."""
        answers = [self.engines.pins.remote({REPLICA: i}).result() for i in range(self.replicas)]
        live = {a["replica"]: set(a["pins"]) for a in answers}
        self._pins = {k: v for k, v in self._pins.items()
                      if not (_replica_of(k) in live and k not in live[_replica_of(k)])}
        return [{"id": k, "object": "pin", "tokens": n} for k, (_, n) in self._pins.items()]

    def adapters(self) -> list[dict]:
        return [{"id": name, "root": path} for name, path in self.loras.items()]

    async def load_lora(self, name: str, path: str) -> None:
        raise APIError(400, "loading LoRA adapters at run time is not supported with --replicas yet (each replica "
                            "holds its own); give them with --lora at start", None, code="runtime_lora_off")

    async def unload_lora(self, name: str) -> None:
        await self.load_lora(name, "")

    async def stats(self) -> dict:
        """Every replica's stats, asked of each by index: counts summed, the cache hit rate the
        replicas' mean."""
        got = await asyncio.gather(*(_answer(self.engines.stats.remote({REPLICA: i})) for i in range(self.replicas)))
        by_replica = {s["replica"]: s for s in got}.values()  # (a replica answers once, whatever it was asked)
        out: dict[str, Any] = {k: sum(s.get(k, 0) for s in by_replica) for k in _SUMMED}
        out["cache_hit_rate"] = sum(s.get("cache_hit_rate", 0.0) for s in by_replica) / max(len(by_replica), 1)
        out["replicas"] = len(by_replica)
        return out

    async def _stream(self, method: str, body: dict, endpoint: str, metrics: Metrics, started: float,
                      done: Callable[[], None]) -> AsyncIterator[str]:
        events = getattr(self.engines.options(stream=True), method).remote(body)
        first = await _answer(events.__anext__())  # errors before the stream starts keep their HTTP status
        metrics.first_token(time.perf_counter() - started)

        async def relayed() -> AsyncIterator[str]:
            status, usage, last = 499, None, time.perf_counter()  # 499: the client went away (as nginx logs it)
            try:
                async for event in chain(first, events):
                    now = time.perf_counter()
                    if event is not first:
                        metrics.between_tokens(now - last, 1)
                    last = now
                    if '"usage"' in event or '"error"' in event:
                        data = _data(event)
                        usage = data.get("usage") or (data.get("response") or {}).get("usage") or usage
                        if "error" in data or data.get("type") == "error":
                            status = 500
                    yield event
                status = 200 if status == 499 else status
            finally:
                metrics.request_done(endpoint, status, time.perf_counter() - started, usage if status == 200 else None)
                done()

        return relayed()


def _response_body(req, body: dict) -> dict:
    """The body of a response: the id it is stored under (chosen here, so the router learns where
    it is stored), and the stored response it continues."""
    out = {**body, RESPONSE_ID: f"resp_{uuid.uuid4().hex}"}
    if req.previous_response_id:
        out[RESPONSE_OF] = req.previous_response_id
    return out


async def _answer(call: Awaitable) -> Any:
    """A replica's answer; an error it raised, as itself (Ray wraps it, with the original as `.cause`)."""
    try:
        return await call
    except (APIError, AgentKVError, StopAsyncIteration):
        raise
    except Exception as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, (APIError, AgentKVError)):
            raise cause from None
        raise


def _data(event: str) -> dict:
    """The JSON of a server-sent event's data line ({} where it has none)."""
    for line in event.splitlines():
        if line.startswith("data: ") and line[6:].startswith("{"):
            try:
                return json.loads(line[6:])
            except json.JSONDecodeError:
                return {}
    return {}


def _replica_of(pin_id: str) -> str:
    """The tag of the replica a pin id names (deploy.EngineReplica: "pin-<tag>-<n>")."""
    return pin_id.split("-")[1] if pin_id.count("-") >= 2 else ""
