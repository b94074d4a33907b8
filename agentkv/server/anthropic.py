"""/v1/messages: Anthropic's Messages API over the same plan as chat (the prompt, tool format,
grammar and reasoning are chat.py's ChatPlan, so a tool call is generated under the model's own
format exactly as for /v1/chat/completions).

A request becomes a chat request: the system prompt (a string or text blocks), messages whose
blocks are text, `tool_use` (an assistant's calls), `tool_result` (role "tool" messages, `is_error`
marked) and `thinking` (the reasoning block as the template keeps it); tools' `input_schema`;
`tool_choice` auto / any / tool / none and `disable_parallel_tool_use`; `thinking` enabled (its
budget closes the block) or disabled. `cache_control` is accepted anywhere; on the system prompt or a
tool it pins the prefix through it for a while (server/sessions.py), as Anthropic keeps a cache
breakpoint; the radix cache keeps every other prefix unasked, and its hits come back as
`cache_read_input_tokens`. The reply is content blocks (thinking, text, tool_use) with Anthropic's
stop reasons, streamed as its events (anthropic_stream.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentkv.chat.carry import TokenCarry
from agentkv.server.chat import ChatPlan, generate_checked
from agentkv.server.history import warm_next_turn
from agentkv.server.protocol import MAX_STOP, MAX_STOP_CHARS, APIError, ChatRequest
from agentkv.server.sessions import Sessions
from agentkv.typed import complete_fields

# HTTP status -> Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error"}
STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}
EXTENSIONS = ("seed", "budget_closing", "number_digits", "json_style")  # fields a Messages request may add


def error_body(e: APIError) -> dict:
    """An error in Anthropic's shape, naming the field where there is one."""
    message = f"{e.param}: {e.message}" if e.param and not e.message.startswith(e.param) else e.message
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": message}}


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None

    def check_limits(self) -> None:
        pass


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False

    def check_limits(self) -> None:
        stops = self.stop_sequences or []
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise APIError(400, f"at most {MAX_STOP} stop sequences of at most {MAX_STOP_CHARS} characters each",
                           "stop_sequences")


def chat_request(req: CountTokensRequest, reasoning, close_objects: bool = True) -> ChatRequest:
    """The chat request a Messages request is (400s name the Messages field)."""
    body: dict[str, Any] = {"model": req.model, "messages": _system(req.system) + _messages(req.messages, reasoning),
                            "close_objects": close_objects}
    if req.tools:
        body["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"], body["parallel_tool_calls"] = _tool_choice(req.tool_choice)
    thinking = req.thinking or {}
    if thinking.get("type") == "enabled" and isinstance(thinking.get("budget_tokens"), int):
        body["max_reasoning_tokens"] = thinking["budget_tokens"]
    elif thinking.get("type") == "disabled":
        body["chat_template_kwargs"] = {"enable_thinking": False}
    if isinstance(req, MessagesRequest):
        body.update(max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
                    top_p=req.top_p, top_k=req.top_k, stream=req.stream)
    body = {k: v for k, v in body.items() if v is not None}
    # agentkv's extensions, as the chat route takes them (a null number_digits is unbounded: kept)
    body.update({k: v for k, v in (req.model_extra or {}).items() if k in EXTENSIONS})
    return ChatRequest.model_validate(body)


def _system(system) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return [{"role": "system", "content": "".join(_text(b, f"system[{i}]") for i, b in enumerate(system))}]


def _text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise APIError(400, "must be a text block {\"type\": \"text\", \"text\": ...}", where)
    return block["text"]


def _messages(messages: list[dict], reasoning) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise APIError(400, "role must be 'user' or 'assistant' (the system prompt is the top-level `system`)",
                           f"messages[{i}].role")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(400, "content must be a string or a list of content blocks", f"messages[{i}].content")
        out.extend(_user(content, i) if role == "user" else [_assistant(content, i, reasoning)])
    return out


def _user(blocks: list, i: int) -> list[dict]:
    """A user turn: its tool results (role "tool" messages, in order), then its text."""
    results, text = [], []
    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_result":
            content = b.get("content", "")
            if isinstance(content, list):
                content = "".join(_text(c, f"{where}.content[{k}]") for k, c in enumerate(content))
            if not isinstance(content, str) or not isinstance(b.get("tool_use_id"), str):
                raise APIError(400, "a tool_result needs a tool_use_id and text content", where)
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": ("Error: " + content) if b.get("is_error") else content})
        elif kind == "text":
            text.append(b["text"] if isinstance(b.get("text"), str) else _text(b, where))
        else:
            raise APIError(400, f"a user message's blocks are text and tool_result here, not {kind!r} (this server "
                                "takes no images or documents)", f"{where}.type")
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])


def _assistant(blocks: list, i: int, reasoning) -> dict:
    thought, text, calls = "", [], []
    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(_text(b, where))
        elif kind == "thinking":
            thought += str(b.get("thinking", ""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise APIError(400, "a tool_use block needs an id and a name", where)
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}})
        else:
            raise APIError(400, f"an assistant message's blocks are text, thinking and tool_use, not {kind!r}",
                           f"{where}.type")
    content = "".join(text)
    if thought and reasoning is not None:  # the block as the template keeps (or drops) it
        content = reasoning.open_text + thought + reasoning.close_text + content
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Any, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
        raise APIError(400, "a tool is {\"name\": ..., \"description\": ..., \"input_schema\": {...}} "
                            "(this server runs no server tools)", f"tools[{i}]")
    fn = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _tool_choice(choice: dict) -> tuple[Any, bool]:
    """(chat's tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise APIError(400, "tool_choice {\"type\": \"tool\"} names the tool: {\"type\": \"tool\", \"name\": ...}",
                           "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in modes:
        raise APIError(400, f"tool_choice.type must be auto, any, tool or none, not {kind!r}", "tool_choice.type")
    return modes[kind], parallel


def plan_of(engine, req: CountTokensRequest, close_objects: bool = True, replies: TokenCarry | None = None) -> ChatPlan:
    try:
        return ChatPlan(engine, chat_request(req, engine.reasoning, close_objects), replies)
    except APIError as e:  # chat's names for the fields a Messages request names otherwise
        param = (e.param or "").replace(".function.parameters", ".input_schema").replace(".function.name", ".name")
        raise APIError(e.status, e.message, param or None, e.type, e.code) from None


async def count_tokens(engine, req: CountTokensRequest, close_objects: bool = True) -> dict:
    plan = plan_of(engine, req, close_objects)
    return {"input_tokens": len(engine.tokenizer.encode(plan.prompt))}


def marked(req: CountTokensRequest) -> int | None:
    """Where a `cache_control` hint ends (server/sessions.py): the system prompt (message 0) where a
    system block carries one, -1 where only a tool does, None where neither does."""
    if isinstance(req.system, list) and any(isinstance(b, dict) and b.get("cache_control") for b in req.system):
        return 0
    return -1 if any(isinstance(t, dict) and t.get("cache_control") for t in req.tools or []) else None


async def create_message(engine, req: MessagesRequest, model: str, close_objects: bool = True, resamples: int = 0,
                         sessions: Sessions | None = None, replies: TokenCarry | None = None) -> dict:
    """`replies`: the server's carry of its replies' tokens (a client re-sending its whole
    conversation each turn, as Anthropic's do, meets them)."""
    plan = plan_of(engine, req, close_objects, replies)
    if sessions is not None:
        await sessions.hinted(plan.messages, plan.template_tools, marked(req), plan.params.adapter)
    mid = message_id()
    out, [(msg, reason)], _ = await generate_checked(engine, plan, plan.prompt_ids(), lambda i: mid[-8:], resamples)
    completion = out.completions[0]
    if replies is not None:
        replies.written(plan.prompt, plan.ids, completion)
    warm_next_turn(plan, sent_back(msg, engine.reasoning), completion, replies)
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks(msg),
            **stop_of(engine, req, completion, reason), "usage": usage(out.usage)}


def blocks(msg: dict) -> list[dict]:
    """A chat message's reasoning, text and calls as Anthropic's content blocks."""
    out: list[dict] = []
    if msg.get("reasoning_content") is not None:
        out.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        out.append({"type": "text", "text": msg["content"]})
    for c in msg.get("tool_calls") or []:
        out.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                    "input": _input(c["function"]["arguments"])})
    return out


def _input(arguments: str) -> dict:
    """A call's arguments as tool_use's `input`; a call max_tokens cut (stop_reason "max_tokens") keeps
    the members it completed, as Anthropic's API returns a cut tool_use."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return complete_fields(arguments)


def sent_back(msg: dict, reasoning) -> dict:
    """A reply as Anthropic's clients send it back (its thinking block included), as a chat message."""
    return _assistant(blocks(msg), 0, reasoning)


def stop_of(engine, req: MessagesRequest, completion, reason: str) -> dict:
    """stop_reason and stop_sequence: a stop sequence is the one the text stopped before."""
    if reason == "stop" and req.stop_sequences:
        after = engine.tokenizer.decode(completion.token_ids)[len(completion.text):]
        hit = next((s for s in req.stop_sequences if after.startswith(s)), None)
        if hit is not None:
            return {"stop_reason": "stop_sequence", "stop_sequence": hit}
    return {"stop_reason": STOP_REASONS.get(reason, "end_turn"), "stop_sequence": None}


def usage(u) -> dict:
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"
