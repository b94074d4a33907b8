"""The batched penalties (engine/penalties.py) against the per-row form they replace, bit for bit, on random
batches: biases, repetition over prompt and output (and a speculation row's draft tokens before it), frequency
and presence counts, rows with none of them between rows with all."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agentkv as ak
from agentkv.engine.penalties import apply_penalties
from agentkv.engine.request import Request

VOCAB = 40


def per_row(logits: torch.Tensor, reqs, before=None) -> None:
    """The reference: each row on its own (the engine's form before the batched one)."""
    for i, r in enumerate(reqs):
        p = r.params
        more = before[i] if before is not None else []
        if p.logit_bias:
            ids, biases = zip(*p.logit_bias)
            logits[i, list(ids)] += torch.tensor(biases, dtype=logits.dtype)
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(list(set(r.seen_ids()).union(more)) if more else r.seen_ids(), dtype=torch.int64)
            vals = logits[i, seen]
            logits[i, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.frequency_penalty or p.presence_penalty) and (r.output_ids or more):
            ids = torch.tensor(r.output_ids + more, dtype=torch.int64)
            counts = torch.bincount(ids, minlength=logits.shape[1]).to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


tokens = st.lists(st.integers(0, VOCAB - 1), max_size=12)
penalty = st.one_of(st.just(0.0), st.floats(-2.0, 2.0, allow_nan=False, width=32))
row = st.fixed_dictionaries({
    "prompt": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), "output": tokens, "draft": tokens,
    "repetition": st.one_of(st.just(1.0), st.floats(0.5, 2.0, width=32)), "frequency": penalty,
    "presence": penalty, "bias": st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-100, 100, width=32),
                                                 max_size=4)})


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=6), drafts=st.booleans(), seed=st.integers(0, 2**16))
def test_batched_penalties_equal_the_per_row_form(rows, drafts, seed):
    reqs = []
    for x in rows:
        r = Request(x["prompt"], ak.SamplingParams(repetition_penalty=x["repetition"], frequency_penalty=x["frequency"],
                                                   presence_penalty=x["presence"], logit_bias=x["bias"]),
                    0, frozenset(), 8)
        r.output_ids = list(x["output"])
        reqs.append(r)
    before = [x["draft"] for x in rows] if drafts else None
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    expected, got = logits.clone(), logits.clone()
    per_row(expected, reqs, before)
    apply_penalties(got, reqs, before)
    assert torch.equal(got, expected)
