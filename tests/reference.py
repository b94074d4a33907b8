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
