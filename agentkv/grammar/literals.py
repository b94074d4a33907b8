"""Literal text in the token walk: a run of states that each read exactly one byte (a property name
with its quotes and colon, an optional member's comma before it, a keyword), and the tree of such
texts that branches from one state (the names a strict object may write next). Tokens are matched
against such text as strings instead of being walked through its states byte by byte
(walk_starts.py, masks.py)."""

from __future__ import annotations

import bisect

import numpy as np

TREE_ROOT = 64        # a state reading more bytes than this is no tree of texts (a class, a string body)
TREE_BRANCH = 8       # a text ends at a state reading more bytes than this
TREE_TEXTS = 128      # more texts than this, or more bytes in them all than TREE_BYTES: walked as before
TREE_BYTES = 2048     # (the walk looks up the prefixes of every text)
MAX_TREE_TEXT = 64    # a text ends where it grows this long
NO_TOKENS = np.zeros(0, dtype=np.int64)
NO_TOKENS.flags.writeable = False


def tokens_inside(info, text: bytes) -> list[int]:
    """The tokens that end inside `text` or at its end (those equal to one of its prefixes)."""
    return info.ids_of_any(_prefixes(info, text))


def tokens_inside_any(info, texts: list[bytes]) -> list[int]:
    """The tokens that end inside one of `texts` or at its end (each shared prefix looked up once)."""
    return info.ids_of_any({p for t in texts for p in _prefixes(info, t)})


def _prefixes(info, text: bytes):
    """The prefixes of `text` that a token may equal: none longer than the longest token that starts
    with its first two bytes (a name of 25 bytes has about 15 such prefixes at 151k tokens)."""
    n = min(len(text), int(info.longest_from[text[0] << 8 | text[1]])) if len(text) > 1 else len(text)
    return (text[:k] for k in range(1, n + 1))


def literal_tree(g, q: int) -> tuple[list[bytes], list[int]] | None:
    """Where the text from `q` branches into literal texts (a strict object's declared names, each
    with its closing quote and colon; listed string values), those texts and the state after each:
    a text ends at a state that forks, reads more than TREE_BRANCH bytes or was met before on its
    way. None where `q` reads more than TREE_ROOT bytes, or the texts are more than TREE_TEXTS or
    longer than TREE_BYTES together. Every token that reads a byte from `q` either ends inside a
    text, runs past one's end, or dies: the walk looks the first two up (`tokens_inside_any`,
    `tokens_past`) instead of stepping through."""
    trans, fork, only = g.automaton.trans, g.fork_states, g.only_byte
    first = np.flatnonzero(trans[q] >= 0)
    if len(first) > TREE_ROOT:
        return None
    texts, ends, size = [], [], 0
    todo = [(q, b"", (q,), first.tolist())]
    reading: dict[int, np.ndarray] = {}  # state -> the bytes it reads (a class: many texts end at one state)
    while todo:
        s, text, on, reads = todo.pop()
        for b in reads:
            t, more = int(trans[s, b]), bytes([b])
            while only[t] >= 0 and len(text) + len(more) < MAX_TREE_TEXT:  # one byte at a time: as text
                run, t = g.literal(t)
                more += run
            branch = None
            if not (fork[t] or t in on or len(text) + len(more) >= MAX_TREE_TEXT):
                branch = reading.get(t)
                if branch is None:
                    branch = reading[t] = np.flatnonzero(trans[t] >= 0)
            if branch is None or len(branch) > TREE_BRANCH:
                texts.append(text + more)
                ends.append(t)
                size += len(texts[-1])
                if len(texts) > TREE_TEXTS or size > TREE_BYTES:
                    return None
            else:
                todo.append((t, text + more, on + (t,), branch.tolist()))
    return texts, ends


def past_range(info, text: bytes) -> tuple[int, int]:
    """[lo, hi) in `info.sorted_ids` of the tokens that start with `text` and run past its end: those
    sorting after `text` itself (and its twins) up to the last that starts with it."""
    if len(text) > 1 and len(text) >= info.longest_from[text[0] << 8 | text[1]]:
        return 0, 0  # (no token that starts like it is longer: most names, no bisect needed)
    lo = bisect.bisect_right(info.sorted_bytes, text)
    return lo, bisect.bisect_left(info.sorted_bytes, text + info.above_any, lo)


def tokens_past(info, text: bytes) -> np.ndarray:
    """The tokens that start with `text` and run past its end (a read-only view)."""
    lo, hi = past_range(info, text)
    return info.sorted_id_array[lo:hi] if hi > lo else NO_TOKENS


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
