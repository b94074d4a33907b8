"""Speculative decoding without a second model: drafts found in the request's own tokens.

Agent replies repeat their context (a tool result quoted, an id or a path written again, a JSON object
returned with one field changed), so the tokens that followed the last few tokens the last time they
appeared are a good guess of what follows now (prompt lookup, as vLLM's and SGLang's n-gram
speculation and llama.cpp's lookup decoding do). A running request with a draft is computed as an
extend of its last token and the draft in one pass, which at batch 1 costs little more than the
decode of one token, and keeps the longest prefix of the draft the model agrees with:

- greedy: a draft token is kept while it is the argmax of the logits before it;
- sampled: each row makes its token as without a draft (the race against the noise of the seed at
  that position, engine/sampler.py), and a draft token is kept while it is that token. For a
  deterministic draft that is the exact rule: d is kept with probability p(d), and otherwise the
  token is drawn from p without d, renormalized. It is also the coupling under which every token is
  the one the request makes without speculation: speculation changes no output, sampled or greedy.

Either way the token after the last kept draft token comes from the same pass (its logits are
there), so a pass makes 1 to k + 1 tokens. Draft slots past the kept ones are freed at once.

How long a draft is adapts per request: it grows while drafts are kept whole, shrinks to what was
kept, and after a run of drafts rejected outright the request drafts nothing for a while.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv.engine.request import Request

# the suffix looked up (its longest match that occurred before wins): 3 tokens at least, since a
# 2-token match (`", "` in JSON) proposes the wrong continuation too often (benchmarks/speculative.py)
MIN_NGRAM, MAX_NGRAM = 3, 8
COOLDOWN_STEPS = 16  # steps without drafts after MISS_LIMIT drafts in a row were rejected outright
MISS_LIMIT = 3


@dataclass
class NgramIndex:
    """Where each n-gram (MIN_NGRAM..MAX_NGRAM tokens) of a token list last ended, kept up to date as
    the list grows (each n-gram is indexed once)."""

    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in `last_end`

    def propose(self, ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix of `ids`
        that occurred before."""
        n_ids = len(ids)
        for end in range(max(self.indexed, MIN_NGRAM), n_ids):  # not the n-grams ending at n_ids: the suffix itself
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self.last_end[tuple(ids[end - n : end])] = end
        self.indexed = max(self.indexed, n_ids)
        if k <= 0:
            return []
        for n in range(min(MAX_NGRAM, n_ids), MIN_NGRAM - 1, -1):
            end = self.last_end.get(tuple(ids[n_ids - n :]))
            if end is not None:
                return ids[end : end + k]
        return []


@dataclass
class Speculation:
    """A request's drafting state: its n-gram index and how long its next draft may be."""

    max_tokens: int
    index: NgramIndex = field(default_factory=NgramIndex)
    k: int = 0  # the next draft's length limit (set from max_tokens on first use)
    misses: int = 0  # drafts in a row of which nothing was kept
    cooldown: int = 0  # steps left without drafting

    def __post_init__(self) -> None:
        self.k = max(1, self.max_tokens // 2)

    def draft(self, ids: list[int], room: int) -> list[int]:
        """The draft for the next pass (at most `room` tokens: what the request may still write
        after the one token the pass makes anyway)."""
        if self.cooldown:
            self.cooldown -= 1
            self.index.propose(ids, 0)  # keep the index current
            return []
        return self.index.propose(ids, min(self.k, room))

    def verified(self, drafted: int, kept: int) -> None:
        if kept == drafted:
            self.k = min(self.max_tokens, self.k + 2)
            self.misses = 0
            return
        self.k = max(1, kept + 1)
        self.misses = self.misses + 1 if kept == 0 else 0
        if self.misses >= MISS_LIMIT:
            self.misses, self.cooldown = 0, COOLDOWN_STEPS


def kept_prefix(accepted: list[bool]) -> int:
    """How many draft tokens a pass kept: up to the first whose row made another token."""
    n = 0
    while n < len(accepted) and accepted[n]:
        n += 1
    return n


def drafts(decodes: list[Request], spare: int, max_tokens: int) -> dict[Request, list[int]]:
    """The drafts of the decoding requests that can take one, at most `spare` draft tokens in all."""
    out = {}
    for r in decodes:
        p = r.params
        if (spare <= 0 or r.inflight or p.logprobs or r.remaining_tokens < 2
                or p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty):
            continue  # logprobs and penalties read each position's state: not drafted yet
        if r.speculation is None:
            r.speculation = Speculation(max_tokens)
        draft = r.speculation.draft(r.all_ids, min(r.remaining_tokens - 1, spare))
        if r.matcher is not None:
            draft = grammar_takes(r.matcher, draft)
        if draft:
            out[r] = draft
            spare -= len(draft)
    return out


def grammar_takes(matcher, draft: list[int]) -> list[int]:
    """The longest start of `draft` the grammar takes, short of a state where it forces text (what
    jump-forward appends for free is never drafted). The matcher is left as it was."""
    n = 0
    for token in draft:
        if not matcher.accept_token(token):
            break
        n += 1
        if matcher.is_terminated() or matcher.jump_forward_bytes():
            break
    matcher.rollback(n)
    return draft[:n]
