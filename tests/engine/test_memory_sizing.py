"""The KV pool sized from the memory there is (memory_fraction, SGLang's mem-fraction), and stats()
reporting weights, KV and free memory."""

from __future__ import annotations

import pytest

import agentkv as ak
from agentkv.engine import memory as memory_module
from agentkv.engine.memory import KVPool


def test_pool_takes_the_fraction_of_available_memory(tiny_dir, monkeypatch):
    monkeypatch.setattr(memory_module, "available_ram", lambda: 1 << 30)  # 1 GiB free, whatever the machine
    with ak.Engine(str(tiny_dir), memory_fraction=0.01) as e:
        st = e.stats()
        per_token = KVPool.bytes_per_token(e._core.runner.model.config, e._core.runner.model.embed_tokens.weight.dtype)
        context = e.context_length
        assert st["total_slots"] + 1 == min(
            int(0.01 * (1 << 30)) // per_token, memory_module.MAX_POOL_CONTEXTS * context)
        assert st["kv_bytes"] == (st["total_slots"] + 1) * per_token
        assert 0 < st["weight_bytes"] and st["free_memory_bytes"] == 1 << 30


def test_too_little_memory_for_one_context_says_what_to_change(tiny_dir, monkeypatch):
    monkeypatch.setattr(memory_module, "available_ram", lambda: 1 << 20)
    with pytest.raises(ak.RequestError, match="memory_fraction.*context_length.*num_slots"):
        ak.Engine(str(tiny_dir), memory_fraction=0.001)
    with pytest.raises(ak.RequestError, match="memory_fraction must be in"):
        ak.Engine(str(tiny_dir), memory_fraction=1.5)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "float16"])
def test_a_pool_of_another_dtype_is_sized_by_its_own_element(tiny_dir, monkeypatch, kv_dtype):
    """kv_dtype apart from the model's (fp32): the slots are the budget over the pool's own bytes a token,
    and the tensors hold that dtype (checked against a planted bug that sized the pool with the model's
    element size: a bfloat16 pool then got half its slots)."""
    import torch

    monkeypatch.setattr(memory_module, "available_ram", lambda: 1 << 30)
    with ak.Engine(str(tiny_dir), memory_fraction=0.01, kv_dtype=kv_dtype) as e:
        st, mc = e.stats(), e._core.runner.model.config
        assert e._core.runner.model.embed_tokens.weight.dtype == torch.float32
        per_token = KVPool.bytes_per_token(mc, getattr(torch, kv_dtype))
        budget = int(0.01 * (1 << 30))
        assert st["total_slots"] + 1 == min(budget // per_token, memory_module.MAX_POOL_CONTEXTS * e.context_length)
        assert st["kv_bytes"] == (st["total_slots"] + 1) * per_token <= budget  # the tensors as sized
        assert e._core.runner.pool.kv_caches[0][0].dtype == getattr(torch, kv_dtype)
