"""The OpenAI-compatible HTTP app: routes, the API key, errors in OpenAI's shape.

    app = create_app(engine, model_name="smollm2", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)            # what `agentkv serve` does

One engine serves every request; handlers are async and await the engine thread, so the event loop
keeps accepting while requests run. A client that disconnects mid-stream aborts its request, which
frees its KV.
"""

import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from agentkv.errors import AgentKVError, EngineClosedError, RequestError
from agentkv.server.chat import chat_completion, chat_stream, completion
from agentkv.server.protocol import APIError, ChatRequest, CompletionRequest


def create_app(engine, model_name: str, api_key: str | None = None) -> FastAPI:
    # (no `from __future__ import annotations` here: FastAPI reads the handlers' annotations at runtime)
    app = FastAPI(title="agentkv", version="0.1.0", docs_url=None, redoc_url=None)
    created = int(time.time())

    def check(request: Request, body: dict | None = None) -> None:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key: send Authorization: Bearer <key>", None,
                           "authentication_error", "invalid_api_key")
        if body is not None and body.get("model") not in (model_name, None):
            raise APIError(404, f"the model {body.get('model')!r} does not exist; this server serves {model_name!r}",
                           "model", "invalid_request_error", "model_not_found")

    async def parse(request: Request, kind):
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "the request body is not valid JSON") from None
        if not isinstance(raw, dict):
            raise APIError(400, "the request body must be a JSON object")
        check(request, raw)
        from pydantic import ValidationError

        try:
            return kind.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            raise APIError(400, f"{'.'.join(map(str, err['loc']))}: {err['msg']}",
                           ".".join(map(str, err["loc"]))) from None

    @app.exception_handler(APIError)
    async def api_error(_request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, e: RequestValidationError):
        err = e.errors()[0]
        return JSONResponse(APIError(400, err["msg"], ".".join(map(str, err["loc"]))).body(), status_code=400)

    @app.exception_handler(AgentKVError)
    async def engine_error(_request, e: AgentKVError):
        if isinstance(e, RequestError):
            return JSONResponse(APIError(400, str(e)).body(), status_code=400)
        status = 503 if isinstance(e, EngineClosedError) else 500
        return JSONResponse(APIError(status, str(e), type="server_error").body(), status_code=status)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        check(request)
        return {"object": "list", "data": [_model(model_name, created)]}

    @app.get("/v1/models/{name}")
    async def model(name: str, request: Request) -> dict:
        check(request, {"model": name})
        return _model(model_name, created)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req = await parse(request, ChatRequest)
        if req.stream:
            return StreamingResponse(await chat_stream(engine, req, model_name), media_type="text/event-stream")
        return await chat_completion(engine, req, model_name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = await parse(request, CompletionRequest)
        if req.stream:
            raise APIError(400, "stream is not supported on /v1/completions yet; use /v1/chat/completions", "stream")
        return await completion(engine, req, model_name)

    return app


def _model(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "agentkv"}
