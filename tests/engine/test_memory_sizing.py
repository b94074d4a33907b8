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
