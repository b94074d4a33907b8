"""What the scheduler hands a forward pass (ScheduledBatch), and what it counts (SchedulerStats)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from agentkv.engine.request import Request


@dataclass
class ScheduledBatch:
    reqs: list[Request]  # decodes first, then extends
    extend_lens: list[int]
    num_decodes: int
    out_cache_loc: torch.Tensor  # [sum(extend_lens)] slots for the new tokens
    num_jumps: int = 0  # after the decodes: running requests extending their jump-forward tokens
    # fixed when scheduled, since requests move on before the pass is processed (overlap):
    starts: list[int] = field(default_factory=list)  # position of each request's first new token
    sampling: list[bool] = field(default_factory=list)  # whether it samples a token from this pass
    # new tokens whose id a pass still in flight samples: (index in reqs, that pass's sampling row)
    placeholders: list[tuple[int, int]] = field(default_factory=list)
    live: list[bool] = field(default_factory=list)  # per sampling row: its token is still wanted
    drafts: dict[int, list[int]] = field(default_factory=dict)  # index in reqs -> the draft its extend checks
    seq: int = 0  # launch order

    @property
    def sampling_reqs(self) -> list[Request]:
        return [r for r, s in zip(self.reqs, self.sampling) if s]

    @functools.cached_property
    def score_positions(self) -> list[tuple[Request, int]]:
        """(request, position) pairs whose logits score the token after them, for scoring requests
        (prefill-only requests with `score_from`), in batch order (read once the batch is launched,
        by the runner, the pass and the engine loop: made once)."""
        out = []
        for r, start, n in zip(self.reqs, self.starts, self.extend_lens):
            if r.score_from is not None:
                out += [(r, p) for p in range(max(start, r.score_from - 1), min(start + n, r.seq_len - 1))]
        return out


@dataclass
class SchedulerStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0
    forward_passes: int = 0
    retractions: int = 0
    deferred_by_dedup: int = 0
    jump_forward_tokens_computed: int = 0  # forced tokens computed in extends instead of decode steps
    draft_tokens: int = 0  # speculative decoding: draft tokens checked
    accepted_draft_tokens: int = 0  # of those, kept
