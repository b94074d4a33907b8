"""Helpers that read logits out of a live engine, for comparison with HF transformers."""

from __future__ import annotations

import torch

import agentkv as ak
from agentkv.engine.request import Request
from agentkv.engine.sampler import sample


def engine_logits(engine: ak.Engine, ids: list[int], cached_prefix: int = 0,
                  adapter: str | None = None) -> tuple[torch.Tensor, int]:
    """Logits [len(ids) - p, V] for positions p.. of `ids`, where p tokens came from the radix cache
    (`adapter`: with that LoRA adapter).

    With `cached_prefix`, the first tokens are computed (and cached) by an earlier request, so the
    logits prove that attention over cached KV equals attention over fresh KV.
    """
    if cached_prefix:
        engine.generate(ids[:cached_prefix], max_tokens=1, temperature=0.0, adapter=adapter)
    core = engine._core
    lora = engine.adapters.resolve(adapter)

    def run():
        s = core.scheduler
        r = Request(list(ids), ak.SamplingParams(max_tokens=1, temperature=0.0), 0, frozenset(), 1, adapter=lora)
        s.add(r)
        batch = s.schedule()
        assert batch is not None and batch.reqs == [r], "the engine must be idle for this helper"
        logits = core.runner.run(batch, all_logits=True)
        s.process(batch, sample(logits[-1:], [r], engine.tokenizer).tokens, engine.tokenizer)
        s.abort(r)
        return logits, r.usage.cached_tokens

    return core.call(run).result()


def rel_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())


def assert_matches_hf(path, hf, text: str, new_tokens: int, **engine_options) -> None:
    """An engine over the checkpoint at `path` against HF's model `hf` of it: logits within 1e-4 of
    HF's fresh, over a 30-token prefix another request cached, and on the one-row route (all but the
    last token cached), and `new_tokens` greedy tokens equal to HF `generate`'s."""
    with ak.Engine(str(path), num_slots=2048, **engine_options) as engine:
        ids = engine.tokenizer.encode(text)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours, cached = engine_logits(engine, ids)
        assert cached == 0 and rel_error(ours, ref) < 1e-4
        out = engine.generate(ids, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    with ak.Engine(str(path), num_slots=2048, **engine_options) as engine:  # a fresh cache: the prefix from one
        ours, cached = engine_logits(engine, ids, cached_prefix=30)
        assert cached == 30 and rel_error(ours, ref[30:]) < 1e-4
        last, cached = engine_logits(engine, ids, cached_prefix=len(ids) - 1)  # one row: the batch-1 route
        assert cached == len(ids) - 1 and rel_error(last, ref[-1:]) < 1e-4
    x = torch.tensor([ids])
    expected = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=None)[0, len(ids):]
    assert out.token_ids == expected.tolist()


def assert_restart_restores(path, text: str, kv_dir) -> None:
    """The greedy tokens of `text` from a cold engine over the checkpoint at `path` equal those of an engine
    restarted over `kv_dir` that an earlier one wrote, at least 64 of the prompt's tokens read from disk."""
    with ak.Engine(str(path), num_slots=2048) as cold:
        expected = cold.generate(text, max_tokens=8, temperature=0.0).completions[0].token_ids
    tier = {"kv_dir": str(kv_dir), "kv_block_tokens": 16, "kv_warm_fraction": 0.0}
    with ak.Engine(str(path), num_slots=2048, **tier) as e:
        e.generate(text, max_tokens=8, temperature=0.0)
    with ak.Engine(str(path), num_slots=2048, **tier) as e:
        out = e.generate(text, max_tokens=8, temperature=0.0)
    assert out.usage.disk_cached_tokens >= 64 and out.completions[0].token_ids == expected
