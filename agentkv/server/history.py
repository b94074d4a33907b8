"""The next turn's start, computed while the client reads the reply.

A chat template writes a conversation's earlier replies back in a form of its own: Qwen3's and
DeepSeek-R1's drop the reasoning of every turn before the last user message, many write a tool
call's JSON with spacing of their own, some trim the reply's whitespace. The next prompt then parts
from what the engine cached (the prompt and the reply as they were written) where the reply starts,
and its prefill computes the reply again. So after a reply whose written form is not the
template's, the server renders the conversation as the next turn will begin (its messages, the
reply as a client sends it back, the start of the message that follows) and queues that prefix's
prefill at once: the template's form of the reply is computed off the next request's path, and the
carry (chat/carry.py) encodes the next prompt with those very ids. The prompt is never changed:
the cache is given the text the template will write.
"""

from __future__ import annotations

from agentkv.chat import messages as chat_messages
from agentkv.chat.carry import TokenCarry
from agentkv.errors import AgentKVError, EngineError, RequestError
from agentkv.server.protocol import template_kwargs

PROBES = ("x", "y")  # two contents of the message that follows: its text starts where they part


def next_turn_start(plan, back: dict) -> str | None:
    """The text each next request of `plan`'s conversation begins with: its messages, the reply as
    the client sends it back (`back`, a chat message), and the following message's opening (a tool
    result where the reply calls tools, else a user message). None where the template fails on it
    (the next turn is then computed when it comes)."""
    calls = back.get("tool_calls")
    follow = {"role": "tool", "tool_call_id": calls[0]["id"]} if calls else {"role": "user"}
    texts = []
    try:
        for probe in PROBES:
            given = chat_messages.template_messages([*plan.req.messages, back, {**follow, "content": probe}],
                                                    plan.fmt)
            texts.append(plan.engine.render(plan.turn.messages(given), tools=plan.template_tools,
                                            **template_kwargs(plan.req)))
    except (AgentKVError, TypeError, ValueError):
        return None  # (a hint only)
    a, b = texts
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]


def chat_reply_back(msg: dict) -> dict:
    """A chat reply as OpenAI clients send it back: without its reasoning."""
    back = {k: v for k, v in msg.items() if k != "reasoning_content" and v is not None}
    back.setdefault("content", "")
    return back


def warm_next_turn(plan, back: dict, completion, replies: TokenCarry | None) -> list[int] | None:
    """Where the template writes the reply back (`back`: as the client sends it) other than as
    `completion` wrote it: queue the next turn's start for prefill, give the carry its ids, and
    return them (what a session's pin should hold); None where the prompt and the reply as written
    already begin that start."""
    if replies is None:
        return None
    start = next_turn_start(plan, back)
    if start is None or start.startswith(plan.prompt + completion.text):
        return None
    ids = replies.encode(start)
    try:
        plan.engine.prefill(ids, wait=False, adapter=plan.params.adapter)
    except (RequestError, EngineError):  # no radix cache, over the context or the pool, closing: nothing to warm
        return None
    replies.remember(start, ids)
    return ids
