"""Conversations in OpenAI's message shape, rendered in a model's own tool-call format.

An assistant turn that called tools is kept structured (`tool_calls`, with the arguments as the
model wrote them), and results as role "tool" messages, as OpenAI-compatible APIs take them; the
server's requests and an agent's history are both in this shape. `template_messages` writes them as
the chat template renders them for the model's format (`ToolFormat`): the calls in its call syntax
(so a re-rendered turn reads as what the grammar let the model write, and its tokens come from the
radix cache), results as the format returns them.
"""

from __future__ import annotations

import json
from typing import Any

from agentkv.chat.calls import ToolCall
from agentkv.errors import RequestError


class MessageError(RequestError):
    """A message that cannot be rendered; `param` names it (`messages[2].content`)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param

    def __reduce__(self):
        return type(self), (self.args[0], self.param)


def text_content(content: Any, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text: a string, or a list of text parts of `kinds` (chat's "text", the
    Responses API's "input_text" / "output_text"); MessageError naming the part otherwise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") not in kinds:
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise MessageError(f"only text content parts ({', '.join(kinds)}) are supported, not {kind!r}",
                                   f"{where}[{k}]")
            parts.append(p.get("text", ""))
        return "".join(parts)
    raise MessageError(f"content must be a string or a list of {kinds[0]} parts", where)


def template_messages(messages: list[dict], fmt, where: str = "messages") -> list[dict]:
    """`messages` as the chat template renders them: an assistant's tool_calls written in the
    model's format (`fmt`, a ToolFormat: as we generate them), tool results as the format returns
    them, "developer" as "system" (a system message keeps the `tools` text a format writes there)."""
    out: list[dict] = []
    names: dict[str, str] = {}
    ids: dict[str, str] = {}  # a call's id as the client sent it -> as the template writes it
    pending: list[tuple[ToolCall, str]] = []

    def flush() -> None:
        if pending:
            out.extend(fmt.results_messages(pending))
            pending.clear()

    for i, m in enumerate(messages):
        role = m.get("role")
        content = text_content(m.get("content"), f"{where}[{i}].content")
        if role == "tool":
            call_id = m.get("tool_call_id", "")
            pending.append((ToolCall(names.get(call_id, m.get("name", "")), {}, ids.get(call_id, call_id)), content))
            continue
        flush()
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise MessageError(f"{where}[{i}].role must be system, developer, user, assistant or tool, not {role!r}",
                               f"{where}[{i}].role")
        if role == "assistant" and m.get("tool_calls"):
            calls = [_call(c, f"{where}[{i}].tool_calls[{k}]") for k, c in enumerate(m["tool_calls"])]
            names.update((c.id, c.name) for c in calls)
            ids.update((c.id, fmt.written_id(c, k)) for k, c in enumerate(calls))
            out.append(fmt.assistant_message(content, calls))
            continue
        if role == "system" and isinstance(m.get("tools"), str):  # definitions a format put there (Phi-4-mini's)
            out.append({"role": role, "content": content, "tools": m["tools"]})
            continue
        out.append({"role": role, "content": content})
    flush()
    return out


def _call(c: dict, where: str) -> ToolCall:
    fn = c.get("function") or {}
    text = fn.get("arguments") or "{}"
    try:
        args = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        raise MessageError("tool call arguments must be JSON text", f"{where}.function.arguments") from None
    return ToolCall(fn.get("name", ""), args, c.get("id", ""), text if isinstance(text, str) else None)


def assistant_calls_message(content: str, calls: list[ToolCall]) -> dict:
    """An assistant turn that made `calls`, in OpenAI's shape (the arguments as the model wrote them)."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                           for c in calls]}


def tool_message(call: ToolCall, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def is_messages(prompt: Any) -> bool:
    """A chat (a list of message dicts) rather than text or token ids."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], dict)
