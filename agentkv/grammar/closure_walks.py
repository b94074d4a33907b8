"""A walk from a plain-text closure (a string body, an open object's names) taken from a state walked
before. A token's fate in a walk depends only on the states its bytes pass, so a token whose first
byte leads state `q` where it leads an earlier state `r` fares from `q` as it did from `r`. Where
the two states' transitions differ in a few bytes (the positions inside a declared name of an open
object, each of which reads one more letter than the free part), `q`'s walk is `r`'s with the tokens
starting with those bytes walked again: their plain ones are allowed (every prefix of plain text
lives in a closure) and the others take the closure's start (`WalkStarts._start_closed`) on their
own, instead of all 1,666 tokens whose plain run stops there (at 151k).
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.masks import BELOW, StateTokens, _Walk

MAX_DIFF_BYTES = 32  # a state whose transitions differ from every kept one's in more bytes is walked whole
KEPT_WALKS = 8       # per grammar, the latest closures' walks kept to start from


def closure_walk(g, q: int) -> StateTokens | None:
    """`q`'s walk from a kept one (see the module docstring), or None where `q` is no closure's state
    or no kept walk is near enough."""
    kept = g._closure_walks
    reads = g.plain_closed(q) if kept else None
    if reads is None:
        return None
    trans = g.automaton.trans
    states = np.array([r for r, _ in kept], dtype=np.int64)
    differ = trans[states] != trans[q]
    counts = differ.sum(axis=1)
    best = int(counts.argmin())
    if counts[best] > MAX_DIFF_BYTES:
        return None
    base, info = kept[best][1], g.info
    diff = np.flatnonzero(differ[best])
    firsts = np.zeros(256, dtype=bool)
    firsts[diff] = True
    moved = np.zeros(info.words, dtype="<i4")  # the tokens starting with a byte that differs
    for b in diff.tolist():
        moved |= info.first_byte_mask(b)
    walk = _Walk(g, np.zeros(info.words * 32, dtype=bool), relative=True)
    walk._start_closed((BELOW, q), reads, firsts)
    walk.packed += [base.allowed & ~moved, info.plain_prefixes[0] & moved]
    if len(base.below_ids):
        keep = ~firsts[info.bytes_at[0, base.below_ids]]
        walk.below.insert(0, (base.below_ids[keep], base.below_offsets[keep]))
    walk.depth = max(walk.depth, base.depth)
    return walk.found()


def keep_closure_walk(g, q: int, st: StateTokens) -> None:
    """Keep `q`'s walk to start later closures' walks from (the latest KEPT_WALKS)."""
    if g.plain_closed(q) is None:
        return
    g._closure_walks.append((q, st))
    if len(g._closure_walks) > KEPT_WALKS:
        del g._closure_walks[0]
