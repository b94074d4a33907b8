"""The token walk: which vocabulary tokens a parser stack can read next, vectorized over tokens.

All candidate tokens advance one byte per numpy step through the global transition table; a token
that ends in a live state is allowed. Where a token's path reaches a state that can call a rule or
return from one, that group of tokens forks onto each stack the call/return leads to and continues
there (so one token may open and close nested rules). Tokens die as soon as a byte has no
transition, so the work is the total length of the surviving prefixes, not vocabulary x length.
"""

from __future__ import annotations

import numpy as np


def token_walk(grammar, stack: tuple, allowed: np.ndarray) -> None:
    """Set `allowed[t]` for every token t that `stack` (an expanded stack) can read in full."""
    info = grammar.info
    top = stack[-1]
    upto, rest = grammar.plain_run(top)
    # Plain tokens of up to `upto` characters end on the top rule's character chain: allowed as a block.
    allowed[info.plain_sorted[:info.plain_bounds[upto + 1]]] = True
    if rest == "walk":
        candidates = np.concatenate([info.non_plain_ids, info.plain_sorted[info.plain_bounds[upto + 1]:]])
    else:  # longer plain tokens die on the chain's last state
        candidates = info.non_plain_ids
    _walk_from(grammar, stack, candidates, allowed)


def _walk_from(grammar, stack: tuple, candidates: np.ndarray, allowed: np.ndarray) -> None:
    info = grammar.info
    row = grammar.automaton.trans[stack[-1]]
    if len(candidates) == info.vocab_size or len(candidates) > len(info.text_ids) // 2:
        starts = np.nonzero(row >= 0)[0]
        groups = info.first_byte_groups
        idx = np.concatenate([groups[b] for b in starts]) if len(starts) else np.zeros(0, dtype=np.int64)
        states = row[info.token_bytes[idx, 0]].astype(np.int64) if len(idx) else idx
    else:
        states = row[info.token_bytes[candidates, 0]].astype(np.int64)
        keep = states >= 0
        idx, states = candidates[keep], states[keep]
    if len(idx):
        _continue(grammar, stack[:-1], states, idx, np.ones(len(idx), dtype=np.int64), allowed)


def _continue(grammar, lower: tuple, states, idx, off, allowed) -> None:
    """Tokens `idx` have read `off` bytes and sit in `states` (top of stacks `lower + (state,)`)."""
    info = grammar.info
    flat_bytes = info.token_bytes.reshape(-1)
    width = info.token_bytes.shape[1]
    lengths = info.lengths
    flat_trans = grammar.automaton.trans.reshape(-1)
    fork = grammar.fork_states
    suffix = info.plain_suffix.reshape(-1)
    swidth = info.plain_suffix.shape[1]
    while True:
        done = off == lengths[idx]
        # A plain-text rest of the token that the state's character chain takes whole: done too.
        runs = grammar.run_lengths(states)
        rest_chars = suffix[idx * swidth + off]
        done |= (rest_chars > 0) & (rest_chars <= runs)
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
