"""The Responses API's shapes: its request body, its input items as chat messages (what chat.py
plans), and a chat reply as output items (reasoning, message, function calls) inside a response
object, as OpenAI's clients read them."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agentkv.grammar.schema.numbers import NUMBER_DIGITS
from agentkv.server.protocol import APIError, ChatRequest, text_content, validate

TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = None  # a session: its conversation stays pinned between turns (sessions.py)
    # extensions, as for chat (docs/structured.md: budget closing, the number bound, the JSON style)
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_reasoning_tokens: int | None = None
    budget_closing: bool = True
    number_digits: int | None = NUMBER_DIGITS
    json_style: Literal["compact", "spaced", "model"] | None = None

    def check_limits(self) -> None:
        """(chat's limits are checked on the chat request this becomes)"""


def conversation(items: str | list[dict]) -> list[dict]:
    """Input items as chat messages: messages by role, function calls as an assistant's tool_calls
    (consecutive ones in one message), their outputs as tool messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise APIError(400, "each input item must be an object", f"input[{i}]")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(
                {"role": item.get("role"),
                 "content": text_content(item.get("content"), f"input[{i}].content", TEXT_PARTS)}
            )
        elif kind == "function_call":
            call = {"id": item.get("call_id", ""), "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output
                    if isinstance(output, str)
                    else text_content(output, f"input[{i}].output", TEXT_PARTS),
                }
            )
        elif kind == "reasoning":
            continue  # a client sending back our reasoning: the conversation already has it, or drops it
        else:
            raise APIError(400, f"input[{i}].type {kind!r} is not supported; send message, function_call, "
                                "function_call_output or reasoning items", f"input[{i}].type")
    return out


def chat_body(req: ResponsesRequest, messages: list[dict], close_objects: bool) -> ChatRequest:
    """The chat request that plans this response: instructions first, tools and formats translated."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {"model": req.model or "", "messages": system + messages,
                            "parallel_tool_calls": req.parallel_tool_calls, "close_objects": close_objects,
                            "budget_closing": req.budget_closing, "number_digits": req.number_digits,
                            "json_style": req.json_style}
    if not body["messages"]:
        raise APIError(400, "input is empty; give a message", "input")
    if req.tools:
        body["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
    if isinstance(req.tool_choice, dict):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.get("name")}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = (req.text or {}).get("format")
    if fmt:
        body["response_format"] = _chat_format(fmt)
    for ours, theirs in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature), ("top_p", req.top_p),
                         ("seed", req.seed), ("chat_template_kwargs", req.chat_template_kwargs),
                         ("max_reasoning_tokens", req.max_reasoning_tokens),
                         ("prompt_cache_key", req.prompt_cache_key)):
        if theirs is not None:
            body[ours] = theirs
    return validate(ChatRequest, body)  # (its 400s are named in the Responses API's terms by the caller)


def responses_names(text: str) -> str:
    """Chat's field names in `text` as the Responses API names them."""
    for chat, responses in (("response_format.json_schema.", "text.format."), ("response_format", "text.format"),
                            ("max_tokens", "max_output_tokens"), ("messages", "input")):
        text = text.replace(chat, responses)
    return text


def _chat_tool(tool: dict, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise APIError(400, f"tools[{i}]: only function tools are supported, not {kind!r}", f"tools[{i}].type")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def _chat_format(fmt: dict) -> dict:
    kind = fmt.get("type")
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    if kind in ("json_object", "text"):
        return {"type": kind}
    if kind == "structural_tag":
        return {k: fmt[k] for k in ("type", "structures", "triggers") if k in fmt}
    raise APIError(400, f"text.format.type must be text, json_object, json_schema or structural_tag, not {kind!r}",
                   "text.format.type")


def output_items(msg: dict, rid: str) -> list[dict]:
    """A chat reply as output items: its reasoning, its text (where it has text, or nothing else),
    its calls. Ids follow from the response's, so a stream's items and the final ones agree. A call
    max_tokens cut (budget closing off) is "incomplete", its arguments as far as they were written."""
    key = rid.removeprefix("resp_")
    items: list[dict] = []
    if msg.get("reasoning_content") is not None:
        items.append(reasoning_item(key, msg["reasoning_content"]))
    calls = msg.get("tool_calls") or []
    if msg.get("content") or not calls:
        items.append(message_item(key, msg.get("content") or ""))
    items.extend(call_item(key, k, c["id"], c["function"]["name"], c["function"]["arguments"],
                           "completed" if _whole(c["function"]["arguments"]) else "incomplete")
                 for k, c in enumerate(calls))
    return items


def _whole(arguments: str) -> bool:
    try:
        json.loads(arguments)
    except json.JSONDecodeError:
        return False
    return True


def reasoning_item(key: str, text: str) -> dict:
    return {"type": "reasoning", "id": f"rs_{key}", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(key: str, text: str, status: str = "completed") -> dict:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else [])
    return {"type": "message", "id": f"msg_{key}", "role": "assistant", "status": status, "content": content}


def call_item(key: str, k: int, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": f"fc_{key}_{k}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_object(req: ResponsesRequest, rid: str, model: str, output: list[dict], finish: str | None, usage,
                    reasoning_tokens: int) -> dict:
    """The response; `finish` None: still in progress."""
    status = "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
    body: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
        "store": req.store, "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p, "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": req.tools or [],
        "metadata": req.metadata or {}, "usage": None,
    }
    if usage is not None:
        body["usage"] = {"input_tokens": usage.prompt_tokens,
                         "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                                  "disk_cached_tokens": usage.disk_cached_tokens},
                         "output_tokens": usage.completion_tokens,
                         "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                         "total_tokens": usage.prompt_tokens + usage.completion_tokens}
    return body
