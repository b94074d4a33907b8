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
