"""Overlap scheduling: the host schedules pass n+1 and takes pass n's tokens while a worker thread
runs the model. Every output must be the one the engine gives without overlap: same tokens, text,
finish reasons and logprobs, under memory pressure, chunked prefill, grammars with jump-forward,
seeds, stop strings and `n` forks; and a failed pass must free its memory in both modes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import agentkv as ak
from tests.test_structured import TOOL_CALL

SYSTEM = "You are a helpful agent with tools. Answer briefly. "


def workload() -> list[tuple[str, ak.SamplingParams]]:
    """Requests that finish at different steps and for different reasons, sharing a system prompt."""
    greedy = ak.SamplingParams(temperature=0.0, ignore_eos=True)
    items = []
    for i in range(6):
        items.append((SYSTEM + f"Question {i}: what is {i} plus {i * 3}?", greedy.with_(max_tokens=5 + 4 * i)))
    items += [
        (SYSTEM + "Stop early.", greedy.with_(max_tokens=40, stop=["e", "a"])),
        (SYSTEM + "With logprobs.", greedy.with_(max_tokens=12, logprobs=True, top_logprobs=3)),
        (SYSTEM + "Sampled.", ak.SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=30)),
        (SYSTEM + "Two samples.", ak.SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=16, ignore_eos=True)),
        (SYSTEM + "Call a tool.", ak.SamplingParams(temperature=0.0, json_schema=TOOL_CALL, max_tokens=200)),
        (SYSTEM + "Call it again.", ak.SamplingParams(temperature=1.0, seed=11, json_schema=TOOL_CALL, max_tokens=200)),
        (SYSTEM + "Phone:", ak.SamplingParams(temperature=1.0, seed=5, regex=r"\(\d{3}\) \d{3}-\d{4}", max_tokens=40)),
        ("Free text that may stop at EOS.", ak.SamplingParams(temperature=1.0, seed=2, max_tokens=60)),
    ]
    return items


def run(engine: ak.Engine) -> list[tuple]:
    """Submit the whole workload at once (the same batches in both modes) and read every completion."""
    groups = [engine._make_requests(engine._encode(p), params) for p, params in workload()]
    engine._run_to_end([r for g in groups for r in g])
    outs = [engine._output(g) for g in groups]
    return [(c.token_ids, c.text, c.finish_reason, c.logprobs or []) for o in outs for c in o.completions]


def assert_same(ours, ref):
    for (ids, text, reason, lps), (ids_r, text_r, reason_r, lps_r) in zip(ours, ref, strict=True):
        assert (ids, text, reason) == (ids_r, text_r, reason_r)
        # logprobs to float noise: a pass scheduled before the previous one's prompt went into the radix
        # tree may read the same K/V through other slots, on another attention route
        for lp, lp_r in zip(lps, lps_r, strict=True):
            assert lp.token_id == lp_r.token_id and lp.logprob == pytest.approx(lp_r.logprob, abs=1e-4)
            assert [t for t, _, _ in lp.top] == [t for t, _, _ in lp_r.top]
            assert [v for _, _, v in lp.top] == pytest.approx([v for _, _, v in lp_r.top], abs=1e-4)


@pytest.mark.parametrize("options", [
    {"num_slots": 4096},
    {"num_slots": 300, "max_running_requests": 8},  # evictions and retractions
    {"num_slots": 4096, "max_step_tokens": 24},  # chunked prefill, passes mixing decodes and chunks
], ids=["roomy", "pressure", "chunked"])
def test_overlap_on_equals_off(tiny_dir, options):
    results, stats = {}, {}
    for overlap in (False, True):
        with ak.Engine(str(tiny_dir), overlap_schedule=overlap, **options) as engine:
            results[overlap] = run(engine)
            results[overlap, "again"] = run(engine)  # now with the system prompt cached
            st = stats[overlap] = engine.stats()
            assert st["running"] == 0 and st["waiting"] == 0
            assert st["free_slots"] + st["cached_tokens"] == st["total_slots"], "a pass leaked slots"
    assert_same(results[True], results[False])
    assert_same(results[True, "again"], results[False, "again"])
    assert stats[True]["jump_forward_tokens_computed"] > 0
    if options["num_slots"] < 1000:
        assert stats[True]["retractions"] > 0 or stats[True]["evicted_tokens"] > 0


def test_overlap_keeps_passes_in_flight(tiny_dir, monkeypatch):
    """With overlap, each pass is launched before the previous one's tokens are taken."""
    from agentkv.engine import core

    order = []
    real_finish = core.EngineCore._finish

    def finish(self, p, after):
        order.append((p.batch.seq, after.batch.seq if after is not None else None))
        return real_finish(self, p, after)

    monkeypatch.setattr(core.EngineCore, "_finish", finish)
    with ak.Engine(str(tiny_dir), num_slots=2048, overlap_schedule=True) as engine:
        engine.generate(["a", "bb"], max_tokens=6, temperature=0.0, ignore_eos=True)
    assert len(order) == 6 and all(after == seq + 1 for seq, after in order[:-1]), order


def _third_call_raises(real, error: Exception):
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise error
        return real(*args, **kwargs)

    return flaky


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("where", ["forward", "processing"])
def test_failed_pass_frees_memory_and_engine_continues(tiny_dir, monkeypatch, overlap, where):
    """A pass raises in its forward, or while its tokens are taken (processing raises after the pass
    was retired): its requests fail, their memory comes back, and the engine serves the next request."""
    from agentkv.engine.request import Request

    with ak.Engine(str(tiny_dir), num_slots=1024, overlap_schedule=overlap) as engine:
        idle = engine.stats()["free_slots"]
        if where == "forward":
            runner = engine._core.runner
            monkeypatch.setattr(runner, "forward", _third_call_raises(runner.forward, RuntimeError("injected")))
        else:
            monkeypatch.setattr(Request, "append_token", _third_call_raises(
                Request.append_token, AssertionError("injected while taking a token")))
        with pytest.raises(ak.EngineError, match="injected"):
            engine.generate("this request fails mid-decode", max_tokens=10, ignore_eos=True)
        st = engine.stats()
        assert st["running"] == 0 and st["free_slots"] + st["cached_tokens"] == idle
        assert len(engine.generate("next one works", max_tokens=4, ignore_eos=True).token_ids) == 4
        assert engine.stats()["free_slots"] + engine.stats()["cached_tokens"] == idle


def test_overlap_on_cpu_keeps_the_engine_thread_to_one_torch_thread(tiny_dir):
    """With overlap on CPU the forward worker builds and runs the model with the process's torch
    threads, while the engine thread runs its own torch ops on one (no second OpenMP pool beside the
    worker's); threads started later still take the process's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ak.Engine(str(tiny_dir), overlap_schedule=True) as engine:
            core = engine._core
            assert core.call(torch.get_num_threads).result() == 1
            assert core.passes._worker.submit(torch.get_num_threads).result() == 2
            with ThreadPoolExecutor(1) as other:
                assert other.submit(torch.get_num_threads).result() == 2
            assert engine.generate("Hello", max_tokens=4, temperature=0.0, ignore_eos=True).token_ids
        with ak.Engine(str(tiny_dir), overlap_schedule=False) as engine:
            assert engine._core.call(torch.get_num_threads).result() == 2
    finally:
        torch.set_num_threads(before)
