"""Speculative decoding without a second model: drafts found in what the engine has already seen.

Agent replies repeat their context (a tool result quoted, an id or a path written again, a JSON object
returned with one field changed) and what the same agent wrote before, so a draft comes from, in order:

1. the radix tree: where the request's tokens so far are all cached, the path beyond them is what an
   earlier request wrote after the same tokens (radix lookahead; a question asked again);
2. the longest recent n-gram match (draft_sources.py): in the request's own tokens (prompt lookup), or in
   the counts of what earlier requests wrote after the same tokens (`SuffixCounts`: the same kind of
   answer written before, its most frequent continuation); the longer match wins, the request's own
   on a tie.

How long a draft is: at most the request's limit, which grows while its drafts are kept whole,
shrinks to what was kept, and after a run of drafts rejected outright stops drafting for a while;
within it, the length that pays for its pass (draft_policy.py: the measured cost of a computed token
against the measured acceptance of the draft's source and, for earlier requests' counts, each token's
share of its context).

A running request with a draft is computed as an extend of its last token and the draft in one pass,
and keeps the longest prefix of the draft the model agrees with:

- greedy: a draft token is kept while it is the argmax of the logits before it;
- sampled: each row makes its token as without a draft (the race against the noise of the seed at
  that position, engine/sampler.py), and a draft token is kept while it is that token. For a
  deterministic draft that is the exact rule: d is kept with probability p(d), and otherwise the
  token is drawn from p without d, renormalized. It is also the coupling under which every token is
  the one the request makes without speculation: speculation changes no output, sampled or greedy.

Either way the token after the last kept draft token comes from the same pass (its logits are
there), so a pass makes 1 to k + 1 tokens. Draft slots past the kept ones are freed at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentkv.engine.draft_policy import Acceptance, PassCosts, best_length
from agentkv.engine.draft_sources import NgramIndex, SuffixCounts

if TYPE_CHECKING:
    from agentkv.engine.null_cache import PrefixCache
    from agentkv.engine.request import Request

COOLDOWN_STEPS = 16  # steps without drafts after MISS_LIMIT drafts in a row were rejected outright
MISS_LIMIT = 3


@dataclass
class Speculation:
    """A request's drafting state: its n-gram index and how long its next draft may be."""

    max_tokens: int
    index: NgramIndex = field(default_factory=NgramIndex)
    k: int = 0  # the next draft's length limit (set from max_tokens on first use)
    source: str = ""  # where the draft being checked came from
    misses: int = 0  # drafts in a row of which nothing was kept
    cooldown: int = 0  # steps left without drafting

    def __post_init__(self) -> None:
        self.k = max(1, self.max_tokens // 2)

    def draft(self, ids: list[int], k: int, tree: PrefixCache | None = None,
              shared: SuffixCounts | None = None, ns: str | None = None) -> tuple[str, list[int], list[float]]:
        """Up to k tokens proposed to follow `ids`, with their source and each token's share of its
        context in that source (1.0 but for earlier requests' counts): the radix tree's path beyond
        them, else the longer n-gram match of the request's own and of earlier requests'. (`self.k`
        bounds the drafted tokens; the caller passes it, or more where a grammar's forced runs may be
        in between.)"""
        if self.cooldown:
            self.cooldown -= 1
            self.index.propose(ids, 0)  # keep the index current
            return "own", [], []
        ahead = tree.continuation(ids, k, ns) if tree is not None and k > 0 else []  # (its adapter's paths)
        n, own = self.index.match(ids, k)
        if ahead:
            return "radix", ahead, [1.0] * len(ahead)
        if shared is not None and k > 0:
            m, theirs, shares = shared.walk(ids, k)
            if m > n:
                return "shared", theirs, shares
        return "own", own, [1.0] * len(own)

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
    cache; `shared`: earlier requests' outputs, fed by `learn`), and how long (`costs`, fed by the
    engine's passes; `acceptance`, by `verified`)."""

    max_tokens: int
    tree: PrefixCache | None = None
    shared: SuffixCounts = field(default_factory=SuffixCounts)
    costs: PassCosts = field(default_factory=PassCosts)
    acceptance: Acceptance = field(default_factory=Acceptance)

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
            # (with a grammar, forced runs may join the draft: the proposal may cover them)
            s.source, proposal, shares = s.draft(r.all_ids, min(s.k, room) if r.matcher is None else room, self.tree,
                                                 self.shared, r.cache_ns)
            rate = self.acceptance.rate(s.source)
            worth = best_length([rate * share for share in shares[: min(s.k, room)]], self.costs.token_cost)
            if r.matcher is None:
                draft = Draft(proposal[:worth])
            else:
                draft = grammar_takes(r.matcher, proposal, worth, room, r.params.jump_forward)
            if draft:
                out[r] = draft
                spare -= len(draft)
        return out

    def verified(self, r: Request, drafted: int, kept: int) -> None:
        """A pass checked `drafted` tokens of r's draft and kept the first `kept`."""
        r.speculation.verified(drafted, kept)
        self.acceptance.observe(r.speculation.source, drafted, kept)

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
