"""Literal text in the token walk: a run of states that each read exactly one byte (a property name
with its quotes and colon, an optional member's comma before it, a keyword). Tokens are matched
against such text as strings instead of being walked through its states byte by byte (masks.py)."""

from __future__ import annotations

import bisect

import numpy as np


def tokens_inside(info, text: bytes) -> list[int]:
    """The tokens that end inside `text` or at its end (those equal to one of its prefixes)."""
    ends = []
    for k in range(1, len(text) + 1):
        at = bisect.bisect_left(info.sorted_bytes, text[:k])
        while at < len(info.sorted_bytes) and info.sorted_bytes[at] == text[:k]:
            ends.append(info.sorted_ids[at])
            at += 1
    return ends


def tokens_past(info, text: bytes) -> np.ndarray:
    """The tokens that start with `text` and run past its end."""
    lo, hi = info.extending(text)
    longer = info.sorted_id_array[lo:hi]
    return longer[info.lengths[longer] > len(text)]


def by_rest(info, idx: np.ndarray, off: np.ndarray) -> tuple[dict, int]:
    """Tokens `idx` that have read `off` bytes, grouped by the bytes they have left (rest -> (ids,
    offsets)), and the longest rest's length: tokens that fork onto many literals (one stack per
    optional property) come down to a few dozen distinct rests."""
    vocab, groups = info.vocab, {}
    for t, o in zip(idx.tolist(), off.tolist()):
        group = groups.get(rest := vocab[t][o:])
        if group is None:
            group = groups[rest] = ([], [])
        group[0].append(t)
        group[1].append(o)
    return groups, max(map(len, groups), default=0)


def match_rests(text: bytes, groups: dict, longest: int, inside: dict) -> tuple[np.ndarray, np.ndarray]:
    """Rests of `by_rest` against the literal `text`: those that are a prefix of it go to `inside`
    (rest -> the ids of its tokens, which end in the text); returns the tokens that run past its end,
    with their offsets there."""
    for k in range(1, min(len(text), longest) + 1):
        group = groups.get(text[:k])
        if group is not None:
            inside[text[:k]] = group[0]
    on = [group for rest, group in groups.items() if len(rest) > len(text) and rest.startswith(text)] \
        if longest > len(text) else []
    if not on:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ids = np.concatenate([np.array(i, dtype=np.int64) for i, _ in on])
    return ids, np.concatenate([np.array(o, dtype=np.int64) for _, o in on]) + len(text)
