"""The clients' cache hints (server/sessions.py): prompt_cache_key keeps a session's conversation
pinned between turns, and cache_control pins a marked system prompt, so pool pressure that evicts
the same conversation without a hint leaves these cached."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

import agentkv as ak  # noqa: E402
from agentkv.server import create_app  # noqa: E402
from tests.server.test_server import KEY, serving  # noqa: E402


@pytest.fixture(scope="module")
def small(tiny_long_dir):
    """A server over a pool a few conversations fill."""
    with ak.Engine(str(tiny_long_dir), num_slots=1600, seed=0) as engine:
        with serving(create_app(engine, "tiny", KEY, session_ttl_s=60)) as base:
            yield engine, openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)


def ask(client, messages, **extra):
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0,
                                          extra_body=extra)


def flood(client, tag: str) -> None:
    for i in range(6):  # ~2,700 tokens of other prompts: more than the pool holds besides pins
        ask(client, [{"role": "system", "content": f"flood {tag} {i}: " + "other tenants' text " * 22},
                     {"role": "user", "content": "hi"}])


@pytest.mark.parametrize("key", ["session-1", None])
def test_prompt_cache_key_keeps_the_next_turn_cached(small, key):
    _, client = small
    system = {"role": "system", "content": f"Session {key}. " + "Keep this session's records. " * 10}
    first = [system, {"role": "user", "content": "turn one"}]
    r1 = ask(client, first, **({"prompt_cache_key": key} if key else {}))
    flood(client, str(key))
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "turn two"}]
    r2 = ask(client, second, **({"prompt_cache_key": key} if key else {}))
    covered = r1.usage.prompt_tokens + r1.usage.completion_tokens - 1  # (an end-of-turn token is not fed back)
    if key:
        assert r2.usage.prompt_tokens_details.cached_tokens >= covered
    else:  # the same conversation without the hint: the flood evicted it
        assert r2.usage.prompt_tokens_details.cached_tokens < covered


def test_cache_control_pins_the_marked_system_prompt(small):
    engine, client = small
    text = "Pinned by its hint. " * 16
    system = {"role": "system", "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}
    pins = engine.stats()["pins"]
    ask(client, [system, {"role": "user", "content": "a"}])
    assert engine.stats()["pins"] == pins + 1
    flood(client, "cc")
    r = ask(client, [system, {"role": "user", "content": "b"}])
    assert r.usage.prompt_tokens_details.cached_tokens >= len(text)  # one token a character
    ask(client, [system, {"role": "user", "content": "c"}])
    assert engine.stats()["pins"] == pins + 1  # the same prefix is pinned once


def test_a_transcript_sent_back_meets_its_replies_tokens(client):
    """Chat completions re-sent whole, turn after turn: each turn's prompt starts from the previous
    prompt and reply as the engine wrote them (the random model's bytes do not re-tokenize as they
    were written: a plain re-encoding parts from the cache inside each reply)."""
    messages = [{"role": "system", "content": "You keep the carry test's transcript."}]
    before = None
    for turn in range(5):
        messages.append({"role": "user", "content": f"turn {turn}"})
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=1.0,
                                           seed=turn)
        if before is not None:
            assert r.usage.prompt_tokens_details.cached_tokens >= before, (turn, r.usage)
        before = r.usage.prompt_tokens + r.usage.completion_tokens - 1
        messages.append({"role": "assistant", "content": r.choices[0].message.content})


def test_a_reasoning_conversation_on_bpe_meets_the_cache_every_turn(tmp_path):
    """Five turns of chat completions, each re-sending the transcript (replies as the server gave
    them, without their reasoning), on a BPE tokenizer (the random model's bytes do not re-tokenize
    as written) and DeepSeek-R1's template (Qwen3's, the block opened by the generation prompt), which
    drops each earlier turn's reasoning: every turn's prompt is cached up to its new user message
    (the previous prompt and the reply in the template's form, prefilled by the server after the
    reply: server/history.py). Checked against a planted bug (the warm-up not queued): from the second
    turn on, the reply and the user header are computed again and it fails."""
    from tests.tiny import make_tiny_model

    engine = ak.Engine(str(make_tiny_model(tmp_path / "r1", chat="r1", merges=60, max_positions=4096)),
                       num_slots=8192)
    try:
        with serving(create_app(engine, "tiny", KEY)) as base:
            client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
            messages = [{"role": "system", "content": "You keep the reasoning carry test's transcript."}]
            for turn in range(5):
                messages.append({"role": "user", "content": f"turn {turn}: the template writes the reply back"})
                r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, seed=turn,
                                                   temperature=1.0, extra_body={"max_reasoning_tokens": 6})
                reply = r.choices[0].message
                assert reply.reasoning_content and reply.content  # (the template has reasoning to drop)
                # what the prompt adds to the last one's start: the new message and the generation prompt
                new = engine.tokenizer.encode(f"{messages[-1]['content']}<|im_end|>\n<|im_start|>assistant\n<think>\n",
                                              add_bos=False)
                if turn:
                    assert r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens <= len(new), (
                        turn, r.usage)
                messages.append({"role": "assistant", "content": reply.content})
                _wait_idle(engine)  # (the warm-up is queued before the reply returns, and runs as the client reads)
    finally:
        engine.close()


def _wait_idle(engine) -> None:
    import time

    for _ in range(200):
        st = engine.stats()
        if not st["running"] and not st["waiting"]:
            return
        time.sleep(0.01)
