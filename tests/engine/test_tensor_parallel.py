"""Tensor parallelism on CPU: two processes over gloo, each holding half of every layer, must give the
greedy outputs of one process holding all of it."""

from __future__ import annotations

import pytest

import agentkv as ak

PROMPTS = [f"Tensor parallel request {i}: " + "abc " * i for i in range(6)]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}


def outputs(engine: ak.Engine) -> list:
    free = engine.generate(PROMPTS, max_tokens=12, temperature=0.0, ignore_eos=True)
    again = engine.generate(PROMPTS[:2], max_tokens=12, temperature=0.0, ignore_eos=True)  # prefixes from the tree
    structured = engine.generate(PROMPTS[:2], schema=SCHEMA, max_tokens=80, temperature=0.0)
    return [o.token_ids for o in free + again + structured]


def test_tp2_greedy_equals_tp1(tiny_dir):
    with ak.Engine(str(tiny_dir), num_slots=1024, max_step_tokens=32) as one:
        expected = outputs(one)
    with ak.Engine(str(tiny_dir), num_slots=1024, max_step_tokens=32, tensor_parallel=2) as two:
        assert two.model_config.num_heads * 2 == one.model_config.num_heads  # this rank's half
        got = outputs(two)
        st = two.stats()
        assert st["cached_prompt_tokens"] > 0 and st["jump_forward_tokens_computed"] > 0
    assert got == expected


def test_tp2_mixture_of_experts_equals_tp1(tmp_path):
    """Every expert's width (and Qwen2-MoE's shared expert's) split across the ranks, the router kept
    whole: the block's partial sums reduced once."""
    from tests.tiny import make_tiny_model

    path = str(make_tiny_model(tmp_path / "moe", "qwen2_moe", dense_layers=(1,)))
    with ak.Engine(path, num_slots=1024) as one:
        expected = [o.token_ids for o in one.generate(PROMPTS, max_tokens=10, temperature=0.0, ignore_eos=True)]
    with ak.Engine(path, num_slots=1024, tensor_parallel=2) as two:
        assert two.model_config.moe_intermediate_size * 2 == one.model_config.moe_intermediate_size
        got = [o.token_ids for o in two.generate(PROMPTS, max_tokens=10, temperature=0.0, ignore_eos=True)]
    assert got == expected


def test_tp_errors(tiny_dir):
    with pytest.raises(ak.RequestError, match="does not divide"):
        ak.Engine(str(tiny_dir), tensor_parallel=3)
    with pytest.raises(ak.RequestError, match="at least 1"):
        ak.Engine(str(tiny_dir), tensor_parallel=0)
