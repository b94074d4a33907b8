"""Speculative decoding without a second model: drafts found in what the engine has already seen.

Agent replies repeat their context (a tool result quoted, an id or a path written again, a JSON object
returned with one field changed) and what the same agent wrote before, so a draft comes from, in order:

1. the radix tree: where the request's tokens so far are all cached, the path beyond them is what an
   earlier request wrote after the same tokens (radix lookahead; a question asked again);
2. the longest recent n-gram: the tokens that followed the request's last few tokens the last time
   they appeared, in its own tokens (prompt lookup, as vLLM's and SGLang's n-gram speculation and
   llama.cpp's lookup decoding do) or in what earlier requests wrote (`SharedNgrams`: the same kind
   of question answered before); the longer match wins, the request's own on a tie.

A running request with a draft is computed as an extend of its last token and the draft in one pass,
which at batch 1 costs little more than the decode of one token, and keeps the longest prefix of the
draft the model agrees with:

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

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv.engine.null_cache import PrefixCache
    from agentkv.engine.request import Request

# the suffix looked up (its longest match that occurred before wins): 3 tokens at least, since a
# 2-token match (`", "` in JSON) proposes the wrong continuation too often (benchmarks/speculative.py)
MIN_NGRAM, MAX_NGRAM = 3, 8
COOLDOWN_STEPS = 16  # steps without drafts after MISS_LIMIT drafts in a row were rejected outright
MISS_LIMIT = 3
SHARED_NGRAMS = 1 << 17  # n-grams of earlier requests' outputs kept (the least recently written go first)


def ngrams_ending_at(ids: list[int], end: int):
    """The MIN_NGRAM..MAX_NGRAM-token n-grams of `ids` that end just before `end` (as dict keys)."""
    for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
        yield tuple(ids[end - n : end])


def suffixes(ids: list[int]):
    """(length, n-gram) of the suffixes of `ids` that drafting looks up, the longest first."""
    for n in range(min(MAX_NGRAM, len(ids)), MIN_NGRAM - 1, -1):
        yield n, tuple(ids[len(ids) - n :])


@dataclass
class NgramIndex:
    """Where each n-gram (MIN_NGRAM..MAX_NGRAM tokens) of a token list last ended, kept up to date as
    the list grows (each n-gram is indexed once)."""

    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in `last_end`

    def propose(self, ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix of `ids`
        that occurred before."""
        return self.match(ids, k)[1]

    def match(self, ids: list[int], k: int) -> tuple[int, list[int]]:
        """propose's draft and the length of the suffix that found it (0: none)."""
        for end in range(max(self.indexed, MIN_NGRAM), len(ids)):  # not those ending at len(ids): the suffix itself
            for key in ngrams_ending_at(ids, end):
                self.last_end[key] = end
        self.indexed = max(self.indexed, len(ids))
        if k <= 0:
            return 0, []
        for n, key in suffixes(ids):
            end = self.last_end.get(key)
            if end is not None:
                return n, ids[end : end + k]
        return 0, []


class SharedNgrams:
    """What earlier requests wrote: each n-gram of a finished request's output (with the prompt's last
    tokens before it, whose n-grams propose how a reply starts) mapped to where it last ended. Bounded:
    past `capacity` n-grams the least recently written go."""

    def __init__(self, capacity: int = SHARED_NGRAMS):
        self.capacity = capacity
        self.last_end: OrderedDict[tuple[int, ...], tuple[list[int], int]] = OrderedDict()

    def learn(self, ids: list[int], start: int) -> None:
        """Index `ids[start:]` (a request's output; `start`: its prompt length)."""
        tail = ids[max(0, start - MAX_NGRAM) :]
        for end in range(MIN_NGRAM, len(tail)):
            for key in ngrams_ending_at(tail, end):
                self.last_end[key] = (tail, end)
                self.last_end.move_to_end(key)
        while len(self.last_end) > self.capacity:
            self.last_end.popitem(last=False)

    def match(self, ids: list[int], k: int) -> tuple[int, list[int]]:
        """Up to k tokens that followed the longest suffix of `ids` an earlier request wrote, and
        that suffix's length (0: none)."""
        for n, key in suffixes(ids):
            hit = self.last_end.get(key)
            if hit is not None:
                tail, end = hit
                return n, tail[end : end + k]
        return 0, []


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

    def draft(self, ids: list[int], k: int, tree: PrefixCache | None = None,
              shared: SharedNgrams | None = None) -> list[int]:
        """Up to k tokens proposed to follow `ids`: the radix tree's path beyond them, else the longer
        n-gram match of the request's own and of earlier requests'. (`self.k` bounds the drafted
        tokens; the caller passes it, or more where a grammar's forced runs may be in between.)"""
        if self.cooldown:
            self.cooldown -= 1
            self.index.propose(ids, 0)  # keep the index current
            return []
        ahead = tree.continuation(ids, k) if tree is not None and k > 0 else []
        n, own = self.index.match(ids, k)
        if ahead:
            return ahead
        if shared is not None and k > 0:
            m, theirs = shared.match(ids, k)
            if m > n:
                return theirs
        return own

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


@dataclass
class Drafter:
    """A scheduler's drafting: which decoding requests draft, from what (`tree`: the engine's prefix
    cache; `shared`: earlier requests' n-grams, fed by `learn`)."""

    max_tokens: int
    tree: PrefixCache | None = None
    shared: SharedNgrams = field(default_factory=SharedNgrams)

    def drafts(self, decodes: list[Request], spare: int) -> dict[Request, list[int]]:
        """The drafts of the decoding requests that can take one, at most `spare` draft tokens in all."""
        out = {}
        for r in decodes:
            if spare <= 0 or r.inflight or r.remaining_tokens < 2:
                continue
            if r.speculation is None:
                r.speculation = Speculation(self.max_tokens)
            s, room = r.speculation, min(r.remaining_tokens - 1, spare)
            if r.reasoning is not None:  # its block's end is appended once its budget is spent, not inside a draft
                room = min(room, r.reasoning.tokens - len(r.output_ids) - 1)
            if r.matcher is None:
                draft = Draft(s.draft(r.all_ids, min(s.k, room), self.tree, self.shared))
            else:  # (forced runs may join the draft: the proposal may cover them)
                draft = grammar_takes(r.matcher, s.draft(r.all_ids, room, self.tree, self.shared), s.k, room,
                                      r.params.jump_forward)
            if draft:
                out[r] = draft
                spare -= len(draft)
        return out

    def learn(self, r: Request) -> None:
        """A request finished: what it wrote proposes drafts to later ones."""
        if r.output_ids:
            self.shared.learn(r.all_ids, len(r.prompt_ids))


class Draft(list):
    """A draft's tokens; `forced`: the indices of those the grammar forces (jump-forward's canonical
    tokens, drafted so that the pass that checks the tokens before them computes them too: their rows
    get a one-token mask, so they are kept whenever the draft before them is)."""

    forced: frozenset[int] = frozenset()


def grammar_takes(matcher, proposal: list[int], k: int, room: int, jump_forward: bool = True) -> Draft:
    """The longest start of `proposal` the grammar takes, at most k of its tokens and `room` in all.
    Where the grammar forces text after a token (jump-forward), its canonical tokens join the draft
    (they are what the request would append there without speculation) and the proposal goes on
    past them if it has the same tokens there; they are never drafted from the proposal. Without
    jump-forward a forced state ends the draft. The matcher is left as it was."""
    out, forced, taken, i = Draft(), set(), 0, 0
    while i < len(proposal) and taken < k and len(out) < room:
        if not matcher.accept_token(proposal[i]):
            break
        out.append(proposal[i])
        taken, i = taken + 1, i + 1
        if matcher.is_terminated():
            break
        if not matcher.jump_forward_bytes():
            continue
        if not jump_forward:
            break
        toks = matcher.jump_forward_tokens()
        if len(out) + len(toks) > room or not matcher.accept_tokens(toks):
            break  # (a run cut by the request's length limit is appended without speculation)
        forced.update(range(len(out), len(out) + len(toks)))
        out += toks
        if proposal[i : i + len(toks)] != toks or matcher.is_terminated():
            break
        i += len(toks)
    matcher.rollback(len(out))
    out.forced = frozenset(forced)
    return out
