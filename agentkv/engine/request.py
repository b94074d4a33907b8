"""A request's state inside the engine: its tokens, its KV bookkeeping, its output so far."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from agentkv.engine.outputs import TokenLogprob, Usage
from agentkv.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from agentkv.engine.radix_cache import TreeNode
    from agentkv.engine.tokenizer import Tokenizer

_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    eos_ids: frozenset[int]
    max_new_tokens: int  # params.max_tokens, capped by the context length
    prefill_only: bool = False  # compute the prompt's KV and finish (pins)
    stream: bool = False  # keep `text` current after every token
    on_update: Callable[[Request], None] | None = None  # called by the engine thread after each step
    rid: int = field(default_factory=lambda: next(_ids))

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # KV bookkeeping (owned by the scheduler)
    row: int | None = None  # row in the request-to-slot table while admitted
    kv_len: int = 0  # tokens of all_ids whose K/V are in the pool
    prefix_len: int = 0  # of those, tokens shared with the radix tree (locked at last_node)
    pending: int = 0  # slots placed for the pass in flight, not yet counted in kv_len
    last_node: TreeNode | None = None
    admitted_once: bool = False
    usage: Usage = field(default_factory=Usage)
    # output state
    text: str = ""
    finish_reason: str | None = None
    error: BaseException | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        self.usage.prompt_tokens = len(self.prompt_ids)
        self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids), 0)

    def append_token(self, token_id: int, tokenizer: Tokenizer) -> None:
        """Record a sampled token and decide whether the request is finished.

        `text` is updated before `finish_reason`: a streaming reader on another thread that sees the
        request finished must also see its final text.
        """
        self.output_ids.append(token_id)
        self.usage.completion_tokens = len(self.output_ids)
        p = self.params
        reason = None
        if token_id in p.stop_token_ids or (not p.ignore_eos and token_id in self.eos_ids):
            reason = "stop"
        elif len(self.output_ids) >= self.max_new_tokens:
            reason = "length"
        if p.stop or self.stream or reason is not None:
            reason = self._update_text(tokenizer, reason) or reason
        self.finish_reason = reason

    def _update_text(self, tokenizer: Tokenizer, reason: str | None) -> str | None:
        """Decode the output into `text`; returns "stop" when a stop string ended it."""
        ids = self.output_ids
        if reason == "stop" and ids and (ids[-1] in self.eos_ids or ids[-1] in self.params.stop_token_ids):
            ids = ids[:-1]  # the stop token is not part of the text
        text = tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens)
        stopped = None
        if self.params.stop and reason != "stop":
            # search only where a new match can be: a stop string may span the last few tokens
            start = max(len(self.text) - max(len(s) for s in self.params.stop), 0)
            hits = [(i, s) for s in self.params.stop if (i := text.find(s, start)) >= 0]
            if hits:
                text = text[: min(hits)[0]]
                stopped = "stop"
        self.text = text
        return stopped

    def stable_text(self) -> str:
        """Text that can be streamed now: held back while it could still turn into a stop string
        or ends inside a multi-byte character."""
        if self.finished:
            return self.text
        text = self.text.rstrip("\ufffd")
        if self.params.stop:
            hold = max(len(s) for s in self.params.stop) - 1
            for k in range(min(hold, len(text)), 0, -1):
                if any(s.startswith(text[-k:]) for s in self.params.stop):
                    return text[:-k]
        return text
