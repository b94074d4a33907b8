"""CUDA graphs for decode passes, checked on CPU: the static buffers, bucket padding and the Triton
backend's fixed-grid decode run eagerly (`capture=False`; the kernels in interpreter mode) and must
give the engine's outputs without them. Capture and replay themselves need a GPU (benchmarks/gpu.sh).
"""

from __future__ import annotations

import pytest

import agentkv as ak
from agentkv.engine.cuda_graphs import DecodeGraphs, default_buckets


def test_buckets():
    assert default_buckets(1) == [1]
    assert default_buckets(8) == [1, 2, 4, 8]
    assert default_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert default_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def test_cuda_graphs_config_errors(tiny_dir):
    with pytest.raises(ak.RequestError, match="needs a CUDA device"):
        ak.Engine(str(tiny_dir), cuda_graphs=True)
    with pytest.raises(ak.RequestError, match="cuda_graph_max_batch"):
        ak.Engine(str(tiny_dir), cuda_graph_max_batch=0)
    with ak.Engine(str(tiny_dir), num_slots=256) as engine:  # CPU: off by default
        assert engine._core.runner.graphs is None


def test_padded_graph_decode_equals_eager(tiny_dir):
    prompts = [f"graph request {i}: " + "x" * (3 * i) for i in range(5)]
    with ak.Engine(str(tiny_dir), num_slots=2048, attention_backend="triton") as engine:
        expected = [engine.generate(prompts[:n], max_tokens=6, temperature=0.0, ignore_eos=True) for n in (1, 3, 5)]
        runner = engine._core.runner
        graphs = engine._core.call(lambda: DecodeGraphs(runner, 8, engine.context_length, capture=False)).result()
        runner.graphs = graphs
        got = [engine.generate(prompts[:n], max_tokens=6, temperature=0.0, ignore_eos=True) for n in (1, 3, 5)]
        # batches of 3 and 5 run padded to 4 and 8, with the padding rows' K/V written to slot 0
        assert graphs.replays == 3 * 5
        st = engine.stats()
        assert st["running"] == 0 and st["free_slots"] + st["cached_tokens"] == st["total_slots"]
    for exp, out in zip(expected, got):
        assert [o.token_ids for o in out] == [o.token_ids for o in exp]
