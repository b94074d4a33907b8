"""`agentkv serve --replicas N`: N engine replicas as a Ray Serve deployment, behind one ingress.

The ingress (one replica) checks the API key and model, validates each request (bad ones get their
400 here, as on a single engine), and forwards the OpenAI body to the engine deployment. That
deployment routes with `CacheAwareRequestRouter`, so a request goes to the replica whose radix tree
holds its prefix unless that replica is overloaded. Each engine replica answers with the same code
as the single-engine server (server/chat.py), streams included.

Pins follow their agents: POST /v1/pins goes through the router like a chat request with the same
messages and tools, the replica it lands on pins the prefix, and the router sends every request that
starts with that prefix to that replica from then on (and DELETE back to it).

Without `ray_address`, Ray starts a local instance; with one, the deployment joins that cluster.
"""

import asyncio
import functools
import gc
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig

import agentkv
from agentkv.engine import Engine
from agentkv.errors import AgentKVError
from agentkv.routing.ray_router import PIN, PIN_ID, CacheAwareRequestRouter
from agentkv.server.chat import (
    ChatPlan,
    chain,
    chat_completion,
    chat_stream,
)
from agentkv.server.completions import completion, completion_stream
from agentkv.server.metrics import Metrics
from agentkv.server.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    check_access,
    engine_error,
    json_object,
    model_card,
    read_json,
    validate,
)

ingress_app = FastAPI(title="agentkv", version=agentkv.__version__, docs_url=None, redoc_url=None)


# (defined before the deployments: Ray serializes a deployment's class, with the module globals it
# uses, when the decorator runs)
def _answers_errors(handler):
    """An ingress handler whose errors, raised here or in a replica (Ray re-raises those with the
    original as `.cause`), are answered in OpenAI's shape with their status."""

    @functools.wraps(handler)
    async def answered(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except Exception as e:
            e = getattr(e, "cause", None) or e
            if isinstance(e, AgentKVError):
                e = engine_error(e)
            if not isinstance(e, APIError):
                raise
            return JSONResponse(e.body(), status_code=e.status)

    return answered


@serve.deployment(
    ray_actor_options={"num_cpus": 0},  # the engine uses the cores; do not let Ray's CPU count hold replicas back
    max_ongoing_requests=256,
    request_router_config=RequestRouterConfig(request_router_class=CacheAwareRequestRouter),
)
class EngineReplica:
    """One engine. Its methods take the OpenAI body (the router reads the prompt from it)."""

    def __init__(self, model: str | None, model_name: str, options: dict[str, Any]):
        self.engine = Engine(model, **options)
        gc.collect()
        gc.freeze()  # a replica's process is a server's: its long-lived heap out of full collections' way
        self.model_name = model_name
        self.metrics = Metrics()
        self.tag = uuid.uuid4().hex[:8]  # pin ids name their replica
        self.pins: dict[str, Any] = {}  # pin id -> PinHandle

    async def chat(self, body: dict) -> dict:
        return await chat_completion(self.engine, ChatRequest.model_validate(body), self.model_name)

    async def completion(self, body: dict) -> dict:
        return await completion(self.engine, CompletionRequest.model_validate(body), self.model_name)

    async def chat_stream(self, body: dict):
        events = await chat_stream(self.engine, ChatRequest.model_validate(body), self.model_name, self.metrics,
                                   time.perf_counter(), lambda: None)
        async for event in events:
            yield event

    async def completion_stream(self, body: dict):
        events = await completion_stream(self.engine, CompletionRequest.model_validate(body), self.model_name,
                                         self.metrics, time.perf_counter(), lambda: None)
        async for event in events:
            yield event

    async def pin(self, body: dict) -> dict:
        """Pin the prefix every conversation with these messages and tools starts with (`PIN` in
        the body tells the router to keep that prefix's requests here)."""
        plan = ChatPlan(self.engine, ChatRequest.model_validate(body))
        ids = self.engine.conversation_prefix(plan.messages, tools=plan.template_tools)
        handle = await asyncio.to_thread(self.engine.pin, ids)
        pin_id = f"pin-{self.tag}-{handle.id}"
        self.pins[pin_id] = handle
        return {"id": pin_id, "object": "pin", "tokens": len(ids)}

    async def unpin(self, body: dict) -> dict:
        handle = self.pins.pop(body[PIN_ID], None)
        if handle is None:
            raise APIError(404, f"no pin {body[PIN_ID]!r} on this replica; GET /v1/pins lists them", "pin_id",
                           code="pin_not_found")
        await asyncio.to_thread(self.engine.unpin, handle)
        return {"id": body[PIN_ID], "object": "pin", "deleted": True}

    def stats(self) -> dict:
        return self.engine.stats()


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(ingress_app)
class Ingress:
    def __init__(self, engines, model_name: str, api_key: str | None, close_objects: bool = True):
        self.engines, self.model_name, self.api_key = engines, model_name, api_key
        self.close_objects = close_objects  # the default of chat requests' close_objects
        self.created = int(time.time())
        self.pins: dict[str, tuple[dict, int]] = {}  # pin id -> (the body it was made from, tokens)

    def _check(self, request: Request, body: dict | None = None) -> None:
        check_access(request.headers.get("authorization"), body, self.api_key, self.model_name)

    async def _body(self, request: Request, kind, default: dict | None = None) -> tuple[dict, Any]:
        """The JSON body, checked (key, model) and validated as `kind`; APIError otherwise."""
        raw = await read_json(request) if await request.body() or default is None else {}
        body = {**(default or {}), **json_object(raw)}
        if kind is ChatRequest:
            body = {"close_objects": self.close_objects, **body}
        self._check(request, body)
        return body, validate(kind, body)

    @ingress_app.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @ingress_app.get("/v1/models")
    @_answers_errors
    async def models(self, request: Request) -> Any:
        self._check(request)
        return {"object": "list", "data": [model_card(self.model_name, self.created)]}

    @ingress_app.get("/v1/models/{name}")
    @_answers_errors
    async def model(self, name: str, request: Request) -> Any:
        self._check(request, {"model": name})
        return model_card(self.model_name, self.created)

    @ingress_app.post("/v1/chat/completions")
    @_answers_errors
    async def chat(self, request: Request) -> Any:
        return await self._forward(request, ChatRequest, "chat")

    @ingress_app.post("/v1/completions")
    @_answers_errors
    async def completions(self, request: Request) -> Any:
        return await self._forward(request, CompletionRequest, "completion")

    async def _forward(self, request: Request, kind, method: str) -> Any:
        body, req = await self._body(request, kind)
        if not req.stream:
            return await getattr(self.engines, method).remote(body)
        events = getattr(self.engines.options(stream=True), method + "_stream").remote(body)
        first = await events.__anext__()  # errors before the stream starts keep their HTTP status
        return StreamingResponse(chain(first, events), media_type="text/event-stream")

    @ingress_app.post("/v1/pins")
    @_answers_errors
    async def pin(self, request: Request) -> Any:
        body, _ = await self._body(request, ChatRequest, default={"model": self.model_name})
        out = await self.engines.pin.remote({**body, PIN: "create"})
        self.pins[out["id"]] = (body, out["tokens"])
        return out

    @ingress_app.get("/v1/pins")
    @_answers_errors
    async def list_pins(self, request: Request) -> Any:
        self._check(request)
        return {"object": "list", "data": [{"id": k, "object": "pin", "tokens": n} for k, (_, n) in self.pins.items()]}

    @ingress_app.delete("/v1/pins/{pin_id}")
    @_answers_errors
    async def unpin(self, pin_id: str, request: Request) -> Any:
        self._check(request)
        if pin_id not in self.pins:
            raise APIError(404, f"no pin {pin_id!r}; GET /v1/pins lists them", "pin_id", code="pin_not_found")
        body, _ = self.pins[pin_id]
        out = await self.engines.unpin.remote({**body, PIN: "delete", PIN_ID: pin_id})  # routed to the pin
        del self.pins[pin_id]
        return out


def build_app(model: str | None, model_name: str, replicas: int, api_key: str | None = None,
              engine_options: dict[str, Any] | None = None, close_objects: bool = True):
    engines = EngineReplica.options(num_replicas=replicas).bind(model, model_name, engine_options or {})
    return Ingress.bind(engines, model_name, api_key, close_objects)


def serve_cluster(model: str | None, model_name: str, replicas: int, host: str, port: int,
                  api_key: str | None = None, ray_address: str | None = None,
                  engine_options: dict[str, Any] | None = None, close_objects: bool = True) -> None:
    """Start (or join) Ray, deploy, and serve until interrupted."""
    import ray

    ray.init(address=ray_address, include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(model, model_name, replicas, api_key, engine_options, close_objects), name="agentkv",
              route_prefix="/")
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
