"""The KV cache keyed by adapter: two adapters never share a prefix's KV (each answer is a cold engine's), the
base shares across its requests, an adapter shares with itself, pins carry the adapter, and an adapter
reloaded with new weights under the same name misses in the pool and on disk, while one of the same content
finds its KV on disk after a restart. The radix tree's namespaces checked alone too."""

from __future__ import annotations

import pytest
import torch

import agentkv as ak
from agentkv.engine.radix_cache import RadixCache
from tests.lora_helpers import make_adapter
from tests.reference import engine_logits, rel_error
from tests.tiny import make_tiny_model

pytest.importorskip("peft")
PROMPT = "".join(f"Rule {i}: answer briefly and cite the tool you used. " for i in range(6))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_cache")
    base = make_tiny_model(tmp / "llama", "llama")
    return base, {name: make_adapter(base, tmp / name, seed=seed) for name, seed in (("a1", 1), ("a2", 2), ("a3", 3))}


def _run(engine: ak.Engine, adapter: str | None, prompt: str = PROMPT) -> tuple[list[int], ak.Usage]:
    out = engine.generate(prompt, max_tokens=8, temperature=0.0, ignore_eos=True, adapter=adapter)
    return out.token_ids, out.usage


def test_two_adapters_never_share_kv_and_each_shares_with_itself(setup):
    base, adapters = setup
    cold = {}
    for name in (None, "a1", "a2"):
        with ak.Engine(str(base), num_slots=4096, lora={"a1": str(adapters["a1"]), "a2": str(adapters["a2"])}) as e:
            cold[name] = engine_logits(e, e.tokenizer.encode(PROMPT), adapter=name)[0]
    with ak.Engine(str(base), num_slots=4096, lora={"a1": str(adapters["a1"]), "a2": str(adapters["a2"])}) as e:
        ids = e.tokenizer.encode(PROMPT)
        first = _run(e, None)[1]
        assert first.cached_tokens == 0
        assert _run(e, None)[1].cached_tokens == len(ids) - 1  # the base shares with the base
        for name in ("a1", "a2"):
            # the same prompt as the base's and the other adapter's: nothing of theirs is read
            logits, cached = engine_logits(e, ids, adapter=name)
            assert cached == 0 and rel_error(logits, cold[name]) < 1e-5  # (the same numbers as a cold engine's)
            assert _run(e, name)[1].cached_tokens == len(ids) - 1  # ... and it shares with itself
        logits, cached = engine_logits(e, ids)
        assert cached == len(ids) - 1 and rel_error(logits, cold[None][-1:]) < 1e-5
        # a prompt that continues the cached one: its adapter's KV, as far as it goes
        longer, cached = engine_logits(e, ids + e.tokenizer.encode(" More."), adapter="a2")
        assert cached == len(ids)


def test_pins_carry_the_adapter(setup):
    base, adapters = setup
    with ak.Engine(str(base), num_slots=4096, lora={"a1": str(adapters["a1"])}) as e:
        handle = e.pin(PROMPT, adapter="a1")
        assert e.stats()["pinned_tokens"] == handle.num_tokens
        e.flush_cache()  # the pinned prefix stays; nothing else is held
        assert _run(e, None, PROMPT + " Go.")[1].cached_tokens == 0
        assert _run(e, "a1", PROMPT + " Go.")[1].cached_tokens >= handle.num_tokens
        e.unpin(handle)
        with pytest.raises(ak.UnknownAdapterError):
            e.pin(PROMPT, adapter="nope")


def test_a_reloaded_adapter_with_new_weights_misses_in_the_pool_and_on_disk(setup, tmp_path):
    base, adapters = setup
    kv_dir = tmp_path / "kv"
    with ak.Engine(str(base), num_slots=4096, kv_dir=str(kv_dir), lora={"a1": str(adapters["a1"])}) as e:
        ids = e.tokenizer.encode(PROMPT)
        old_out = _run(e, "a1")[0]
        e.unload_lora("a1")
        e.load_lora("a1", adapters["a3"])  # the same name, other weights
        logits, cached = engine_logits(e, ids, adapter="a1")
        assert cached == 0
        e.flush_cache()  # everything to disk
        new_out, usage = _run(e, "a1")
        assert usage.cached_tokens > 0  # its own KV, read back from disk...
        assert usage.disk_cached_tokens == usage.cached_tokens
        e.unload_lora("a1")
        e.load_lora("a1", adapters["a1"])  # the first weights again: their KV on disk is theirs
        again, usage = _run(e, "a1")
        assert usage.disk_cached_tokens > 0 and again == old_out
    with ak.Engine(str(base), num_slots=4096, lora={"a1": str(adapters["a3"])}) as cold:
        cold_logits = engine_logits(cold, ids, adapter="a1")[0]
        cold.flush_cache()
        assert _run(cold, "a1")[0] == new_out
    assert rel_error(logits, cold_logits) < 1e-5
    # a restart with the adapter loaded finds its KV on disk; under another adapter's content it is not read
    with ak.Engine(str(base), num_slots=4096, kv_dir=str(kv_dir), lora={"x": str(adapters["a3"])}) as e:
        out, usage = _run(e, "x")
        assert usage.disk_cached_tokens > 0 and out == new_out
        assert _run(e, None)[1].cached_tokens == 0  # the base never ran it: the adapter's blocks are not its


def test_the_trees_namespaces_alone():
    freed = []
    tree = RadixCache(freed.append, pin_budget=100, evict_granule=1)
    slots = lambda a, b: torch.arange(a, b)  # noqa: E731
    tokens = [5, 6, 7, 8, 9, 10]
    assert tree.insert(tokens, slots(0, 6)) == 0
    assert tree.insert(tokens, slots(6, 12), ns="aa") == 0  # the same tokens, another namespace: not cached
    assert tree.insert(tokens[:4], slots(12, 16), ns="aa") == 4
    assert tree.insert(tokens, slots(16, 22), ns="bb") == 0
    assert tree.cached_length(tokens) == tree.cached_length(tokens, ns="aa") == 6
    assert tree.cached_length(tokens, ns="cc") == 0 and tree.continuation([], 3, ns="cc") == []
    got, node = tree.match_prefix(tokens, ns="aa")
    assert got.tolist() == list(range(6, 12)) and tree.namespace(node) == "aa"
    assert tree.match_prefix(tokens)[0].tolist() == list(range(6))
    assert tree.continuation(tokens[:2], 2, ns="bb") == [7, 8] and tree.continuation([], 2) == [5, 6]
    assert tree.total_size == 18 and tree.evictable_size == 18 and len(tree.nodes()) == 4  # (aa's split at 4)
    assert all(n.key for n in tree.nodes())
    tree.pin(tokens[:3], ns="bb")
    assert tree.pin_records()[0][0] == tokens[:3] and tree.pin_records()[0][3] == "bb"
    assert tree.evict(18) == 15  # everything but the pinned head of bb's path
    assert tree.cached_length(tokens, ns="bb") == 3 and tree.cached_length(tokens) == 0
    assert tree.evictable_size + tree.protected_size == tree.total_size == 3


def test_an_agent_on_an_adapter_runs_and_pins_there(tmp_path):
    base = make_tiny_model(tmp_path / "m", chat="qwen2.5", max_positions=4096, seed=3)
    adapter = make_adapter(base, tmp_path / "a", seed=1, scale=4.0)
    with ak.Engine(str(base), num_slots=8192, lora={"support": str(adapter)}) as e:
        tuned = ak.Agent("Answer in one short sentence.", engine=e, adapter="support", temperature=0.0, max_tokens=24)
        plain = ak.Agent("Answer in one short sentence.", engine=e, temperature=0.0, max_tokens=24)
        out = tuned.run_sync("Name a color.").output
        assert out == e.chat([{"role": "system", "content": "Answer in one short sentence."},
                              {"role": "user", "content": "Name a color."}], max_tokens=24, temperature=0.0,
                             adapter="support").text
        assert out != plain.run_sync("Name a color.").output
        namespaces = {record[3] for record in e._core.call(lambda: e._tree.pin_records()).result()}
        assert namespaces == {None, e.loras()[0].hash}  # each agent's system prompt pinned in its own cache
        tuned.close(), plain.close()
