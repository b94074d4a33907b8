"""The scheduler's bookkeeping under overlap, without a model: a fake device that checks every slot it
reads holds the K/V of the right prefix.

Each slot's "K/V" is a hash of the token prefix it was computed for; a pass reads its requests' slots
through the slot table, checks each one, writes its new slots, and samples a token that is a hash of
the whole sequence (0 is EOS). The same random workloads (shared prefixes, arrivals over time, small
pools that force eviction and retraction, chunked prefill) run with each pass processed at once and
pipelined as with overlap (pass n+1 scheduled before pass n is processed): outputs must be equal,
every read must find its prefix, and all memory must come back.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import example, given, settings

import agentkv as ak
from agentkv.engine.batch import ScheduledBatch
from agentkv.engine.config import SchedulerConfig
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.radix_cache import RadixCache
from agentkv.engine.request import Request
from agentkv.engine.scheduler import Scheduler
from tests.engine.test_scheduler import CFG, FakeTokenizer

VOCAB = 50


def h(ids) -> int:
    return hash(tuple(ids)) & 0x7FFFFFFF


class FakeDevice:
    """Runs a pass when it is launched (`late=False`: done before the host moves on) or only when the
    host collects its tokens (`late=True`: as late as a device may be, after the host has scheduled the
    next pass and freed or reused whatever it thinks is free)."""

    def __init__(self, s: Scheduler, late: bool):
        self.s, self.late = s, late
        self.kv: dict[int, int] = {}  # slot -> hash of the prefix its K/V belongs to
        self.truth: dict[int, list[int]] = {}  # request id -> prompt + every token sampled for it
        self.prev_tokens: list[int] = []

    def launch(self, b: ScheduledBatch):
        rows = [r.row for r in b.reqs]  # read when launched, as ModelRunner.prepare does
        return [b, rows, None] if self.late else [b, rows, self.run(b, rows)]

    def collect(self, handle) -> list[int]:
        if handle[2] is None:
            handle[2] = self.run(handle[0], handle[1])
        return handle[2]

    def run(self, b: ScheduledBatch, rows: list[int]) -> list[int]:
        tokens, loc = [], 0
        table = self.s.req_pool.table
        resolved = dict(b.placeholders)
        for i, (r, row, start, n, samples) in enumerate(zip(b.reqs, rows, b.starts, b.extend_lens, b.sampling)):
            seq = self.truth.setdefault(r.rid, list(r.prompt_ids))
            known = len(r.prompt_ids) + len(r.output_ids)
            if i in resolved:  # its last input is the previous pass's token for it
                assert seq[start + n - 1] == self.prev_tokens[resolved[i]]
            else:
                assert start + n <= known
            for p in range(start):
                assert self.kv.get(int(table[row, p])) == h(seq[: p + 1]), f"request {r.rid} reads a wrong slot at {p}"
            for p in range(start, start + n):
                slot = int(b.out_cache_loc[loc])
                assert int(table[row, p]) == slot and slot != 0
                self.kv[slot] = h(seq[: p + 1])
                loc += 1
            if samples:
                token = h(seq[: start + n]) % VOCAB
                tokens.append(token)
                if len(seq) == start + n:  # a row whose token is thrown away adds nothing real
                    seq.append(token)
        self.prev_tokens = tokens
        return tokens


def run(workload, num_slots: int, step_tokens: int, pipelined: bool, late: bool = False):
    pool = KVPool(CFG, num_slots, torch.float32)
    tree = RadixCache(pool.free, pin_budget=0)
    s = Scheduler(SchedulerConfig(max_step_tokens=step_tokens), pool, ReqToTokenPool(8, 512), tree)
    device = FakeDevice(s, late)
    reqs = [(at, Request(list(prompt), ak.SamplingParams(max_tokens=m), 0, frozenset({0}), m))
            for at, prompt, m in workload]
    tok, prev, step = FakeTokenizer(), None, 0
    while True:
        for at, r in reqs:
            if at == step:
                s.add(r)
        step += 1
        batch = s.schedule()
        if batch is None and prev is None:
            if step > max(at for at, _ in reqs) and not s.has_work():
                break
            continue
        launched = device.launch(batch) if batch is not None else None
        if pipelined:
            if prev is not None:
                s.process(prev[0], device.collect(prev), tok, None, batch)
            prev = launched
        else:
            s.process(batch, device.collect(launched), tok)
        assert step < 5000, "no progress"
    assert not s.flight.batches and not s.flight.held_rows and s.req_pool.num_free == 8
    assert pool.num_free + tree.total_size == pool.capacity, "slots leaked"
    return [(r.output_ids, r.finish_reason) for _, r in reqs], s.stats.retractions


prefixes = st.sampled_from([[], [7] * 30, list(range(1, 41)), [3, 9] * 12])
request = st.tuples(st.integers(0, 6), prefixes, st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=25),
                    st.integers(1, 24))


@settings(max_examples=60, deadline=None)
# decodes took the room the prompt mid-prefill was admitted with (it crashed once)
@example([(0, [7] * 30, [1], 1), (1, [], [1, 1], 12), (1, list(range(1, 41)), [1], 1), (0, [7] * 30, [1, 1], 14),
          (0, [7] * 30, [2, 1, 1, 1, 1, 1, 1], 14), (0, [], [2] + [1] * 10, 11)], 140, 8)
@given(st.lists(request, min_size=1, max_size=8), st.sampled_from([140, 200, 400]), st.sampled_from([8, 24, 64]))
def test_pipelined_passes_equal_step_by_step(reqs, num_slots, step_tokens):
    workload = [(at, prefix + tail, m) for at, prefix, tail, m in reqs]
    sync, _ = run(workload, num_slots, step_tokens, pipelined=False)
    assert run(workload, num_slots, step_tokens, pipelined=True)[0] == sync
    assert run(workload, num_slots, step_tokens, pipelined=True, late=True)[0] == sync


def test_pipelined_retractions_keep_outputs():
    workload = [(0, [5] * 20 + [i + 1] * 10, 40) for i in range(6)]
    sync, retracted_sync = run(workload, 150, 64, pipelined=False)
    for late in (False, True):
        pipelined, retracted = run(workload, 150, 64, pipelined=True, late=late)
        assert retracted > 0 and retracted_sync > 0
        assert pipelined == sync
