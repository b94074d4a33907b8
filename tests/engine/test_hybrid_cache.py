"""LFM2's short convolutions under every cache agentkv keeps: each token's convolution input lives in
its KV slot (engine/short_conv.py), so a multi-turn conversation hits the radix cache as a dense
model's does, its answers equal those with the cache off, a prefix evicted to disk or kept across a
restart comes back with its convolution inputs, and a prefix hit resumes at any token."""

from __future__ import annotations

import pytest

import agentkv as ak
from tests.engine.test_disk_tier import B, P, Q
from tests.tiny_families import make_family_model

pytest.importorskip("transformers")

TURNS = ["What is the capital of France?", "And of Italy?", "Which of the two is larger?", "Spell it backwards.",
         "Now in capitals.", "Thanks, that is all."]
REPLY = "Noted; here is the short answer you asked for."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """LFM2 and a dense model of the same shape and tokenizer (SmolLM3's layers, all attention)."""
    root = tmp_path_factory.mktemp("hybrid")
    return (make_family_model(root / "lfm2", "lfm2", config={"max_position_embeddings": 4096}),
            make_family_model(root / "dense", "smollm3", config={"max_position_embeddings": 4096}))


def conversation(engine: ak.Engine) -> tuple[list[list[int]], int, int]:
    """Each turn's greedy answer, and the prompt tokens the turns asked for and found cached."""
    messages = [{"role": "system", "content": "You answer briefly."}]
    answers, prompt, cached = [], 0, 0
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        out = engine.chat(messages, max_tokens=8, temperature=0.0)
        answers.append(out.completions[0].token_ids)
        prompt, cached = prompt + out.usage.prompt_tokens, cached + out.usage.cached_tokens
        messages.append({"role": "assistant", "content": REPLY})
    return answers, prompt, cached


def test_a_conversation_hits_as_a_dense_models_and_answers_as_without_the_cache(models):
    hybrid, dense = models
    with ak.Engine(str(hybrid), num_slots=4096) as e:
        assert e.model_config.conv_layers == (0, 2, 3)
        answers, prompt, cached = conversation(e)
    with ak.Engine(str(hybrid), num_slots=4096, enable_radix_cache=False) as e:
        uncached, _, none = conversation(e)
    with ak.Engine(str(dense), num_slots=4096) as e:
        _, dense_prompt, dense_cached = conversation(e)
    assert none == 0 and answers == uncached
    assert prompt == dense_prompt and cached / prompt > 0.6  # (the first turn has nothing cached)
    assert abs(cached / prompt - dense_cached / dense_prompt) < 0.05


def test_a_hit_resumes_at_any_token(models):
    """Prefixes of every length cached first: the next token's logits are the cold ones (no block
    boundary to fall back to, nothing recomputed before the hit's end)."""
    hybrid, _ = models
    text = "The quick brown fox jumps over the lazy dog."
    with ak.Engine(str(hybrid), num_slots=4096) as cold:
        expected = cold.generate(text, max_tokens=6, temperature=0.0).completions[0].token_ids
    for cut in (1, 2, 3, 7, 20):
        with ak.Engine(str(hybrid), num_slots=4096) as e:
            e.prefill(text[:cut])
            out = e.generate(text, max_tokens=6, temperature=0.0)
            assert out.usage.cached_tokens == cut and out.completions[0].token_ids == expected


def test_the_disk_tier_keeps_the_convolution_inputs_across_a_restart(models, tmp_path):
    hybrid, _ = models

    def engine(**kw):
        return ak.Engine(str(hybrid), num_slots=4096, seed=0, **kw)

    with engine() as cold:
        expected = cold.generate(P + Q, max_tokens=8, temperature=0.0).completions[0].token_ids
    tier = {"kv_dir": str(tmp_path), "kv_block_tokens": B, "kv_warm_fraction": 0.0}
    with engine(**tier) as e:
        assert e.prefill(P) == len(P)
        e.flush_cache()  # evicted: what is left is on disk
        out = e.generate(P + Q, max_tokens=8, temperature=0.0)
        assert out.usage.disk_cached_tokens == len(P) and out.completions[0].token_ids == expected
    with engine(**tier) as e:  # a restart
        out = e.generate(P + Q, max_tokens=8, temperature=0.0)
        assert out.usage.disk_cached_tokens >= len(P) and out.completions[0].token_ids == expected


def test_an_agents_steps_reuse_the_last_ones_tokens(models):
    """A tool-calling agent on the hybrid: each step's prompt finds the last step's prompt and reply
    cached (but for the reply's end: its last sampled token and the closing markup the grammar forced
    after it, byte tokens here, were never fed to the model), as on a dense model."""
    hybrid, dense = models
    reused = []
    for path in (hybrid, dense):
        @ak.tool
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

        with ak.Engine(str(path), num_slots=4096, seed=0) as e, ak.Agent(
                "You add numbers.", tools=[add], tool_choice="required", max_steps=2, engine=e, seed=3,
                temperature=1.0, max_tokens=120, parallel_tool_calls=False) as agent:
            steps = agent.run_sync("add 2 and 3").steps
        for first, second in zip(steps, steps[1:]):
            assert second.usage.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens - 20
        reused.append(sum(s.usage.cached_tokens for s in steps) / sum(s.usage.prompt_tokens for s in steps))
    assert reused[0] > 0.5 and abs(reused[0] - reused[1]) < 0.1
