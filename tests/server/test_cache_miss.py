"""usage.prompt_tokens_details.cache_miss: where a prompt parted from a longer path the radix cache
held, named by message and section, with what the cache held there against what was sent; absent
on a prompt that matched all it could."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

TOOL_A = {"type": "function", "function": {"name": "alpha", "description": "The first tool, alpha.",
                                           "parameters": {"type": "object", "properties": {}}}}
TOOL_B = {"type": "function", "function": {"name": "beta", "description": "The second tool, beta.",
                                           "parameters": {"type": "object", "properties": {}}}}


def miss_of(client, messages, **kw):
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0.0, **kw)
    return (r.usage.prompt_tokens_details.model_extra or {}).get("cache_miss")


def test_a_changed_timestamp_in_the_system_prompt(client):
    def ask(now: str) -> list[dict]:
        return [{"role": "system", "content": f"It is {now} now. You keep the miss-report test's records."},
                {"role": "user", "content": "What is on the list?"}]

    miss_of(client, ask("10:41"))  # into the cache
    assert miss_of(client, ask("10:41")) is None  # the same prompt again: all cached, nothing to report
    miss = miss_of(client, ask("10:42"))
    assert miss["message"] == 0 and miss["role"] == "system" and miss["section"] == "system", miss
    assert miss["cached"].startswith("1") and miss["sent"].startswith("2"), miss


def test_reordered_tools(client):
    ask = [{"role": "system", "content": "You run the tool-order test."}, {"role": "user", "content": "Go."}]
    miss_of(client, ask, tools=[TOOL_A, TOOL_B])
    miss = miss_of(client, ask, tools=[TOOL_B, TOOL_A])
    assert miss["section"] == "tools" and "alpha" in miss["cached"] + miss["sent"], miss


def test_a_changed_last_message(client):
    history = [{"role": "system", "content": "You answer the last-turn test."},
               {"role": "user", "content": "First question?"}, {"role": "assistant", "content": "First answer."}]
    miss_of(client, history + [{"role": "user", "content": "Second question, as sent before?"}])
    miss = miss_of(client, history + [{"role": "user", "content": "Second question, edited?"}])
    assert miss["message"] == 3 and miss["role"] == "user" and miss["section"] == "content", miss


def test_a_conversation_that_gains_tools(client, live):
    """Cached without tools, sent with them: the miss is in the tools section, at the first token where
    the two prompts part (checked against a planted off-by-one that reported the tool block's first
    character as the system message's: the reordered-tools test passed it, this fails)."""
    from agentkv.server.chat import ChatPlan
    from agentkv.server.protocol import ChatRequest

    engine = live[1]
    ask = [{"role": "system", "content": "You run the gained-tools test."}, {"role": "user", "content": "Go."}]
    miss_of(client, ask)
    miss = miss_of(client, ask, tools=[TOOL_A])
    assert miss["section"] == "tools" and miss["message"] == 0, miss
    bodies = [{"model": "tiny", "messages": ask}, {"model": "tiny", "messages": ask, "tools": [TOOL_A]}]
    plain, tooled = (engine.tokenizer.encode(ChatPlan(engine, ChatRequest.model_validate(b)).prompt) for b in bodies)
    first = next(i for i, (a, b) in enumerate(zip(plain, tooled)) if a != b)
    tool_block = engine.tokenizer.decode(tooled[first:])
    assert miss["token"] == first and tool_block.startswith(miss["sent"]) and "# Tools" in miss["sent"], miss
