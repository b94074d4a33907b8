"""Logit biases and the repetition, frequency and presence penalties, applied to every row of a pass at once.

Each kind is one upload of its (row, token) pairs and a handful of ops for the whole batch. A loop over rows
made five or so small ops and an upload per row: on a GPU, that many kernel launches and host-to-device copies
a step at batch 64, all on the critical path between the forward pass and the sample. The values are those
of the per-row form, bit for bit (tests/engine/test_penalties.py checks them against it).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

from agentkv.engine.request import Request


def apply_penalties(logits: torch.Tensor, reqs: Sequence[Request], before: Sequence[list[int]] | None = None) -> None:
    """In place: logit biases; repetition (prompt and output), frequency and presence (output) penalties.
    `before` (speculation): per row, the draft tokens between its request's output and the row, which
    count as output."""
    more = before if before is not None else [[]] * len(reqs)
    dev, dt = logits.device, logits.dtype

    def pairs(per_row: list[tuple[int, list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, tokens): the k-th listed row's index repeated once per token of its, and the tokens."""
        sizes = [len(t) for _, t in per_row]
        # (output_size given: without it a GPU would stop the host to read the total back)
        k = torch.repeat_interleave(torch.arange(len(per_row), device=dev), torch.tensor(sizes, device=dev),
                                    output_size=sum(sizes))
        return k, torch.tensor(list(chain.from_iterable(t for _, t in per_row)), dtype=torch.int64, device=dev)

    biased = [(i, r.params.logit_bias) for i, r in enumerate(reqs) if r.params.logit_bias]
    if biased:  # (a request's biased tokens are distinct: SamplingParams keeps them as a mapping's items)
        rows = torch.tensor([i for i, bias in biased for _ in bias], dtype=torch.int64, device=dev)
        tokens = torch.tensor([t for _, bias in biased for t, _ in bias], dtype=torch.int64, device=dev)
        values = torch.tensor([b for _, bias in biased for _, b in bias], dtype=dt, device=dev)
        logits.index_put_((rows, tokens), values, accumulate=True)

    repeated = [(i, list(set(r.seen_ids()).union(more[i])) if more[i] else r.seen_ids())
                for i, r in enumerate(reqs) if r.params.repetition_penalty != 1.0]
    if repeated:  # each row's seen tokens once: divided where positive, multiplied where not
        k, tokens = pairs(repeated)
        rows = torch.tensor([i for i, _ in repeated], dtype=torch.int64, device=dev)[k]
        factor = torch.tensor([reqs[i].params.repetition_penalty for i, _ in repeated], dtype=dt, device=dev)[k]
        values = logits[rows, tokens]
        logits[rows, tokens] = torch.where(values > 0, values / factor, values * factor)

    counted = [(i, reqs[i].output_ids + more[i]) for i, r in enumerate(reqs)
               if (r.params.frequency_penalty or r.params.presence_penalty) and (r.output_ids or more[i])]
    if counted:  # each output token's count over the vocabulary, per row
        k, tokens = pairs(counted)
        counts = torch.zeros(len(counted), logits.shape[1], dtype=dt, device=dev)
        counts.index_put_((k, tokens), torch.ones_like(tokens, dtype=dt), accumulate=True)
        frequency = torch.tensor([reqs[i].params.frequency_penalty for i, _ in counted], dtype=dt, device=dev)
        presence = torch.tensor([reqs[i].params.presence_penalty for i, _ in counted], dtype=dt, device=dev)
        rows = torch.tensor([i for i, _ in counted], dtype=torch.int64, device=dev)
        logits[rows] -= frequency[:, None] * counts + presence[:, None] * (counts > 0).to(dt)
