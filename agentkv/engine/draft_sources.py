"""Where drafts come from besides the radix tree: the request's own tokens and what earlier requests wrote.

- `NgramIndex`: the request's own tokens (prompt and output). The tokens that followed the latest earlier
  occurrence of its longest recent n-gram (prompt lookup, as vLLM's and SGLang's n-gram speculation and
  llama.cpp's lookup decoding do): a tool result quoted, an id written again.
- `SuffixCounts`: every finished request's output, as counts of what followed each context of
  MIN_NGRAM..MAX_NGRAM tokens (SuffixDecoding's suffix statistics, arXiv 2411.04975, kept as a table of
  contexts rather than a tree). A draft walks from the request's last tokens: at each step the longest
  context seen before, its most frequent next token and that token's share of the context's count,
  which the draft's length policy (draft_policy.py) reads as how likely the model writes it. Agents
  write the same phrases across tasks ("The weather in ... will be"), but after a shared phrase
  come different cities: the shares say where a draft stops being worth its pass.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

# the suffix looked up (its longest match that occurred before wins): 3 tokens at least, since a
# 2-token match (`", "` in JSON) proposes the wrong continuation too often (benchmarks/speculative.py)
MIN_NGRAM, MAX_NGRAM = 3, 8
SHARED_CONTEXTS = 1 << 17  # contexts of earlier requests' outputs kept (the least recently written go first)
# a walk ends at a token whose chance (the product of the shares so far) is below this: no draft length
# would take it (draft_policy.best_length)
MIN_CHANCE = 0.05


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


class SuffixCounts:
    """What earlier requests wrote: for each context (MIN_NGRAM..MAX_NGRAM tokens) in a finished request's
    output, or in its prompt's last tokens just before the output (how a reply starts), how often each
    token of the output followed it. Bounded: past `capacity` contexts the least recently written go."""

    def __init__(self, capacity: int = SHARED_CONTEXTS):
        self.capacity = capacity
        # context -> {next token: count}, each dict in the order its tokens were last counted
        self.after: OrderedDict[tuple[int, ...], dict[int, int]] = OrderedDict()

    def learn(self, ids: list[int], start: int) -> None:
        """Count the tokens of `ids[start:]` (a request's output; `start`: its prompt length) after each
        context that ends just before them."""
        lo = max(0, start - MAX_NGRAM)
        tail = ids[lo:]
        for end in range(max(start - lo, MIN_NGRAM), len(tail)):
            token = tail[end]
            for key in ngrams_ending_at(tail, end):
                counts = self.after.get(key)
                if counts is None:
                    counts = self.after[key] = {}
                else:
                    self.after.move_to_end(key)
                counts[token] = counts.pop(token, 0) + 1  # (re-inserted: the dict's last is the latest counted)
        while len(self.after) > self.capacity:
            self.after.popitem(last=False)

    def walk(self, ids: list[int], k: int) -> tuple[int, list[int], list[float]]:
        """Up to k tokens proposed after `ids`: from each step's longest context seen before, its most
        frequent next token (ties: the latest counted), while the product of their shares is at least
        MIN_CHANCE. Returns the first step's context length (0: no context of `ids` was seen), the
        tokens, and each one's share of its context's count."""
        ctx, first, out, shares, chance = list(ids[-MAX_NGRAM:]), 0, [], [], 1.0
        while len(out) < k:
            counts, n = None, 0
            for n, key in suffixes(ctx):
                counts = self.after.get(key)
                if counts is not None:
                    break
            if counts is None:
                break
            first = first or n
            token, best = -1, 0
            for t, c in reversed(counts.items()):
                if c > best:
                    token, best = t, c
            share = best / sum(counts.values())
            chance *= share
            if chance < MIN_CHANCE:
                break
            out.append(token)
            shares.append(share)
            ctx = ctx[1:] + [token] if len(ctx) == MAX_NGRAM else ctx + [token]
        return first, out, shares
