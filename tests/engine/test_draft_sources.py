"""Where drafts come from and how long they are, without an engine: the request's own n-gram index and
the counts of earlier outputs against brute forces, the draft length that pays for its pass, the
measured costs and acceptance, and a request's own draft limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.engine.draft_policy import Acceptance, PassCosts, best_length
from agentkv.engine.draft_sources import MAX_NGRAM, MIN_CHANCE, MIN_NGRAM, NgramIndex, SuffixCounts
from agentkv.engine.speculative import Speculation


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(0, 6))
def test_drafts_are_what_followed_the_longest_earlier_match(ids, k):
    """NgramIndex against a brute force: the longest suffix (MIN_NGRAM..MAX_NGRAM tokens) that
    occurred earlier, its latest earlier occurrence, the k tokens after it; the index built over
    successive calls."""
    index = NgramIndex()
    for cut in range(0, len(ids) + 1, 7):  # as a request's tokens grow
        index.propose(ids[:cut], k)
    expected = []
    for n in range(min(MAX_NGRAM, len(ids)), MIN_NGRAM - 1, -1):
        suffix = ids[len(ids) - n :]
        ends = [e for e in range(n, len(ids)) if ids[e - n : e] == suffix]
        if ends:
            expected = ids[max(ends) : max(ends) + k] if k else []
            break
    assert index.propose(ids, k) == expected


def suffix_counts_reference(learned: list[tuple[list[int], int]], capacity: int) -> dict:
    """SuffixCounts' table written the plain way: per learned sequence, each output token counted after
    each context (MIN_NGRAM..MAX_NGRAM tokens, reaching at most MAX_NGRAM tokens into the prompt) that
    ends just before it, a context written moving to the end, then the oldest contexts past `capacity`
    dropped. context -> {token: (count, when last counted)}."""
    table: dict = {}
    clock = 0
    for seq, start in learned:
        lo = max(0, start - MAX_NGRAM)
        for p in range(max(start, lo + MIN_NGRAM), len(seq)):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, p - lo) + 1):
                key = tuple(seq[p - n : p])
                counts = table.pop(key, {})
                counts[seq[p]] = (counts.get(seq[p], (0, 0))[0] + 1, clock)
                table[key] = counts
                clock += 1
        while len(table) > capacity:
            del table[next(iter(table))]
    return table


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=16), st.integers(0, 14)), min_size=1,
                max_size=5), st.data(), st.integers(1, 6), st.integers(1, 80))
def test_suffix_counts_walk_the_most_frequent_continuation(learned, data, k, capacity):
    """SuffixCounts against a brute force: at each step of a walk, the longest context of the last
    tokens still kept, its most counted token (ties: the latest counted) and that token's share,
    until the product of the shares falls below MIN_CHANCE. `ids` ends with a piece of a learned
    sequence, or is any tokens."""
    seq = data.draw(st.sampled_from([seq for seq, _ in learned]))
    cut = data.draw(st.integers(0, len(seq)))
    ids = data.draw(st.lists(st.integers(0, 3), max_size=3)) + seq[data.draw(st.integers(0, cut)) : cut]
    shared = SuffixCounts(capacity)
    for seq, start in learned:
        shared.learn(seq, start)
    table = suffix_counts_reference(learned, capacity)
    ctx, first, out, shares, chance = list(ids), 0, [], [], 1.0
    while len(out) < k:
        hit = next(((n, table[tuple(ctx[len(ctx) - n :])]) for n in range(min(MAX_NGRAM, len(ctx)), MIN_NGRAM - 1, -1)
                    if tuple(ctx[len(ctx) - n :]) in table), None)
        if hit is None:
            break
        first = first or hit[0]
        token = max(hit[1], key=lambda t: hit[1][t])
        share = hit[1][token][0] / sum(c for c, _ in hit[1].values())
        chance *= share
        if chance < MIN_CHANCE:
            break
        out.append(token)
        shares.append(share)
        ctx.append(token)
    assert shared.walk(ids, k) == (first, out, shares)


def test_a_shared_phrase_is_drafted_only_as_far_as_earlier_outputs_agree():
    """Three earlier replies wrote the same phrase, then each a different word: the walk takes the
    phrase (share 1), and the next token at a third (or stops there, below MIN_CHANCE)."""
    shared = SuffixCounts()
    phrase = [7, 8, 9, 10, 11, 12]
    for word in (20, 21, 22):
        shared.learn([1, 2, 3] + phrase + [word], 3)
    first, out, shares = shared.walk([5, 1, 2, 3, 7, 8, 9], 6)
    assert out[:3] == [10, 11, 12] and shares[:3] == [1.0, 1.0, 1.0] and first == 6
    assert shares[3:] == [] or shares[3] == pytest.approx(1 / 3)
    tie = SuffixCounts()
    tie.learn([1, 2, 3, 4, 9], 3)
    tie.learn([1, 2, 3, 5, 9], 3)
    assert tie.walk([1, 2, 3], 1) == (3, [5], [0.5])  # a tie goes to the latest counted


def test_a_draft_is_as_long_as_it_pays_for_its_pass():
    """best_length against the expected tokens a pass makes over its cost, by brute force."""
    def rate(accept, cost, n):
        made, chance = 1.0, 1.0
        for a in accept[:n]:
            chance *= a
            made += chance
        return made / (1 + cost * n)

    for accept in ([0.9] * 8, [0.5] * 8, [0.3] * 8, [1.0, 1.0, 0.2, 0.9], [0.0, 1.0]):
        for cost in (0.0, 0.05, 0.25, 1.0):
            n = best_length(accept, cost)
            best = max(range(len(accept) + 1), key=lambda m: rate(accept, cost, m))
            assert rate(accept, cost, n) == pytest.approx(rate(accept, cost, best))
    assert best_length([0.99] * 8, 1.0) == 0  # a token that costs a pass is never worth drafting
    assert best_length([0.3] * 8, 0.25) == 1  # (1.3 / 1.25: barely)
    assert best_length([0.2] * 8, 0.25) == 0


def test_pass_costs_and_acceptance_are_measured():
    costs = PassCosts()
    assert costs.token_cost > 0  # (a default before any pass)
    for _ in range(200):
        costs.observe(1, 1, 0.010)  # a decode pass: 10 ms
        costs.observe(1, 5, 0.020)  # four tokens more: 2.5 ms each, a quarter of the decode pass
    assert costs.token_cost == pytest.approx(0.25)
    acc = Acceptance()
    assert acc.rate("own") == 0.75  # the prior
    for _ in range(300):
        acc.observe("own", 4, 1)  # the first kept, the second rejected: 1 of 2 tried
        acc.observe("radix", 4, 4)
    assert acc.rate("own") == pytest.approx(0.5, abs=0.02) and acc.rate("radix") > 0.95


def test_a_request_that_keeps_missing_stops_drafting_for_a_while():
    s = Speculation(6)
    ids = [1, 2, 3, 1, 2, 3]
    for _ in range(3):
        _, d, _ = s.draft(ids, 10)
        assert d
        s.verified(len(d), 0)
    assert s.draft(ids, 10)[1] == []  # cooling down
    s = Speculation(6)
    _, d, _ = s.draft(ids, 10)
    s.verified(len(d), len(d))
    assert s.k == 5  # kept whole: the next draft may be longer
