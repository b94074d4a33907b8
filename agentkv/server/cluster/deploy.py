"""`agentkv serve --replicas N`: N engine replicas as a Ray Serve deployment, behind one ingress
that serves the same routes as a single engine (server/app.py over ClusterHandle).

The ingress checks the API key and model, validates each request (bad ones get their 400 there),
admits it (429 past `max_inflight`) and sends the OpenAI body to the engine deployment, which routes
with `CacheAwareRequestRouter`: a request goes to the replica whose radix tree holds its prefix
unless that replica is overloaded. Each replica answers with a LocalHandle, the single engine's
code, streams included. Pins follow their agents (the router keeps a pinned prefix's requests on
the pin's replica); a stored response is read and continued on the replica that stores it.

Without `ray_address`, Ray starts a local instance; with one, the deployment joins that cluster.
"""

import asyncio
import gc
import time
import uuid
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from agentkv.engine import Engine
from agentkv.server.anthropic import CountTokensRequest, MessagesRequest
from agentkv.server.app import create_app
from agentkv.server.cluster.handle import ClusterHandle
from agentkv.server.cluster.ray_router import PIN_ID, RESPONSE_ID, RESPONSE_OF, CacheAwareRequestRouter
from agentkv.server.handle import LocalHandle
from agentkv.server.metrics import Metrics
from agentkv.server.protocol import ChatRequest, CompletionRequest
from agentkv.server.responses_items import ResponsesRequest


@serve.deployment(
    ray_actor_options={"num_cpus": 0},  # the engine uses the cores; do not let Ray's CPU count hold replicas back
    max_ongoing_requests=256,
    request_router_config=RequestRouterConfig(request_router_class=CacheAwareRequestRouter),
)
class EngineReplica:
    """One engine behind a LocalHandle. Its methods take the OpenAI body (the router reads the prompt,
    and the keys that address a replica, from it)."""

    def __init__(self, model: str | None, model_name: str, options: dict[str, Any], close_objects: bool = True):
        self.engine = Engine(model, **options)
        gc.collect()
        gc.freeze()  # a replica's process is a server's: its long-lived heap out of full collections' way
        self.local = LocalHandle(self.engine, model_name, close_objects)
        self.tag = uuid.uuid4().hex[:8]
        self.local.id_prefix = f"pin-{self.tag}-"  # pin ids name their replica
        self.metrics = Metrics()  # (the ingress counts what it serves; a replica's own streams report here)

    async def chat(self, body: dict) -> dict:
        return await self.local.chat(ChatRequest.model_validate(body), body)

    async def completion(self, body: dict) -> dict:
        return await self.local.completion(CompletionRequest.model_validate(body), body)

    async def create_response(self, body: dict) -> dict:
        return await self.local.create_response(ResponsesRequest.model_validate(body), body, body[RESPONSE_ID])

    async def chat_stream(self, body: dict):
        async for event in await self.local.chat_stream(ChatRequest.model_validate(body), body, self.metrics,
                                                        time.perf_counter(), _nothing):
            yield event

    async def completion_stream(self, body: dict):
        async for event in await self.local.completion_stream(CompletionRequest.model_validate(body), body,
                                                              self.metrics, time.perf_counter(), _nothing):
            yield event

    async def stream_response(self, body: dict):
        async for event in await self.local.stream_response(ResponsesRequest.model_validate(body), body,
                                                            self.metrics, time.perf_counter(), _nothing,
                                                            body[RESPONSE_ID]):
            yield event

    async def message(self, body: dict) -> dict:
        return await self.local.message(MessagesRequest.model_validate(body), body)

    async def message_stream(self, body: dict):
        async for event in await self.local.message_stream(MessagesRequest.model_validate(body), body, self.metrics,
                                                           time.perf_counter(), _nothing):
            yield event

    async def count_tokens(self, body: dict) -> dict:
        return await self.local.count_tokens(CountTokensRequest.model_validate(body), body)

    async def get_response(self, body: dict) -> dict:
        return await self.local.get_response(body[RESPONSE_OF])

    async def delete_response(self, body: dict) -> None:
        await self.local.delete_response(body[RESPONSE_OF])

    async def pin(self, body: dict) -> dict:
        return await self.local.pin(ChatRequest.model_validate(body), body)

    async def unpin(self, body: dict) -> None:
        await self.local.unpin(body[PIN_ID])

    async def stats(self, body: dict) -> dict:
        return {"replica": self.tag, **await self.local.stats()}

    async def pins(self, body: dict) -> dict:
        """The ids of the pins this replica holds now (one whose time to live ran out is not among them)."""
        return {"replica": self.tag, "pins": [p["id"] for p in await asyncio.to_thread(self.local.pins)]}


def _nothing() -> None:
    pass


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)  # admission is the routes'
@serve.ingress()
class Ingress:
    """The routes of server/app.py over the replicas."""

    def __init__(self, engines, model_name: str, replicas: int, api_key: str | None, max_inflight: int,
                 close_objects: bool, loras: dict[str, str] | None = None):
        self._routes = create_app(ClusterHandle(engines, replicas, loras), model_name, api_key, max_inflight,
                                  close_objects)

    def __serve_build_asgi_app__(self):
        return self._routes


def build_app(model: str | None, model_name: str, replicas: int, api_key: str | None = None,
              engine_options: dict[str, Any] | None = None, close_objects: bool = True, max_inflight: int = 256):
    engines = EngineReplica.options(num_replicas=replicas).bind(model, model_name, engine_options or {},
                                                                close_objects)
    loras = dict((engine_options or {}).get("lora") or {})  # (each replica loads them: the routes list them)
    return Ingress.bind(engines, model_name, replicas, api_key, max_inflight, close_objects, loras)


def serve_cluster(model: str | None, model_name: str, replicas: int, host: str, port: int,
                  api_key: str | None = None, ray_address: str | None = None,
                  engine_options: dict[str, Any] | None = None, close_objects: bool = True,
                  max_inflight: int = 256) -> None:
    """Start (or join) Ray, deploy, and serve until interrupted."""
    import ray  # (the `ray` package; `ray.serve` is imported above)

    ray.init(address=ray_address, include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(model, model_name, replicas, api_key, engine_options, close_objects, max_inflight),
              name="agentkv", route_prefix="/")
    try:
        asyncio.run(_forever())
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


async def _forever() -> None:
    while True:
        await asyncio.sleep(3600)
