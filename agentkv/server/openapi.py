"""What the server publishes at /openapi.json: the request bodies as clients send them and every
answer a route gives, so that a fuzzer (schemathesis, tests/server/test_server_fuzz.py) knows the fields.

The handlers read raw JSON and check it themselves (protocol.py), for errors in OpenAI's shape; the
document describes the same bodies: the roles and content parts a message takes, the ranges
SamplingParams accepts, and `model` as the one name this server serves.
"""

from __future__ import annotations

from typing import Any

from agentkv.server.protocol import ChatRequest

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "arguments"],
                 "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]},
    "name": {"type": "string"},
    "tool_calls": {"type": "array", "items": _CALL},
    "tool_call_id": {"type": "string"},
}}
TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "description": {"type": "string"},
        "parameters": {"type": "object"}, "strict": {"type": "boolean"}}}}}
# The ranges SamplingParams takes (a value outside is a 400 naming the field).
RANGES = {
    "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 64},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "top_k": {"type": "integer", "minimum": 0}, "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "max_reasoning_tokens": {"type": "integer", "minimum": 1},
    "max_output_tokens": {"type": "integer", "minimum": 1},
    "number_digits": {"type": ["integer", "null"], "minimum": 1},
    "json_style": {"enum": ["compact", "spaced", "model", None]},
}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_STATUSES = [
    (400, "a field to change (named in error.param)"), (401, "a missing or wrong API key"),
    (404, "another model, or an unknown pin"), (413, "a prompt over the context, or a body over its limit"),
    (429, "more requests in flight than --max-inflight"),
    (422, "an output that failed a keyword its grammar relaxed, after its resamples (invalid_model_output: "
          "error.output, error.keyword, error.pointer)"),
    (503, "the engine is shutting down")]
ERRORS = {status: {"description": what, "content": {"application/json": {"schema": ERROR}}}
          for status, what in _STATUSES}
# Anthropic's routes (/v1/messages): its message and block shapes, its error shape
_BLOCK = {"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["text", "tool_use", "tool_result", "thinking"]}, "text": {"type": "string"},
    "id": {"type": "string"}, "name": {"type": "string"}, "input": {"type": "object"},
    "tool_use_id": {"type": "string"}, "content": {"type": "string"}, "is_error": {"type": "boolean"},
    "thinking": {"type": "string"}}}
ANTHROPIC_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"enum": ["user", "assistant"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]}}}
ANTHROPIC_TOOL = {"type": "object", "required": ["name", "input_schema"], "properties": {
    "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "description": {"type": "string"},
    "input_schema": {"type": "object"}}}
ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                          "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}
ANTHROPIC_ERRORS = {status: {"description": what, "content": {"application/json": {"schema": ANTHROPIC_ERROR}}}
                    for status, what in _STATUSES}


def generation_doc(kind: type, model_name: str, streams: bool) -> dict[str, Any]:
    """`openapi_extra` and `responses` of a generation route taking `kind` (a protocol.py request)."""
    schema = kind.model_json_schema()
    props = schema["properties"]
    props["model"] = {"type": "string", "enum": [model_name]}
    for name, rng in RANGES.items():
        if name in props:
            nullable = any(b.get("type") == "null" for b in props[name].get("anyOf", ()))
            props[name] = {"anyOf": [rng, {"type": "null"}]} if nullable else rng
    if kind is ChatRequest:
        props["messages"] = {"type": "array", "items": MESSAGE, "minItems": 1}
        props["tools"] = {"anyOf": [{"type": "array", "items": TOOL}, {"type": "null"}]}
    if kind.__name__ == "ResponsesRequest":
        props["input"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
    anthropic = kind.__name__ in ("MessagesRequest", "CountTokensRequest")
    if anthropic:
        props["messages"] = {"type": "array", "items": ANTHROPIC_MESSAGE, "minItems": 1}
        props["tools"] = {"anyOf": [{"type": "array", "items": ANTHROPIC_TOOL}, {"type": "null"}]}
    required = {"ResponsesRequest": ["id", "object", "output"], "MessagesRequest": ["id", "type", "content"],
                "CountTokensRequest": ["input_tokens"]}.get(kind.__name__, ["id", "object", "choices"])
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object", "required": required}}}
    if streams:
        # one event as the OpenAPI spec's generic text/event-stream schema has it (schemathesis checks
        # each parsed event against it); `data` is a JSON chunk, or `[DONE]`
        ok["text/event-stream"] = {"schema": {"type": "object", "required": ["data"], "properties": {
            "data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
            "retry": {"type": "integer"}}}}
    extra = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
    errors = ANTHROPIC_ERRORS if anthropic else ERRORS
    return {"openapi_extra": extra, "responses": {200: {"description": "the completion", "content": ok}, **errors}}


def pin_doc(model_name: str) -> dict[str, Any]:
    body = generation_doc(ChatRequest, model_name, streams=False)
    return {"openapi_extra": body["openapi_extra"], "responses": {
        200: {"description": "the pin", "content": {"application/json": {"schema": {
            "type": "object", "required": ["id", "object", "tokens"]}}}}, **ERRORS}}

