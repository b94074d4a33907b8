"""Token selection by first byte or first character, for the start of a token walk (walk_starts.py):
the tokens a state's readable first bytes pick out of per-byte groups, the plain tokens a state's first
characters take as blocks (per character group, through the chain of the state each leads to), and
packed masks of those groups. Slices and concatenations of precomputed groups, no per-token lookup.
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.token_tables import ASCII_PLAIN

MANY_FIRST_CHARS = 16  # from a state with this many plain ASCII first characters, one vectorized pass


def first_byte_reads(groups: list[np.ndarray], row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `groups` (per first byte) whose first byte `row` reads, and the state it leads
    each to: slices of the groups, no per-token lookup."""
    starts = np.nonzero(row >= 0)[0].tolist()
    ids = np.concatenate([groups[b] for b in starts] + [np.zeros(0, np.int64)])
    return ids, np.repeat(row[starts].astype(np.int64), [len(groups[b]) for b in starts])


def first_steps(info, row: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the tokens `ids`, those whose first byte `row` (a state's transitions) reads, and the state
    it leads each to."""
    to = row[info.bytes_at[0, ids]].astype(np.int64)
    keep = to >= 0
    return ids[keep], to[keep]


def by_first_char(g, info, chars: np.ndarray, targets: np.ndarray):
    """`take` in `WalkStarts._start_by_first_char` for many first characters at once: the plain
    tokens allowed as a block (a packed mask for the characters whose whole group is, the ids of
    the rest), and those that walk on with the state their first character leads to."""
    plain = info.first_char_groups
    unique, at = np.unique(targets, return_inverse=True)
    runs = [g.plain_run(s) for s in unique.tolist()]
    n = np.array([n for n, _ in runs], dtype=np.int64)[at]
    walks = np.array([rest == "walk" for _, rest in runs], dtype=bool)[at] | g.fork_states[targets]
    whole = n + 2 >= plain.under.shape[1] - 1  # every token of the character's group ends on the chain
    packed = None
    if whole.sum() >= MANY_FIRST_CHARS:  # an OR of group masks costs less than setting each token
        packed = groups_mask(info, chars[whole])
        chars, targets, n, walks = chars[~whole], targets[~whole], n[~whole], walks[~whole]
    lo, hi = plain.edges[chars], plain.edges[chars + 1]
    k = lo + plain.under[chars, np.minimum(n + 2, plain.under.shape[1] - 1)]
    longer = np.where(walks, hi - k, 0)
    return packed, plain.ids[ranges(lo, k)], plain.ids[ranges(k, k + longer)], np.repeat(targets, longer)


def groups_mask(info, chars: np.ndarray) -> np.ndarray:
    """Packed, read-only: the plain tokens whose first character is one of the ASCII `chars` (kept
    per set by the tokenizer: a class recurs across states and grammars). Groups are disjoint, so
    over half of them it is all ASCII-first plain tokens less the other groups."""
    def make() -> np.ndarray:
        masks = info.first_char_masks
        if 2 * len(chars) <= len(ASCII_PLAIN):
            out = np.bitwise_or.reduce(masks[chars], axis=0)
        else:
            listed = np.zeros(0x80, dtype=bool)
            listed[chars] = True
            others = ASCII_PLAIN[~listed[ASCII_PLAIN]]
            out = masks[257] & ~np.bitwise_or.reduce(masks[others], axis=0) if len(others) else masks[257].copy()
        out.flags.writeable = False
        return out

    return info.set_masks.get_or_put(("first chars", tuple(chars.tolist())), make)


def packed_ids_mask(info, ids) -> np.ndarray:
    """Packed int32 mask with the bits of `ids` set (few ids: cheaper than a bool array packed)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.zeros(info.words, dtype="<i4")
    np.bitwise_or.at(out.view(np.uint32), ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
    return out


def packed_has(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of the token `ids` has its bit set in the packed mask `words` (bool per id)."""
    return ((words.view(np.uint32)[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


def first_char_bytes(info, ids: np.ndarray) -> np.ndarray:
    """The byte count of each token's first character, from its lead byte (tokens of plain text)."""
    lead = info.bytes_at[0, ids]
    return 1 + (lead >= 0xC0) + (lead >= 0xE0) + (lead >= 0xF0)


def packed_ids(words: np.ndarray) -> np.ndarray:
    """The token ids whose bits are set in a packed mask (few words set: only those are unpacked)."""
    at = np.flatnonzero(words)
    bits = np.unpackbits(words[at].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    row, col = np.nonzero(bits)
    return at[row].astype(np.int64) * 32 + col


def ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The positions lo[0]..hi[0]-1, lo[1]..hi[1]-1, ... as one array."""
    n = hi - lo
    return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))


def longer_char_steps(g, q: int) -> np.ndarray | None:
    """Where each of the tokenizer's longer characters (`info.longer_chars`) leads from grammar `g`'s
    state `q` (-1: dies); None where one passes a call or return inside (the byte walk decides
    there). Their first two bytes are stepped once per distinct pair (a few hundred), then the third
    and fourth bytes of those that have them (a byte at a time over all 17,700 characters of a 151k
    vocabulary took 0.6-0.9 ms)."""
    chars = g.info.longer_chars
    trans, fork = g.automaton.trans, g.fork_states
    flat = trans.reshape(-1)
    first, second = chars.pair_bytes
    at = trans[q, first].astype(np.int64)
    for rows, byte in ((None, second), chars.three, chars.four):
        mid = at if rows is None else at[rows]
        live = mid >= 0
        safe = np.maximum(mid, 0)
        if (fork[safe] & live).any():  # (inside a character: a call or return there)
            return None
        step = np.where(live, flat[safe * 256 + byte], -1)
        if rows is None:
            at = step[chars.pair_of]
        else:
            at[rows] = step
    return at


def later_chars_leaving(g, q: int) -> np.ndarray:
    """Packed mask of the plain tokens holding, after their first character, a character of two or
    more bytes that does not lead from `q` back to `q` (all of them where one passes a fork): those
    a loop on `q` does not keep (`PlainRuns.looping_tokens`)."""
    info = g.info
    chars, at = info.longer_chars, longer_char_steps(g, q)
    if at is None:
        return info.later_bytes[256]
    bits = np.zeros(info.words * 32, dtype=bool)
    bits[chars.later[at[chars.later_which] != q]] = True
    return np.packbits(bits, bitorder="little").view("<u4")


def after_longer_first_char(g, info, q: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """(block, ids, states, bytes read): the plain tokens whose first character has two or more bytes,
    each distinct character stepped from `q` once. Where all but a few of those characters lead to
    one state that loops on most bytes (`\\S`: all but the Unicode spaces), its tokens whose later
    bytes all loop there are a packed `block` and the others go on from there; the rest each at the
    state its first character leads to (those it kills left out). Where a character passes a call or
    return inside, each at its first byte's state instead."""
    steps, longer = longer_char_steps(g, q), info.longer_chars
    if steps is None:
        ids, to = first_steps(info, g.automaton.trans[q], info.first_char_groups.group(256)[0])
        return None, ids, to, np.ones(len(ids), np.int64)
    live = steps >= 0
    top = int(np.bincount(steps[live]).argmax()) if live.any() else -1
    odd = np.flatnonzero(steps != top)  # (the dead ones among them)
    loop = g.looping_tokens(top) if top >= 0 and 4 * len(odd) < len(steps) else None
    if loop is None:  # each token by its first character
        to = steps[longer.first_which]
        live = to >= 0
        return None, longer.first[live], to[live], longer.lengths[longer.first_which[live]]
    # (A 45k-token pass per state cost ~1 ms at 151k; the packed masks and the few odd characters less.)
    by_char, edges = longer.by_first
    odd_ids = by_char[ranges(edges[odd], edges[odd + 1])]
    odd_chars = np.repeat(odd, edges[odd + 1] - edges[odd])
    to = steps[odd_chars]
    keep = to >= 0
    mine = info.first_char_masks[256] & ~packed_ids_mask(info, odd_ids)
    loop = loop.view("<i4")
    ids = packed_ids(mine & ~loop)
    return (mine & loop, np.concatenate([ids, odd_ids[keep]]),
            np.concatenate([np.full(len(ids), top, dtype=np.int64), to[keep]]),
            np.concatenate([first_char_bytes(info, ids), longer.lengths[odd_chars[keep]]]))
