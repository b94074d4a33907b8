"""The engine on a CUDA GPU (skipped without one; `benchmarks/gpu.sh` runs it on a lent GPU): CUDA graphs
and overlap scheduling, on by default there, must give the greedy tokens of the engine with both off;
sampling, penalties, logprobs, grammar masks, scores and memory accounting must work on the device."""

from __future__ import annotations

import pytest
import torch

import agentkv as ak
from tests.test_structured import TOOL_CALL

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [f"GPU request {i}: " + "words " * (3 * i) for i in range(6)]


def greedy(engine) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(PROMPTS, max_tokens=16, temperature=0.0, ignore_eos=True)]


def test_graphs_and_overlap_equal_eager(tiny_dir):
    with ak.Engine(str(tiny_dir), device="cuda", cuda_graphs=False, overlap_schedule=False) as eager:
        expected = greedy(eager)
    with ak.Engine(str(tiny_dir), device="cuda") as fast:
        runner = fast._core.runner
        assert runner.graphs is not None and fast._core.passes.overlap
        assert greedy(fast) == expected
        assert runner.graphs.replays > 0
        st = fast.stats()
        assert st["running"] == 0 and st["free_slots"] + st["cached_tokens"] == st["total_slots"]


def test_fused_ops_equal_torch_ops(tiny_dir):
    """fused_ops=True (norms, activation and rotation as Triton kernels, compiled) gives the torch ops'
    greedy tokens, in fp32 where neither rounds to bf16, with CUDA graphs and overlap on."""
    with ak.Engine(str(tiny_dir), device="cuda", dtype="float32") as plain:
        expected = greedy(plain)
    with ak.Engine(str(tiny_dir), device="cuda", dtype="float32", fused_ops=True) as fused:
        assert fused._core.runner.model.norm.fused is not None
        assert greedy(fused) == expected


def test_sampling_grammar_and_scores_on_cuda(tiny_dir):
    with ak.Engine(str(tiny_dir), device="cuda") as engine:
        params = ak.SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=12, repetition_penalty=1.2,
                                   frequency_penalty=0.5, logprobs=True, top_logprobs=2)
        a, b = engine.generate(PROMPTS[0], params), engine.generate(PROMPTS[0], params)
        assert a.token_ids == b.token_ids and len(a.completions[0].logprobs) == len(a.token_ids)
        out = engine.generate(PROMPTS[1], schema=TOOL_CALL, temperature=1.0, seed=3, max_tokens=200)
        assert out.finish_reason == "stop" and out.parsed["name"] == "get_weather"
        scores = engine.score(PROMPTS[2], [" words", " other"])
        assert len(scores) == 2 and all(s < 0 for s in scores[0])
