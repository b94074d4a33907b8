"""The token walk: which vocabulary tokens a parser stack can read next, vectorized over tokens.

All candidate tokens advance one byte per numpy step through the global transition table; a token
that ends in a live state is allowed. Where a token's path reaches a state that can call a rule or
return from one, that group of tokens forks onto each stack the call/return leads to and continues
there (so one token may open and close nested rules). Tokens die as soon as a byte has no
transition, so the work is the total length of the surviving prefixes, not vocabulary x length.
"""

from __future__ import annotations

import numpy as np


def first_byte_groups(info) -> list[np.ndarray]:
    """Per first byte, the token ids that start with it (built once per tokenizer)."""
    groups = getattr(info, "_first_byte_groups", None)
    if groups is None:
        ids = info.text_ids
        first = info.token_bytes[ids, 0]
        order = np.argsort(first, kind="stable")
        bounds = np.searchsorted(first[order], np.arange(257))
        groups = [ids[order[bounds[b]:bounds[b + 1]]] for b in range(256)]
        info._first_byte_groups = groups
    return groups


def token_walk(grammar, stack: tuple, allowed: np.ndarray) -> None:
    """Set `allowed[t]` for every token t that `stack` (an expanded stack) can read in full."""
    info = grammar.info
    trans = grammar.automaton.trans
    top = stack[-1]
    row = trans[top]
    starts = np.nonzero(row >= 0)[0]
    if not len(starts):
        return
    groups = first_byte_groups(info)
    idx = np.concatenate([groups[b] for b in starts])
    if not len(idx):
        return
    states = row[info.token_bytes[idx, 0]].astype(np.int64)
    _continue(grammar, stack[:-1], states, idx, np.ones(len(idx), dtype=np.int64), allowed)


def _continue(grammar, lower: tuple, states, idx, off, allowed) -> None:
    """Tokens `idx` have read `off` bytes and sit in `states` (top of stacks `lower + (state,)`)."""
    info = grammar.info
    flat_bytes = info.token_bytes.reshape(-1)
    width = info.token_bytes.shape[1]
    lengths = info.lengths
    flat_trans = grammar.automaton.trans.reshape(-1)
    fork = grammar.fork_states
    while True:
        done = off == lengths[idx]
        if done.any():
            allowed[idx[done]] = True
            keep = ~done
            states, idx, off = states[keep], idx[keep], off[keep]
        if not len(idx):
            return
        forking = fork[states]
        if forking.any():
            for u in np.unique(states[forking]).tolist():
                own = lower + (u,)
                sel = states == u
                for other in grammar.expand(own)[0]:
                    if other != own:
                        sub = idx[sel]
                        b = flat_bytes[sub * width + off[sel]]
                        nxt = flat_trans[np.int64(other[-1]) * 256 + b].astype(np.int64)
                        ok = nxt >= 0
                        if ok.any():
                            _continue(grammar, other[:-1], nxt[ok], sub[ok], off[sel][ok] + 1, allowed)
        b = flat_bytes[idx * width + off]
        states = flat_trans[states * 256 + b].astype(np.int64)
        ok = states >= 0
        states, idx, off = states[ok], idx[ok], off[ok] + 1
        if not len(idx):
            return
