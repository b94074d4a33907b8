"""Why a prompt missed the cache: the first uncached token of a prompt, placed in its conversation.

The engine reports where a prompt parted from a longer path its radix cache held (`CacheMiss`: the
token index, what the cache held there, what the prompt has). Here that place gets a name a user can
act on: the message it falls in, and its section there: the system text, the tool definitions the
template renders (tools listed in another order), a reasoning block (a template that drops reasoning
from history), or the message's content (a timestamp in the system prompt, an edited turn).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

Render = Callable[..., str]  # engine.render(messages, tools=..., add_generation_prompt=False, **kwargs)


def place(messages: Sequence[dict], bare: Sequence[dict], tools: list | None, render: Render, char: int,
          reasoning=None, **template_kwargs: Any) -> dict:
    """{"message": index, "role": ..., "section": "system" | "tools" | "reasoning" | "content"} of the
    character `char` of the rendered prompt (a message's span ends where rendering it ends). `bare`:
    the messages without the tool definitions a format writes into them (`tools` the ones the
    template takes): where the prompt differs from theirs is the tools' text."""
    whole = render(messages, tools=tools, add_generation_prompt=False, **template_kwargs)
    without = render(bare, tools=None, add_generation_prompt=False, **template_kwargs)
    first = len(os.path.commonprefix([whole, without]))
    last = len(whole) - len(os.path.commonprefix([whole[first:][::-1], without[first:][::-1]]))
    in_tools = first <= char < last and whole != without
    start = 0
    for k in range(len(messages)):
        head = list(messages[: k + 1])
        end = len(render(head, tools=tools, add_generation_prompt=False, **template_kwargs))
        if char < end or k == len(messages) - 1:
            m = messages[k]
            section = "tools" if in_tools else _section(whole[start:end], m, char - start, reasoning)
            return {"message": k, "role": m.get("role"), "section": section}
        start = end
    return {"message": None, "role": None, "section": "generation prompt"}


def _section(text: str, message: dict, char: int, reasoning) -> str:
    """The section of the message rendered as `text` that its character `char` falls in."""
    if reasoning is not None and reasoning.open_text.strip() in text:
        opened = text.index(reasoning.open_text.strip())
        closed = text.find(reasoning.close_text.strip())
        if opened <= char and (closed < 0 or char < closed + len(reasoning.close_text.strip())):
            return "reasoning"
    return "system" if message.get("role") in ("system", "developer") else "content"


def describe(miss, ids: Sequence[int], decode: Callable[[Sequence[int]], str], messages: Sequence[dict],
             bare: Sequence[dict], tools: list | None, render: Render, reasoning=None, **template_kwargs: Any) -> dict:
    """The miss as a response reports it: the token, its place, and what the cache held there
    against what the prompt has."""
    char = len(decode(list(ids[: miss.token])))
    try:
        where = place(messages, bare, tools, render, char, reasoning, **template_kwargs)
    except Exception:  # noqa: BLE001 - a template that cannot render a part of the conversation alone
        where = {"message": None, "role": None, "section": None}
    return {"token": miss.token, **where, "cached": decode(miss.cached), "sent": decode(miss.sent)}
