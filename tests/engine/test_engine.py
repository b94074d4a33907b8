"""Engine behaviour on a tiny random model: memory pressure, seeds, stops, logprobs, n, errors, pins, streams."""

from __future__ import annotations

import asyncio
import threading

import pytest

import agentkv as ak

PROMPTS = [f"Request number {i}: tell me something about topic {i * 7 % 11}." for i in range(8)]


def greedy(engine, prompts, max_tokens=24):
    return [o.token_ids for o in engine.generate(prompts, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)]


def test_tiny_pool_evicts_and_retracts_with_same_outputs(tiny_dir, tiny_engine):
    expected = greedy(tiny_engine, PROMPTS)
    with ak.Engine(str(tiny_dir), num_slots=160, max_running_requests=8) as small:
        assert greedy(small, PROMPTS) == expected
        assert greedy(small, PROMPTS[::-1]) == expected[::-1]
        st = small.stats()
        assert st["retractions"] > 0 and st["evicted_tokens"] > 0
        assert st["running"] == 0 and st["free_slots"] + st["cached_tokens"] == st["total_slots"]


def test_eviction_keeps_the_head_of_a_prompt(tiny_dir, tiny_engine):
    """Room for another request is taken from the tail of the least recently used sequence, so its
    head (what the next request of that agent shares) stays cached and is reused exactly."""
    prompt = "A shared system prompt, then the question. " * 7
    expected = greedy(tiny_engine, [prompt])
    with ak.Engine(str(tiny_dir), num_slots=400) as small:
        first = small.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
        small.generate("Another agent entirely. " * 8, max_tokens=8, temperature=0.0, ignore_eos=True)
        evicted = small.stats()["evicted_tokens"]
        again = small.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
        assert [first.token_ids, again.token_ids] == expected * 2
        assert 0 < evicted < len(first.prompt_token_ids)  # the other request took part of the first's room
        assert again.usage.cached_tokens >= len(first.prompt_token_ids) + 24 - 1 - evicted  # all but what went


def test_chunked_prefill_matches_one_pass(tiny_dir, tiny_engine):
    prompt = "A long prompt. " * 12
    expected = greedy(tiny_engine, [prompt])
    with ak.Engine(str(tiny_dir), num_slots=2048, max_step_tokens=16) as chunked:
        out = chunked.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
        assert [out.token_ids] == expected
        assert out.usage.forward_passes == -(-len(out.prompt_token_ids) // 16) + 23


def test_seed_reproducible_across_batches(tiny_engine):
    params = ak.SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = tiny_engine.generate(PROMPTS[0], params).token_ids
    batched = tiny_engine.generate(PROMPTS[:5], params)[0].token_ids
    other_seed = tiny_engine.generate(PROMPTS[0], params.with_(seed=99)).token_ids
    assert alone == batched != other_seed


def test_filters_that_leave_one_token_equal_greedy(tiny_engine):
    (g,) = greedy(tiny_engine, [PROMPTS[1]], 16)
    for kw in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}):
        out = tiny_engine.generate(PROMPTS[1], max_tokens=16, temperature=1.5, seed=3, ignore_eos=True, **kw)
        assert out.token_ids == g, kw


def test_stop_string_spanning_tokens(tiny_engine):
    full = tiny_engine.generate(PROMPTS[2], max_tokens=30, temperature=0.0, ignore_eos=True)
    stop = full.text[10:13]  # byte tokens: a 3-character stop spans 3 tokens
    assert len(stop) == 3
    out = tiny_engine.generate(PROMPTS[2], max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop, "\x00never"])
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert len(out.token_ids) < len(full.token_ids)


def test_stop_token_ids_and_length(tiny_engine):
    full = tiny_engine.generate(PROMPTS[3], max_tokens=12, temperature=0.0, ignore_eos=True)
    assert full.finish_reason == "length" and len(full.token_ids) == 12
    tid = full.token_ids[4]
    out = tiny_engine.generate(PROMPTS[3], max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[tid])
    k = full.token_ids.index(tid)
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[: k + 1]
    assert out.text == tiny_engine.tokenizer.decode(full.token_ids[:k])


def test_logprobs(tiny_engine):
    out = tiny_engine.generate(
        PROMPTS[4], max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=3, ignore_eos=True)
    assert len(out.logprobs) == 6
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and len(lp.top) == 3
        assert lp.top[0][0] == tok and lp.top[0][2] == pytest.approx(lp.logprob)  # greedy picks the top
        assert lp.top[0][2] >= lp.top[1][2] >= lp.top[2][2] and lp.logprob <= 0


def test_n_completions_share_the_prompt(tiny_dir):
    with ak.Engine(str(tiny_dir), num_slots=2048) as engine:
        prompt = "Shared prompt for several samples, long enough to be worth sharing across forks."
        out = engine.generate(prompt, max_tokens=10, temperature=1.0, n=4, seed=11, ignore_eos=True)
        assert len(out.completions) == 4 and len({tuple(c.token_ids) for c in out.completions}) > 1
        n_prompt = len(out.prompt_token_ids)
        st = engine.stats()
        # the prompt is computed once; each fork recomputes only the last prompt token
        assert st["prefill_tokens_computed"] == n_prompt + 3
        again = engine.generate(prompt, max_tokens=10, temperature=1.0, n=4, seed=11, ignore_eos=True)
        assert [c.token_ids for c in again.completions] == [c.token_ids for c in out.completions]


def test_penalties_change_logits_exactly():
    import torch

    from agentkv.engine.penalties import apply_penalties
    from agentkv.engine.request import Request

    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    r = Request([0, 1], ak.SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25), 0,
                frozenset(), 8)
    r.output_ids = [2, 2]
    apply_penalties(logits, [r])
    # repetition on 0,1,2 (prompt + output); frequency 0.5 * 2 and presence 0.25 on token 2
    assert logits.tolist() == [[1.0, -4.0, 0.5 - 1.0 - 0.25, 0.5]]


def test_logit_bias_moves_the_choice(tiny_engine):
    """OpenAI's logit_bias: +100 makes a token all but certain at temperature 1, -100 all but
    impossible for greedy decoding; ids outside the vocabulary are a RequestError."""
    import torch

    from agentkv.engine.penalties import apply_penalties
    from agentkv.engine.request import Request

    logits = torch.zeros(1, 4)
    apply_penalties(logits, [Request([0], ak.SamplingParams(logit_bias={1: 5.0, 3: -2}), 0, frozenset(), 8)])
    assert logits.tolist() == [[0.0, 5.0, 0.0, -2.0]]
    forced = tiny_engine.generate("hi", max_tokens=6, temperature=1.0, seed=3, ignore_eos=True, logit_bias={7: 100})
    assert forced.completions[0].token_ids == [7] * 6
    plain = tiny_engine.generate("hi", max_tokens=1, temperature=0.0)
    first = plain.completions[0].token_ids[0]
    banned = tiny_engine.generate("hi", max_tokens=1, temperature=0.0, logit_bias={first: -100})
    assert banned.completions[0].token_ids[0] != first
    with pytest.raises(ak.RequestError, match="outside the vocabulary"):
        tiny_engine.generate("hi", logit_bias={10**6: 1})


def test_bad_inputs_raise_typed_errors_and_engine_keeps_serving(tiny_engine):
    with pytest.raises(ak.RequestError, match="empty"):
        tiny_engine.generate("")
    with pytest.raises(ak.RequestError, match="max_tokens"):
        tiny_engine.generate("hi", max_tokens=-1)
    with pytest.raises(ak.RequestError, match="context holds 512"):
        tiny_engine.generate("x" * 600)
    with pytest.raises(ak.RequestError, match="outside the vocabulary"):
        tiny_engine.generate([1, 2, 10**6])
    with pytest.raises(ak.RequestError, match="unknown sampling parameter"):
        tiny_engine.generate("hi", temprature=0.5)
    with pytest.raises(ak.RequestError, match="top_p"):
        ak.SamplingParams(top_p=0.0)
    with pytest.raises(ak.RequestError, match="unknown Engine option"):
        ak.Engine(num_slotz=5)
    with pytest.raises(ak.ModelLoadError, match="does not exist"):
        ak.Engine("/no/such/model")
    assert len(tiny_engine.generate("still serving", max_tokens=3, ignore_eos=True).token_ids) == 3


def test_pin_survives_pressure_and_unpin_releases(tiny_dir):
    system = "You are a pinned system prompt with tool definitions that must stay resident. " * 2
    with ak.Engine(str(tiny_dir), num_slots=400, pin_budget_fraction=0.5) as engine:
        handle = engine.pin(system)
        assert engine.stats()["pinned_tokens"] == handle.num_tokens == len(engine.tokenizer.encode(system))
        greedy(engine, PROMPTS)  # fills the pool and forces eviction
        out = engine.generate(system + "Question?", max_tokens=2)
        assert out.usage.cached_tokens == handle.num_tokens
        with pytest.raises(ak.PinBudgetError, match="budget"):
            engine.pin("y" * 300)
        engine.unpin(handle)
        assert engine.stats()["pinned_tokens"] == 0
        with pytest.raises(ak.CacheError):
            engine.unpin(handle)


def test_chat_pin_of_messages(tiny_engine):
    messages = [{"role": "system", "content": "Be brief."}]
    handle = tiny_engine.pin(messages)
    out = tiny_engine.chat(messages + [{"role": "user", "content": "hi"}], max_tokens=2)
    assert out.usage.cached_tokens >= handle.num_tokens
    tiny_engine.unpin(handle)


def test_stream_and_agenerate(tiny_engine):
    async def main():
        pieces, last = [], None
        async for d in tiny_engine.stream(PROMPTS[5], max_tokens=16, temperature=0.0, ignore_eos=True):
            pieces.append(d.text)
            last = d
        full = await tiny_engine.agenerate(PROMPTS[5], max_tokens=16, temperature=0.0, ignore_eos=True)
        return "".join(pieces), last, full

    text, last, full = asyncio.run(main())
    assert text == full.text and last.finish_reason == "length" and last.usage.completion_tokens == 16


def test_a_slow_stream_reader_still_gets_the_last_delta(tiny_engine):
    """The request finishes while the reader holds a delta: its last delta (finish_reason, usage,
    the completion) still comes."""

    async def read():
        deltas = []
        async for d in tiny_engine.stream("Once", max_tokens=12, temperature=0.0, ignore_eos=True):
            deltas.append(d)
            await asyncio.sleep(0.2)
        return deltas

    deltas = asyncio.run(read())
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion is not None
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert "".join(d.text for d in deltas) == deltas[-1].completion.text


def test_stream_cancel_frees_kv(tiny_dir):
    with ak.Engine(str(tiny_dir), num_slots=1024) as engine:
        idle = engine.stats()["free_slots"]

        async def consume_some():
            n = 0
            async for _ in engine.stream("a stream that the client abandons", max_tokens=200, ignore_eos=True):
                n += 1
                if n == 3:
                    break
            return n

        assert asyncio.run(consume_some()) == 3
        for _ in range(50):
            st = engine.stats()
            if st["running"] == 0:
                break
        assert st["running"] == 0 and st["waiting"] == 0
        assert st["free_slots"] + st["cached_tokens"] == idle  # nothing leaked: all KV is free or in the tree


def test_concurrent_callers(tiny_engine):
    expected = greedy(tiny_engine, PROMPTS, 12)
    results = {}

    def call(i):
        results[i] = tiny_engine.generate(PROMPTS[i], max_tokens=12, temperature=0.0, ignore_eos=True).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(PROMPTS))] == expected


def test_errors_survive_pickling():
    """Errors cross processes (Ray replicas to the ingress, tensor-parallel workers): each comes back
    as its own class with its fields."""
    import pickle

    from agentkv.server.protocol import APIError

    for e in [ak.OutputValidationError("bad", "{}", "stop"), ak.errors.ToolArgumentsError("f", "x: missing"),
              ak.errors.AgentRetriesError("gave up", "{}", ["a", "b"]), ak.GrammarError("no", "#/pattern"),
              APIError(400, "temperature: too low", "temperature")]:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and vars(back) == vars(e)


def test_without_the_radix_cache_every_slot_comes_back(tiny_dir, tiny_engine):
    """enable_radix_cache=False (a NullPrefixCache): the same outputs as with the cache, nothing
    cached, every slot free once the requests finish (retractions under a small pool included), and
    the cache's own features refused with a message naming the option."""
    prompts = [f"story {i}: once upon a time" for i in range(6)]
    want = [o.text for o in tiny_engine.generate(prompts, temperature=0.0, max_tokens=24)]
    with ak.Engine(str(tiny_dir), num_slots=160, enable_radix_cache=False) as plain:
        for _ in range(2):
            assert [o.text for o in plain.generate(prompts, temperature=0.0, max_tokens=24)] == want
            st = plain.stats()
            assert st["free_slots"] == st["total_slots"] and st["cached_tokens"] == st["pins"] == 0
            assert st["cached_prompt_tokens"] == 0
        for call in (lambda: plain.pin("a prefix"), lambda: plain.prefill("a prefix")):
            with pytest.raises(ak.RequestError, match="enable_radix_cache=True"):
                call()


def test_a_pin_with_a_lifetime_is_renewed_by_use_then_ends(tiny_dir):
    """ttl_s: a request through the pinned prefix renews it; idle past its time, it is released on its
    own (the engine wakes for it), counted, and unpinning it then is a no-op."""
    import time

    prefix = "You are the pinned agent. " * 6
    with ak.Engine(str(tiny_dir), num_slots=1024) as engine:
        pin = engine.pin(prefix, ttl_s=0.6)
        for _ in range(3):  # 0.9 s in all, each request within the time to live: it stays
            time.sleep(0.3)
            engine.generate(prefix + "go", max_tokens=2)
        st = engine.stats()
        assert st["pins"] == 1 and st["pin_expiries"] == 0 and [p.id for p in engine.pins()] == [pin.id]
        time.sleep(1.0)  # idle: nothing renews it
        st = engine.stats()
        assert st["pins"] == 0 and st["pin_expiries"] == 1 and st["pinned_tokens"] == 0 and engine.pins() == []
        engine.unpin(pin)  # already released: nothing to do
        with pytest.raises(ak.RequestError, match="ttl_s"):
            engine.pin(prefix, ttl_s=0)


def test_explain_miss_names_where_two_conversations_part(tiny_engine):
    system = {"role": "system", "content": "It is 10:41 now. You keep records."}
    turn = [{"role": "user", "content": "What is on the list?"}]
    assert tiny_engine.explain_miss([system, *turn], [system, *turn, {"role": "assistant", "content": "x"}]) is None
    later = tiny_engine.explain_miss([system, *turn], [{**system, "content": "It is 10:42 now. You keep records."},
                                                      *turn])
    assert later["message"] == 0 and later["section"] == "system" and later["cached"].startswith("1")
