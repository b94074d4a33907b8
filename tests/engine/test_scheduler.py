"""Scheduler decisions without a model: ordering, in-batch dedup, chunking, admission, retraction."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agentkv as ak
from agentkv.engine.config import SchedulerConfig
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.model_config import ModelConfig
from agentkv.engine.null_cache import NullPrefixCache
from agentkv.engine.radix_cache import RadixCache
from agentkv.engine.request import Request
from agentkv.engine.scheduler import Scheduler

CFG = ModelConfig(
    family="llama", vocab_size=64, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
    num_kv_heads=1, head_dim=4, rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=512,
    tie_word_embeddings=True, attention_bias=False, qk_norm=False,
)


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


def make(num_slots=1000, **cfg):
    pool = KVPool(CFG, num_slots, torch.float32)
    tree = RadixCache(pool.free, pin_budget=100)
    return Scheduler(SchedulerConfig(**cfg), pool, ReqToTokenPool(16, 512), tree)


def req(ids, max_tokens=8):
    return Request(list(ids), ak.SamplingParams(max_tokens=max_tokens, temperature=0.0), 0, frozenset(), max_tokens)


def run_step(s: Scheduler, token: int = 5):
    batch = s.schedule()
    if batch is not None:
        s.process(batch, [token] * sum(batch.sampling), FakeTokenizer())
    return batch


def finish_all(s: Scheduler):
    while s.has_work():
        run_step(s)


@pytest.mark.parametrize("lpm_max_queue,expected", [(128, ["warmer", "warm", "cold"]), (2, ["cold", "warm", "warmer"])])
def test_longest_prefix_first_then_fcfs_past_queue_limit(lpm_max_queue, expected):
    s = make(lpm_max_queue=lpm_max_queue)
    s.add(req([1, 2, 3, 4, 5, 6, 7, 8], max_tokens=1))
    finish_all(s)  # [1..8] is now cached
    waiting = {"cold": req([9, 9, 9, 9]), "warm": req([1, 2, 3, 9]), "warmer": req([1, 2, 3, 4, 5, 6, 9])}
    for r in waiting.values():  # arrival order: cold, warm, warmer
        s.add(r)
    assert run_step(s).reqs == [waiting[name] for name in expected]


def test_in_batch_dedup_defers_shared_uncached_prefix():
    s = make(dedup_min_tokens=8)
    shared = list(range(10, 50))
    a, b, c = req(shared + [1]), req(shared + [2]), req([7] * 12)
    for r in (a, b, c):
        s.add(r)
    first = run_step(s)
    assert first.reqs == [a, c] and s.stats.deferred_by_dedup == 1
    second = run_step(s)
    assert b in second.reqs and b.usage.cached_tokens == len(shared)  # a's prompt was cached after its prefill
    assert second.extend_lens[second.reqs.index(b)] == 1


def test_chunked_prefill_respects_step_budget():
    s = make(max_step_tokens=10)
    long, short = req(list(range(1, 26))), req([60, 61, 62])
    s.add(long)
    s.add(short)
    b1 = run_step(s)
    assert b1.reqs == [long] and b1.extend_lens == [10] and s.chunked is long
    b2 = run_step(s)
    assert b2.reqs == [long] and b2.extend_lens == [10]
    b3 = run_step(s)  # last 5 of long, then short fills the rest of the budget
    assert b3.reqs == [long, short] and b3.extend_lens == [5, 3] and s.chunked is None
    b4 = run_step(s)
    assert b4.num_decodes == 2 and b4.extend_lens == [1, 1]


def test_admission_waits_for_memory():
    s = make(num_slots=60, new_token_ratio=1.0, min_new_token_ratio=1.0)
    a, b = req(list(range(1, 31)), max_tokens=10), req(list(range(31, 61)), max_tokens=10)
    s.add(a)
    s.add(b)
    batch = run_step(s)
    assert batch.reqs == [a] and list(s.waiting) == [b]  # 30 + 10 reserved leaves no room for b's 40
    finish_all(s)
    assert a.finish_reason == "length" and b.finish_reason == "length"


def test_admission_counts_what_running_requests_were_promised():
    """A request arriving while another decodes waits for the room the running one's remaining
    tokens will take; admitting it anyway would force a retraction later."""
    s = make(num_slots=60, new_token_ratio=1.0, min_new_token_ratio=1.0)
    a = req(list(range(1, 31)), max_tokens=20)
    s.add(a)
    run_step(s)  # a runs: 30 slots used, 19 more tokens promised
    b = req(list(range(31, 41)), max_tokens=5)  # 10 + 5 does not fit in 30 free less 19 promised
    s.add(b)
    assert b not in run_step(s).reqs and list(s.waiting) == [b]
    finish_all(s)
    assert s.stats.retractions == 0
    assert a.output_ids == [5] * 20 and b.output_ids == [5] * 5


def test_retraction_when_decode_memory_runs_out():
    s = make(num_slots=40, new_token_ratio=0.1, min_new_token_ratio=0.1)
    a, b = req(list(range(1, 16)), max_tokens=20), req(list(range(20, 35)), max_tokens=20)
    s.add(a)
    s.add(b)
    finish_all(s)
    assert s.stats.retractions > 0
    assert a.output_ids == [5] * 20 and b.output_ids == [5] * 20
    assert s.pool.num_free + s.tree.total_size == s.pool.capacity and s.tree.protected_size == 0


def test_prompt_mid_prefill_gets_the_room_decodes_left():
    """b's admission counted its whole prompt, then a's decodes (promised at a low ratio) took part of
    that room: b's last chunk shrinks to what is free, then a is retracted for the rest of it."""
    s = make(num_slots=40, new_token_ratio=0.1, min_new_token_ratio=0.1, max_step_tokens=6)
    a, b = req(list(range(1, 6)), max_tokens=30), req(list(range(20, 49)), max_tokens=2)
    s.add(a)
    run_step(s)
    s.add(b)
    for _ in range(5):
        assert run_step(s).extend_lens == [1, 5]
    assert run_step(s).extend_lens == [1, 3]  # 4 of b's prompt left, 3 slots free
    assert run_step(s).reqs == [b] and s.stats.retractions == 1
    finish_all(s)
    assert a.output_ids == [5] * 30 and b.output_ids == [5] * 2
    assert s.pool.num_free + s.tree.total_size == s.pool.capacity and s.tree.protected_size == 0


def test_no_dedup_without_a_cache():
    pool = KVPool(CFG, 1000, torch.float32)
    s = Scheduler(SchedulerConfig(dedup_min_tokens=8), pool, ReqToTokenPool(16, 512), NullPrefixCache())
    shared = list(range(10, 50))
    a, b = req(shared + [1]), req(shared + [2])
    s.add(a)
    s.add(b)
    assert run_step(s).reqs == [a, b]  # deferring would gain nothing: b could never hit a cache
    finish_all(s)
    assert s.pool.num_free == s.pool.capacity


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=40))
def test_kv_pool_free_list_is_exact(ops):
    """Whatever the order of allocations and frees, the pool hands out each free slot once, never
    the padding slot, and takes back exactly what it gave."""
    pool = KVPool(CFG, 101, torch.float32)
    held: list[torch.Tensor] = []
    for alloc, n in ops:
        if alloc:
            got = pool.alloc(n)
            if got is None:
                assert n > pool.num_free
                continue
            held.append(got)
        elif held:
            pool.free(held.pop(n % len(held)))
        taken = torch.cat(held).tolist() if held else []
        assert len(set(taken)) == len(taken) and 0 not in taken
        assert pool.num_free == pool.capacity - len(taken)
    for h in held:
        pool.free(h)
    assert sorted(pool.alloc(pool.capacity).tolist()) == list(range(1, 101))


def test_waiting_does_not_keep_a_prefix_warm():
    """A request that waits (here: no request row free) is measured for the ordering every step,
    which must not count as a use: the prefix it shares with the cache is still the least recently
    used and goes first; once admitted, it counts."""
    s = make()
    s.kv.req_pool = ReqToTokenPool(1, 512)  # one request at a time
    for prompt in ([1, 1, 1, 1], [2, 2, 2, 2]):  # [1..] cached first: the older
        s.add(req(prompt, max_tokens=1))
        finish_all(s)
    blocker, waiter = req([7, 7, 7, 7], max_tokens=50), req([1, 1, 1, 1, 9], max_tokens=1)
    s.add(blocker)
    run_step(s)
    s.add(waiter)
    for _ in range(3):
        run_step(s)  # `waiter` waits behind `blocker`, ordered (measured) each step
    assert waiter in s.waiting
    s.tree.evict(4)  # the least recently used leaf goes: [1, 1, 1, 1], not [2, 2, 2, 2]
    assert s.tree.cached_length([1, 1, 1, 1]) < 4 and s.tree.cached_length([2, 2, 2, 2]) == 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=70), min_size=1, max_size=5),
       st.lists(st.integers(0, 2), min_size=0, max_size=70), st.integers(1, 80))
def test_the_dedup_check_finds_what_a_pairwise_scan_finds(others, mine, n):
    """`PrefixSet.holds(r, n)`: some request in progress begins with r's first n tokens rounded up to
    whole blocks, exactly as comparing r with each of them finds."""
    from agentkv.engine.radix_cache import _common_len
    from agentkv.engine.request import PREFIX_BLOCK, PrefixSet

    prefix = [5] * 24  # shared by all, so that matches past the first blocks happen often
    in_progress = [req(prefix + o) for o in others]
    r = req(prefix + mine)
    whole = -(-n // PREFIX_BLOCK) * PREFIX_BLOCK
    expected = r.seq_len >= whole and any(_common_len(r.all_ids, o.all_ids) >= whole for o in in_progress)
    assert PrefixSet(in_progress).holds(r, n) == expected
