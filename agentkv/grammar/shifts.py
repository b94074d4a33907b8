"""Positions of a counted repetition that walk every token alike (a string with a maxLength).

A string of at most N characters is a chain of N states, each position its own state, so a mask at
each new position is a first computation (0.9-1.4 ms at 151k tokens). Yet a token reads at most B
bytes (the longest token): from a position with the chain's end further away than that, no token
can tell it from the next position. `equivalent_runs` proves it and finds where it holds:

- the shift sigma maps each chain state to the next, and whatever a byte leads to from a state to
  what the same byte leads to from its image (one breadth-first pass over state pairs, seeded with
  every consecutive pair of the chain at once, so it closes within a character's few bytes); where
  both lead to one state, that state is its own image;
- a state is inconsistent where its image reads other bytes, it gets two images (the walk from it
  would depend on the way there), or one of the two may call or return (a fork: its calls and
  returns must be the same state's);
- a chain state whose B bytes ahead reach no inconsistent state walks every token as its image does
  (by induction over the token's bytes: each step from a state lands on the image of the step from
  its preimage, and at a fork both are the same state), so each run of such states, with the state
  after it, shares one walk (CompiledGrammar.state_tokens).
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.token_groups import ranges

MAX_PAIRS = 1 << 17  # state pairs the shift may take before the proof is abandoned (no sharing then)


def equivalent_runs(trans: np.ndarray, fork: np.ndarray, chain: list[int], horizon: int) -> list[tuple[int, int]]:
    """Runs [i, j) of `chain` (a character chain: chain[m + 1] is where every plain character leads
    from chain[m]) whose states all walk every token of up to `horizon` bytes alike."""
    n = len(trans)
    image = np.full(n, -1, dtype=np.int64)   # the shift: a state's image, -1 where not met
    bad = np.zeros(n, dtype=bool)             # inconsistent: the shift cannot map it
    a = np.array(chain[:-1], dtype=np.int64)
    b = np.array(chain[1:], dtype=np.int64)
    met = 0
    while len(a):
        met += len(a)
        if met > MAX_PAIRS:
            return []
        # one image per state: a pair whose state already has another image (or two in this level)
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
        first = np.r_[True, a[1:] != a[:-1]]
        clash = np.zeros(len(a), dtype=bool)
        clash[1:] = ~first[1:] & (b[1:] != b[:-1])
        bad[a[clash]] = True
        a, b = a[first], b[first]
        known = image[a]
        bad[a[(known >= 0) & (known != b)]] = True  # (its own image among them: met the same way too)
        fresh = known < 0
        a, b = a[fresh], b[fresh]
        image[a] = b
        # a fork whose image is another state, or a state whose image reads other bytes
        rows_a, rows_b = trans[a], trans[b]
        off = fork[a] | fork[b] | ((rows_a >= 0) != (rows_b >= 0)).any(axis=1)
        bad[a[off]] = True
        rows_a, rows_b = rows_a[~off], rows_b[~off]
        live = rows_a >= 0
        u, v = rows_a[live].astype(np.int64), rows_b[live].astype(np.int64)
        # Where both lead to the same state, the walks go on as one: that state is its own image
        # (and inconsistent if it has another one: the walk from it would depend on the way there).
        same = np.unique(u[u == v])
        bad[same[(image[same] >= 0) & (image[same] != same)]] = True
        image[same[image[same] < 0]] = same[image[same] < 0]
        pairs = np.unique(u[u != v] * n + v[u != v])
        a, b = pairs // n, pairs % n
    # The states within `horizon` bytes before an inconsistent one (backwards over the shift's states).
    states = np.nonzero(image >= 0)[0]
    rows = trans[states]
    src, col = np.nonzero(rows >= 0)
    dst = rows[src, col].astype(np.int64)
    inside = (image[dst] >= 0) | bad[dst]
    src, dst = states[src[inside]], dst[inside]
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    starts = np.searchsorted(dst, np.arange(n + 1))
    near = bad.copy()
    frontier = np.nonzero(bad)[0]
    for _ in range(horizon):
        if not len(frontier):
            break
        before = src[ranges(starts[frontier], starts[frontier + 1])]
        before = np.unique(before[~near[before]])
        near[before] = True
        frontier = before
    # chain[m] far from every inconsistency walks like chain[m + 1]: a run of such states and the one
    # after the last
    far = (~near[np.array(chain[:-1], dtype=np.int64)]).tolist()
    runs, m = [], 0
    while m < len(far):
        if far[m]:
            start = m
            while m < len(far) and far[m]:
                m += 1
            runs.append((start, m + 1))
        m += 1
    return runs
