"""What the router keys an OpenAI request by, read from its body alone (the router runs where there is no
tokenizer): the model it names (the base or a LoRA adapter, whose KV is its own) and its prompt's text,
and a prompt_cache_key session per model."""

from __future__ import annotations

import json
from typing import Any


def body_text(body: dict[str, Any]) -> str | None:
    """The text whose prefixes identify an OpenAI request's cached prompt: the model it names (a LoRA
    adapter's KV is its own: its requests go where that adapter's prefixes are), then tool definitions and
    each message in order (chat), the instructions and input (responses), or the prompt (completions)."""
    text = _prompt_text(body)
    return None if text is None else f"{body.get('model') or ''}\n{text}"


def session_key(body: dict[str, Any]) -> str | None:
    """A prompt_cache_key session, apart for each model (adapter) it names."""
    key = body.get("prompt_cache_key")
    return f"{body.get('model') or ''}\n{key}" if isinstance(key, str) else None


def _prompt_text(body: dict[str, Any]) -> str | None:
    if isinstance(body.get("messages"), list):
        parts = [json.dumps(body["tools"], sort_keys=True)] if body.get("tools") else []
        if body.get("system"):  # Anthropic's Messages API: the system prompt beside the messages
            parts.append(json.dumps(body["system"], sort_keys=True))
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if not isinstance(content, str):
                content = json.dumps(content, sort_keys=True)
            parts.append(f"{m.get('role') if isinstance(m, dict) else ''}: {content}")
        return "\n".join(parts)
    if "input" in body:  # the Responses API: instructions, then the input as text or items
        parts = [json.dumps(body["tools"], sort_keys=True)] if body.get("tools") else []
        parts.append(str(body.get("instructions") or ""))
        items = body["input"]
        parts.append(items if isinstance(items, str) else json.dumps(items, sort_keys=True))
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return None if prompt is None else json.dumps(prompt)
