"""LoRA adapters over the server: the official `openai` client (and Anthropic's, and the Responses route)
chats with model="<adapter>" and gets that adapter's reply; /v1/models lists the adapters with their
parent; an unknown model is a 404 naming what is loaded; pydantic-ai runs against an adapter; adapters
loaded and unloaded at run time (vLLM's routes, off by default) with requests in flight: none fails,
none is served by another adapter; sessions (prompt_cache_key) are kept per adapter."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from pydantic import BaseModel, Field

import agentkv as ak
from tests.lora_helpers import make_adapter
from tests.server.test_server import KEY, serving
from tests.tiny import make_tiny_model

openai = pytest.importorskip("openai")
pytest.importorskip("peft")
MESSAGES = [{"role": "user", "content": "Name three colors of the sea."}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_server")
    base = make_tiny_model(tmp / "m", chat="qwen2.5", max_positions=4096, seed=3)
    return base, {n: make_adapter(base, tmp / n, seed=i + 1, scale=4.0) for i, n in enumerate(("support", "sales",
                                                                                                "legal"))}


@pytest.fixture(scope="module")
def engine(files):
    base, adapters = files
    e = ak.Engine(str(base), num_slots=16384, seed=0, lora={"support": str(adapters["support"]),
                                                            "sales": str(adapters["sales"])})
    yield e
    e.close()


def _reply(engine: ak.Engine, adapter: str | None, messages=MESSAGES, n: int = 24) -> str:
    return engine.chat(messages, max_tokens=n, temperature=0.0, adapter=adapter).text


def test_the_openai_client_chats_with_an_adapter_by_its_name(engine):
    want = {a: _reply(engine, a) for a in (None, "support", "sales")}
    assert len(set(want.values())) == 3  # three models, three replies
    with serving(ak_app(engine)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
        cards = {m.id: m for m in client.models.list().data}
        assert set(cards) == {"tiny", "support", "sales"}
        assert cards["support"].parent == "tiny" and cards["tiny"].parent is None
        for model, adapter in (("tiny", None), ("support", "support"), ("sales", "sales")):
            out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0.0)
            assert out.choices[0].message.content == want[adapter] and out.model == "tiny"
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=24, temperature=0.0, stream=True) if c.choices)
            assert text == want[adapter]
        with pytest.raises(openai.NotFoundError, match=r"LoRA adapters \['sales', 'support'\]"):
            client.chat.completions.create(model="legal", messages=MESSAGES, max_tokens=4)
        # the Responses route and Anthropic's Messages route name the adapter the same way
        resp = client.responses.create(model="support", input=MESSAGES[0]["content"], max_output_tokens=24,
                                       temperature=0.0)
        assert resp.output_text == want["support"]
        anthropic = pytest.importorskip("anthropic")
        msg = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=KEY, max_retries=0).messages.create(
            model="sales", messages=MESSAGES, max_tokens=24, extra_body={"temperature": 0.0})
        assert msg.content[0].text == want["sales"]


def ak_app(engine, **options):
    from agentkv.server import create_app

    return create_app(engine, "tiny", KEY, **options)


class Colors(BaseModel):
    colors: list[str] = Field(min_length=1, max_length=3)


def test_pydantic_ai_against_an_adapter(engine):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    with serving(ak_app(engine)) as url:
        model = OpenAIChatModel("support", provider=OpenAIProvider(base_url=url, api_key=KEY))
        agent = Agent(model, output_type=Colors, model_settings={"temperature": 0.0, "max_tokens": 200})
        result = agent.run_sync("Name three colors of the sea.")
        assert isinstance(result.output, Colors)
        before = engine.stats()["prompt_tokens"]
        assert agent.run_sync("Name three colors of the sea.").output == result.output  # greedy: the same
        assert engine.stats()["prompt_tokens"] > before


def test_runtime_loading_is_off_unless_asked(engine, files):
    with serving(ak_app(engine)) as url:
        r = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "legal", "lora_path": str(files[1]["legal"])},
                       headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 404 and "--allow-runtime-lora" in r.json()["error"]["message"]


def test_loading_and_unloading_at_run_time_with_requests_in_flight(files):
    base, adapters = files
    with ak.Engine(str(base), num_slots=16384, seed=0, lora={"support": str(adapters["support"])}) as engine:
        alone = {a: _reply(engine, a, n=48) for a in (None, "support")}
        with serving(ak_app(engine, allow_runtime_lora=True)) as url:
            headers = {"Authorization": f"Bearer {KEY}"}

            async def chat(client: httpx.AsyncClient, model: str) -> str:
                r = await client.post(f"{url}/chat/completions", headers=headers, json={
                    "model": model, "messages": MESSAGES, "max_tokens": 48, "temperature": 0.0})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["message"]["content"]

            async def churn(client: httpx.AsyncClient) -> list[httpx.Response]:
                await asyncio.sleep(0.05)  # (the chats are running)
                out = [await client.post(f"{url}/load_lora_adapter", headers=headers,
                                         json={"lora_name": "legal", "lora_path": str(adapters["legal"])})]
                out.append(await client.post(f"{url}/unload_lora_adapter", headers=headers,
                                             json={"lora_name": "support"}))
                return out

            async def main():
                async with httpx.AsyncClient(timeout=120) as client:
                    return await asyncio.gather(*(chat(client, m) for m in ["support", "tiny"] * 4), churn(client))

            *replies, (loaded, unloaded) = asyncio.run(main())
            assert loaded.status_code == 200 and "legal" in loaded.text and unloaded.status_code == 200
            assert replies == [alone["support"], alone[None]] * 4  # each by its own model, none failed
            client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
            assert {m.id for m in client.models.list().data} == {"tiny", "legal"}
            with pytest.raises(openai.NotFoundError):
                client.chat.completions.create(model="support", messages=MESSAGES, max_tokens=4)
            out = client.chat.completions.create(model="legal", messages=MESSAGES, max_tokens=48, temperature=0.0)
            assert out.choices[0].message.content == _reply(engine, "legal", n=48)
            for body, status in (({"lora_name": "x", "lora_path": "/nowhere"}, 400),
                                 ({"lora_name": "legal", "lora_path": str(adapters["legal"])}, 400),
                                 ({"lora_name": "tiny", "lora_path": str(adapters["legal"])}, 400),
                                 ({"lora_name": 3}, 400)):
                r = httpx.post(f"{url}/load_lora_adapter", json=body, headers=headers)
                assert r.status_code == status, r.text
            r = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "support"}, headers=headers)
            assert r.status_code == 404 and "legal" in r.json()["error"]["message"]


def test_sessions_are_kept_per_adapter(engine):
    """Two sessions of one prompt_cache_key on two models: each pins its own conversation (its KV the
    adapter's), and each next turn starts from its own cache."""
    with serving(ak_app(engine)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
        pinned = engine.stats()["pinned_tokens"]
        firsts = {}
        for model in ("support", "sales"):
            firsts[model] = client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=8, temperature=0.0,
                extra_body={"prompt_cache_key": "conv-1"})
        assert engine.stats()["pinned_tokens"] > pinned
        assert len(engine.pins()) >= 2  # one per adapter's session
        engine.flush_cache()  # what is not pinned leaves
        for model in ("support", "sales"):
            turn = MESSAGES + [{"role": "assistant", "content": firsts[model].choices[0].message.content},
                               {"role": "user", "content": "And two more?"}]
            out = client.chat.completions.create(model=model, messages=turn, max_tokens=4, temperature=0.0,
                                                 extra_body={"prompt_cache_key": "conv-1"})
            assert out.usage.prompt_tokens_details.cached_tokens >= firsts[model].usage.prompt_tokens - 1
        json.dumps(engine.stats())
