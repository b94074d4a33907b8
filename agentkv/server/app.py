"""The OpenAI-compatible HTTP app: one route table over an engine handle (server/handle.py).

    app = create_app(engine, model_name="smollm2", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)            # what `agentkv serve` does

The routes own the HTTP contract, the same over one engine and over a cluster's replicas: the API
key, the model check, body limits, admission (429 past `max_inflight`), errors in OpenAI's shape and
/metrics. Handlers are async and await the engine, so the event loop keeps accepting while requests
run. A client that disconnects mid-stream aborts its request, which frees its KV.
"""

import asyncio
import contextlib
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

import agentkv
from agentkv.errors import AgentKVError
from agentkv.server.anthropic import CountTokensRequest, MessagesRequest, error_body
from agentkv.server.handle import LocalHandle
from agentkv.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from agentkv.server.metrics import Metrics
from agentkv.server.openapi import ERRORS, generation_doc, pin_doc
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
from agentkv.server.responses_items import ResponsesRequest


def create_app(engine, model_name: str, api_key: str | None = None, max_inflight: int = 256,
               close_objects: bool = True, stored_responses: int = 1024, response_ttl_s: float = 3600.0,
               resamples: int = 2, session_ttl_s: float = 300.0, owns_engine: bool = False,
               state_dir: str | None = None, allow_runtime_lora: bool = False) -> FastAPI:
    """`engine`: an Engine, or an EngineHandle (a cluster's replicas). `max_inflight`: requests
    accepted at once (running, queued, streaming); more get a 429. `close_objects`: the default of a
    chat request's `close_objects` (schemas' objects closed where they leave additionalProperties
    unset). `stored_responses`, `response_ttl_s`: how many /v1/responses an engine keeps for
    `previous_response_id`, and for how long (their tokens pinned). `resamples`: how many times an
    output that fails a keyword its grammar relaxed is generated again before the 422. `session_ttl_s`:
    how long a prompt_cache_key session's conversation, or a cache_control prefix, stays pinned
    after its last request (server/sessions.py). `owns_engine`: the engine is closed as the server
    shuts down (`agentkv serve`: on SIGTERM / SIGINT its KV pool is written to its disk tier then, before
    uvicorn re-raises the signal that stopped it and the process ends). `state_dir`: stored responses kept
    there (SQLite, server/state.py), so `previous_response_id` works across a restart. A request's `model`
    is the base model's name or a loaded LoRA adapter's (vLLM's convention); `allow_runtime_lora` opens
    POST /v1/load_lora_adapter and /v1/unload_lora_adapter."""
    # (no `from __future__ import annotations` here: FastAPI reads the handlers' annotations at runtime)
    handle = engine if hasattr(engine, "chat_stream") else LocalHandle(engine, model_name, close_objects,
                                                                       stored_responses, response_ttl_s, resamples,
                                                                       session_ttl_s, state_dir)
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        if owns_engine:
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="agentkv", version=agentkv.__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.handle = handle
    created = int(time.time())
    metrics = Metrics()
    inflight = [0]

    def admit() -> None:
        if inflight[0] >= max_inflight:
            raise APIError(429, f"the server is at capacity ({max_inflight} requests in flight); retry shortly",
                           None, "rate_limit_error", "server_busy")
        inflight[0] += 1

    def release() -> None:
        inflight[0] -= 1

    def check(request: Request, body: dict | None = None) -> None:
        key = request.headers.get("x-api-key")  # Anthropic's clients send the key so
        check_access(request.headers.get("authorization") or (f"Bearer {key}" if key else None), body, api_key,
                     model_name, lambda: [c["id"] for c in handle.adapters()])

    async def parse(request: Request, kind) -> tuple[dict, Any]:
        return await parse_dict(request, await read_json(request), kind)

    async def parse_dict(request: Request, raw: Any, kind) -> tuple[dict, Any]:
        """(the body, checked and with its defaults, as a replica is sent it; the validated request)"""
        body = json_object(raw)
        check(request, body)
        if kind is ChatRequest:
            body = {"close_objects": close_objects, **body}
        return body, validate(kind, body)

    def failed(request: Request, status: int) -> None:
        # counted by the route's template (`/v1/models/{name}`), never by the path a client made up:
        # each made-up path would be one more series in /metrics, for ever
        route = request.scope.get("route")
        if request.url.path.startswith("/v1/"):
            metrics.request_done(route.path if route is not None else "/v1/(no such route)", status, 0.0)

    def answer(request: Request, e: APIError) -> JSONResponse:
        """The error in the shape of the API the route serves: Anthropic's under /v1/messages."""
        failed(request, e.status)
        anthropic = request.url.path.startswith("/v1/messages")
        return JSONResponse(error_body(e) if anthropic else e.body(), status_code=e.status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return answer(request, e)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        err = e.errors()[0]
        return answer(request, APIError(400, err["msg"], ".".join(map(str, err["loc"]))))

    @app.exception_handler(AgentKVError)
    async def on_engine_error(request: Request, e: AgentKVError):
        return answer(request, engine_error(e))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    def cards() -> list[dict]:
        return [model_card(model_name, created)] + [model_card(c["id"], created, model_name, c["root"])
                                                     for c in handle.adapters()]

    @app.get("/v1/models", responses=ERRORS)
    async def models(request: Request) -> dict:
        check(request)
        return {"object": "list", "data": cards()}

    @app.get("/v1/models/{name}", responses=ERRORS)
    async def model(name: str, request: Request) -> dict:
        check(request, {"model": name})
        return next(c for c in cards() if c["id"] == name)

    # ---- LoRA adapters at run time (vLLM's routes), only where the server was started to allow it ----

    def runtime_lora(request: Request, raw: Any, fields: tuple[str, ...]) -> dict:
        check(request)
        if not allow_runtime_lora:
            raise APIError(404, "loading and unloading LoRA adapters at run time is off; start the server with "
                                "--allow-runtime-lora", None, code="runtime_lora_off")
        body = json_object(raw)
        for f in fields:
            if not isinstance(body.get(f), str) or not body[f]:
                raise APIError(400, f"{f} must be a non-empty string", f)
        return body

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=ERRORS)
    async def load_lora(request: Request) -> PlainTextResponse:
        body = runtime_lora(request, await read_json(request), ("lora_name", "lora_path"))
        if body["lora_name"] == model_name:
            raise APIError(400, f"{model_name!r} is the base model's name; load the adapter under another",
                           "lora_name")
        await handle.load_lora(body["lora_name"], body["lora_path"])
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=ERRORS)
    async def unload_lora(request: Request) -> PlainTextResponse:
        body = runtime_lora(request, await read_json(request), ("lora_name",))
        await handle.unload_lora(body["lora_name"])
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics_text() -> PlainTextResponse:
        stats = {**await handle.stats(), "inflight": inflight[0]}
        return PlainTextResponse(metrics.render(stats), media_type=METRICS_CONTENT_TYPE)

    async def generation(request: Request, kind, endpoint: str, respond, stream) -> Any:
        """Parse, admit (429 past max_inflight), run; a stream releases its slot when it ends."""
        started = time.perf_counter()
        body, req = await parse(request, kind)
        admit()
        try:
            if req.stream:
                events = await stream(req, body, metrics, started, release)
                return StreamingResponse(events, media_type="text/event-stream")
            out = await respond(req, body)
        except BaseException:
            release()
            raise
        release()
        metrics.request_done(endpoint, 200, time.perf_counter() - started, out["usage"])
        return out

    @app.post("/v1/chat/completions", **generation_doc(ChatRequest, model_name, streams=True))
    async def chat(request: Request) -> Any:
        return await generation(request, ChatRequest, "/v1/chat/completions", handle.chat, handle.chat_stream)

    @app.post("/v1/completions", **generation_doc(CompletionRequest, model_name, streams=True))
    async def completions(request: Request) -> Any:
        return await generation(request, CompletionRequest, "/v1/completions", handle.completion,
                                handle.completion_stream)

    @app.post("/v1/responses", **generation_doc(ResponsesRequest, model_name, streams=True))
    async def create(request: Request) -> Any:
        return await generation(request, ResponsesRequest, "/v1/responses", handle.create_response,
                                handle.stream_response)

    @app.post("/v1/messages", **generation_doc(MessagesRequest, model_name, streams=True))
    async def messages(request: Request) -> Any:
        return await generation(request, MessagesRequest, "/v1/messages", handle.message, handle.message_stream)

    @app.post("/v1/messages/count_tokens", **generation_doc(CountTokensRequest, model_name, streams=False))
    async def count_tokens(request: Request) -> dict:
        body, req = await parse(request, CountTokensRequest)
        return await handle.count_tokens(req, body)

    @app.get("/v1/responses/{response_id}", responses=ERRORS)
    async def get_response(response_id: str, request: Request) -> dict:
        check(request)
        return await handle.get_response(response_id)

    @app.delete("/v1/responses/{response_id}", responses=ERRORS)
    async def delete_response(response_id: str, request: Request) -> dict:
        check(request)
        await handle.delete_response(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    # ---- pins: keep a system prompt + tool definitions resident for the requests that start with it ----

    @app.post("/v1/pins", **pin_doc(model_name))
    async def pin(request: Request) -> dict:
        raw = await read_json(request) if await request.body() else {}
        raw = {"model": model_name, **raw} if isinstance(raw, dict) else raw
        body, req = await parse_dict(request, raw, ChatRequest)
        return await handle.pin(req, body)

    @app.get("/v1/pins", responses=ERRORS)
    async def list_pins(request: Request) -> dict:
        check(request)
        # (off the event loop: a local engine answers between its steps)
        return {"object": "list", "data": await asyncio.to_thread(handle.pins)}

    @app.delete("/v1/pins/{pin_id}", responses=ERRORS)
    async def unpin(pin_id: str, request: Request) -> dict:
        check(request)
        await handle.unpin(pin_id)
        return {"id": pin_id, "object": "pin", "deleted": True}

    return app
