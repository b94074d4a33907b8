"""The disk tier through the HTTP front: a server restarted on the same --kv-dir answers an agent's
long system prompt from disk (usage says how much), and /metrics shows the tier."""

from __future__ import annotations

import httpx
import pytest

import agentkv as ak
from agentkv.server import create_app
from tests.server.test_server import KEY, serving

openai = pytest.importorskip("openai")

SYSTEM = "You are the disk tier test's agent. " + "Tools: lookup, convert, schedule, notify. " * 12


def ask(base: str):
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    return client.chat.completions.create(
        model="tiny", max_tokens=6, temperature=0.0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which tool converts?"}])


def test_a_restarted_server_reads_the_prompt_from_disk(tiny_long_dir, tmp_path):
    runs = []
    for _ in range(2):
        engine = ak.Engine(str(tiny_long_dir), num_slots=4096, kv_dir=str(tmp_path), kv_warm_fraction=0.0)
        try:
            with serving(create_app(engine, "tiny", KEY)) as base:
                r = ask(base)
                metrics = httpx.get(base.removesuffix("/v1") + "/metrics").text
            runs.append((r, metrics))
            engine.pin([{"role": "system", "content": SYSTEM}])  # written through to disk
        finally:
            engine.close()
    (first, _), (second, metrics) = runs
    details = second.usage.prompt_tokens_details.model_extra
    assert first.usage.prompt_tokens_details.model_extra["disk_cached_tokens"] == 0
    assert details["disk_cached_tokens"] >= len(SYSTEM) - 64  # the system prompt's whole blocks, byte tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= details["disk_cached_tokens"]
    assert second.choices[0].message.content == first.choices[0].message.content
    assert "agentkv_disk_tier_blocks " in metrics and "agentkv_disk_cached_prompt_tokens_total" in metrics
    restored = next(line for line in metrics.splitlines() if line.startswith("agentkv_disk_tier_restored_tokens "))
    assert float(restored.split()[1]) == details["disk_cached_tokens"]
