"""The token walk: which vocabulary tokens a parser stack can read next, vectorized over tokens.

All candidate tokens advance one byte per numpy step through the global transition table; a token
that ends in a live state is allowed. Where a token's path reaches a state that can call a rule or
return from one, that group of tokens forks onto each stack the call/return leads to and continues
there (so one token may open and close nested rules). Tokens die as soon as a byte has no
transition, so the work is the total length of the surviving prefixes, not vocabulary x length.

Most of that answer depends on the top state alone: a token that stays inside the rule it starts
in (or in rules it calls) reads the same whatever frames lie below. So the walk runs once per top
state with the frames below unknown (`top_state_tokens`): it yields the tokens allowed from that
state whatever the context, and the tokens that return below it, with the bytes they have read.
A stack's mask is then the state's tokens plus those returning tokens walked on through the real
frames (`continue_below`). Configurations that differ only below the top (the same string rule as
the value of many properties, the same item rule at every nesting depth) share the expensive part.
Where the nesting limit could cut a token short, the stack is walked whole instead (`stack_walk`).

Plain tokens (text a JSON string takes as is) skip the walk where a state's characters all lead one
way: those that end on that character chain are allowed as a block (`CompiledGrammar.plain_run`).
From a state where they do not (a property name, a pattern's class), the shortcut starts one
character in: per first character, the chain of the state it leads to (`_start_by_first_char`);
where the characters from there spell out a few literal texts (the names a strict object may write
next, listed values), the tokens inside them are looked up instead (`_start_tree`).
Where that character leads to a state that loops on most characters (a class, or the text around a
substring a pattern must contain), the tokens whose other bytes all loop there are allowed as a block
too (`CompiledGrammar.looping_tokens`). A walk still going after a few steps with few tokens left
(long runs of spaces or dashes) moves each token past the bytes ahead of it that loop on its state;
in a state every plain character leads back to (a string body), a token moves past its run of plain
text in one step (`TokenizerInfo.plain_ahead`), to the quote or escape that decides it. Down to a
few dozen tokens, a walk goes on one token at a time in plain Python (`_Walk.one`): a numpy step
costs about the same at any size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentkv.grammar.literals import (
    NO_TOKENS,
    by_rest,
    literal_tree,
    match_rests,
    tokens_inside,
    tokens_inside_any,
    tokens_past,
)
from agentkv.grammar.token_groups import (
    MANY_FIRST_CHARS,
    after_longer_first_char,
    by_first_char,
    first_byte_reads,
    first_steps,
    groups_mask,
    packed_ids,
)
from agentkv.grammar.token_tables import ASCII_PLAIN

LOOPS = 1 << 20  # CompiledGrammar.plain_reach of a state every plain character leads back to

SCALAR_MAX_TOKENS = 64  # this few tokens left: walk each in plain Python (a numpy step costs ~20 us at any size)
SKIP_EVERY, SKIP_MAX_TOKENS = 8, 1024  # every 8 steps, a walk down to 1,024 tokens skips loops of 8+ bytes
CHAIN_JUMP = 8  # from a character chain this long, non-plain tokens start past their plain head
TREE_PAST = 2048  # a tree of texts with more tokens running past its ends is walked by first character
WHOLE_GROUP_MASK = 4096  # a first character's whole group of more tokens is taken as a packed mask
BELOW = -1  # the bottom of a relative stack: frames not known during a top-state walk
NONUNIFORM, ALL_DEAD = -1, -2  # where plain characters lead from a state (CompiledGrammar.plain_next)


@dataclass(frozen=True)
class StateTokens:
    """What a top state allows whatever lies below it (see the module docstring)."""

    allowed: np.ndarray       # packed bitmask words (little-endian bit order), context-free part
    below_ids: np.ndarray     # tokens that return below the state's frame ...
    below_offsets: np.ndarray # ... having read this many of their bytes
    depth: int                # the longest relative stack the walk considered (for the depth limit)


def top_state_tokens(grammar, q: int) -> StateTokens:
    """Walk every token from state `q` with the frames below it unknown."""
    info = grammar.info
    allowed = np.zeros(info.words * 32, dtype=bool)
    walk = _Walk(grammar, allowed, relative=True)
    walk.start((BELOW, q))
    if walk.below:
        ids = np.concatenate([i for i, _ in walk.below])
        offsets = np.concatenate([o for _, o in walk.below])
    else:
        ids = offsets = NO_TOKENS
    packed = np.packbits(allowed, bitorder="little").view("<i4")
    for block in walk.packed:
        packed |= block
    return StateTokens(packed, ids, offsets, walk.depth)


def stack_walk(grammar, stack: tuple, allowed: np.ndarray) -> None:
    """Set `allowed[t]` for every token t that the real `stack` (expanded) can read in full."""
    walk = _Walk(grammar, allowed, relative=False)
    walk.start(stack)
    for block in walk.packed:
        allowed |= np.unpackbits(block.view(np.uint8), bitorder="little").astype(bool)


def continue_below(grammar, lower: tuple, ids: np.ndarray, offsets: np.ndarray, allowed: np.ndarray) -> None:
    """Tokens that returned into `lower` (a real stack, its top the return state) after `offsets` bytes."""
    if not lower or not len(ids):
        return  # returned from the bottom frame: the grammar ended, so longer tokens die
    _Walk(grammar, allowed, relative=False).fork(lower, ids, offsets)


class _Walk:
    def __init__(self, grammar, allowed: np.ndarray, relative: bool):
        self.g = grammar
        self.info = grammar.info
        self.allowed = allowed
        self.relative = relative
        self.below: list[tuple[np.ndarray, np.ndarray]] = []
        self.packed: list[np.ndarray] = []  # blocks of allowed tokens as packed masks (not in `allowed`)
        self.depth = 0

    def start(self, stack: tuple) -> None:
        """Every token from the top of `stack` (an expanded stack: its top can read a byte)."""
        g, info = self.g, self.info
        self.depth = max(self.depth, len(stack))
        q = stack[-1]
        if g.first_only[q] >= 0 and self._start_literal(stack):
            return
        reads = g.plain_closed(q)
        if reads is not None:  # every prefix of plain text is allowed (a string body, the names of an open object)
            mask, groups = info.plain_prefixes
            self.packed.append(mask)  # the others walk: those a state there reads the first odd byte of
            ids = np.concatenate([groups[b] for b in np.nonzero(reads)[0].tolist()] + [np.zeros(0, np.int64)])
            ids, states = first_steps(info, g.automaton.trans[q], ids)
            if len(ids):
                self.run(stack[:-1], states, ids, np.ones(len(ids), dtype=np.int64))
            return
        if g.plain_next(q) == NONUNIFORM:
            if not self._start_tree(stack):
                self._start_by_first_char(stack)
            return
        upto, rest = g.plain_run(q)
        # Plain tokens of up to `upto` characters end on the top rule's character chain: allowed as a block.
        self.packed.append(info.plain_upto(upto))
        # Longer plain tokens take the byte walk ("walk") or die on the chain's last state ("dead").
        longer = len(info.plain_sorted) - info.plain_bounds[upto + 1] if rest == "walk" else 0
        row = g.automaton.trans[q]
        if upto >= CHAIN_JUMP:  # a long chain (a string of bounded length): start past the plain head
            self._start_along_chain(stack, upto, longer)
            return
        if len(info.non_plain_ids) + longer > len(info.text_ids) // 2:  # most tokens: pick by first byte
            idx, states = first_byte_reads(info.first_byte_groups, row)
        else:  # the others by the first byte, and the longer plain tokens
            idx, states = first_byte_reads(info.non_plain_by_first_byte, row)
            if longer:
                more, to = first_steps(info, row, info.plain_sorted[info.plain_bounds[upto + 1]:])
                idx, states = np.concatenate([idx, more]), np.concatenate([states, to])
        if len(idx):
            self.run(stack[:-1], states, idx, np.ones(len(idx), dtype=np.int64))

    def _start_along_chain(self, stack: tuple, upto: int, longer: int) -> None:
        """`start` from a state whose plain characters lead along a chain of `upto` states (a string
        with a maximum length): a token that starts with k <= `upto` plain characters goes on from the
        chain's k-th state at its first byte that is not plain, instead of a numpy step per character.
        Tokens that start otherwise, and plain ones longer than the chain, walk from the first byte."""
        g, info = self.g, self.info
        q = stack[-1]
        row = g.automaton.trans[q]
        ids, chars, heads = info.non_plain_heads
        jump = (chars >= 1) & (chars <= upto)  # (none from `q` itself: its calls and returns are other stacks)
        states = [g.plain_chain(q, upto)[chars[jump]]]
        idx, offsets = [ids[jump]], [heads[jump]]
        others = ids[~jump]
        if longer:
            others = np.concatenate([others, info.plain_sorted[info.plain_bounds[upto + 1]:]])
        others, to = first_steps(info, row, others)
        states.append(to)
        idx.append(others)
        offsets.append(np.ones(len(others), dtype=np.int64))
        idx = np.concatenate(idx)
        if len(idx):
            self.run(stack[:-1], np.concatenate(states), idx, np.concatenate(offsets))

    def _start_literal(self, stack: tuple) -> bool:
        """`start` from a state that reads exactly one byte, and the states after it too (a property
        name with its quotes and colon, a keyword): the tokens that are a prefix of that text are
        looked up, and only those that run past its end walk on from there. False (nothing done)
        where the text is a single byte: the walk costs no more."""
        text, q = self.g.literal(stack[-1])
        if len(text) < 2:
            return False
        self.allowed[tokens_inside(self.info, text)] = True
        longer = tokens_past(self.info, text)
        if len(longer):
            self.run(stack[:-1], np.full(len(longer), q, dtype=np.int64), longer,
                     np.full(len(longer), len(text), dtype=np.int64))
        return True

    def _start_tree(self, stack: tuple) -> bool:
        """`start` from a state where literal texts branch (`literals.literal_tree`): the tokens
        inside them looked up, those running past a text's end walked on from the state after it.
        False (nothing done) where the state is no such tree, or where more than TREE_PAST tokens
        would run past (short texts: a number's first digit; the byte walk's shortcuts do better)."""
        tree = literal_tree(self.g, stack[-1])
        if tree is None:
            return False
        info, texts, ends = self.info, *tree
        past = [tokens_past(info, t) for t in texts]
        if sum(map(len, past)) > TREE_PAST:
            return False
        self.allowed[tokens_inside_any(info, texts)] = True
        ids = np.concatenate(past)
        if len(ids):
            self.run(stack[:-1], np.repeat(np.array(ends, dtype=np.int64), list(map(len, past))), ids,
                     np.repeat(np.array(list(map(len, texts)), dtype=np.int64), list(map(len, past))))
        return True

    def _start_by_first_char(self, stack: tuple) -> None:
        """`start` from a state whose plain characters go different ways (inside a property name, a
        pattern's character class): after their first character, each group of plain tokens takes
        the chain shortcut of the state that character leads to, as a block. The rest walk."""
        g, info = self.g, self.info
        q = stack[-1]
        row = g.automaton.trans[q]
        plain = info.first_char_groups
        blocks, states, walk, offsets = [], [], [], []  # ids allowed at once; those that walk on

        def take(s: int, group: int, multibyte: bool = False) -> None:
            ids, bounds = plain.group(group)
            n, rest = g.plain_run(s)  # after the first character, up to n more end on s's chain
            k = bounds[min(n + 2, len(bounds) - 1)]
            if k == len(ids) > WHOLE_GROUP_MASK:
                self.packed.append(info.first_char_masks[group])
                return
            blocks.append(ids[:k])
            if (rest == "walk" or g.fork_states[s]) and k < len(ids):  # s may call or return: fork there
                states.append(np.full(len(ids) - k, s, dtype=np.int64))
                walk.append(ids[k:])
                lead = info.bytes_at[0, ids[k:]]  # the first character's length in bytes
                offsets.append(2 + (lead >= 0xE0) + (lead >= 0xF0) if multibyte else np.ones(len(ids) - k, np.int64))

        chars = ASCII_PLAIN[row[ASCII_PLAIN] >= 0]
        # Characters that lead to a state looping on most characters but not all (a pattern's class):
        # the tokens whose later bytes loop there are allowed as one block per state, and only the
        # others (a quote or a character outside the class later on) walk on.
        for s in np.unique(row[chars]).tolist():
            loop = g.looping_tokens(s) if g.plain_next(s) == NONUNIFORM else None
            if loop is not None:
                loop, group = loop.view("<i4"), groups_mask(info, chars[row[chars] == s])
                self.packed.append(group & loop)
                ids = packed_ids(group & ~loop)
                states.append(np.full(len(ids), s, dtype=np.int64))
                walk.append(ids)
                offsets.append(np.ones(len(ids), np.int64))
                chars = chars[row[chars] != s]
        if len(chars) < MANY_FIRST_CHARS:
            for b in chars.tolist():
                take(int(row[b]), b)
        else:  # the same for all characters at once
            packed, block, ids, to = by_first_char(g, info, chars, row[chars].astype(np.int64))
            if packed is not None:
                self.packed.append(packed)
            blocks.append(block)
            walk.append(ids)
            states.append(to)
            offsets.append(np.ones(len(ids), np.int64))
        multibyte = g.multibyte_next(q)
        if multibyte >= 0:
            take(multibyte, 256, multibyte=True)
        elif multibyte == NONUNIFORM:  # first characters go different ways: each token from its own
            ids, to, read = after_longer_first_char(g, info, q)
            states.append(to)
            walk.append(ids)
            offsets.append(read)
        ids, first = first_byte_reads(info.non_plain_by_first_byte, row)  # each from its first byte
        walk.append(ids)
        states.append(first)
        offsets.append(np.ones(len(ids), np.int64))
        if blocks:
            self.allowed[np.concatenate(blocks)] = True
        if walk:
            states, walk, offsets = np.concatenate(states), np.concatenate(walk), np.concatenate(offsets)
            # Where the first character leads to a state that loops on most characters (a pattern's
            # class, or the text before or after a substring it must contain), the tokens whose other
            # bytes all loop there end there: allowed without a walk. (Only tokens that have read
            # their whole first character: not those stepped by a lead byte alone.)
            ascii_row = row[:0x80]
            targets = set(ascii_row[ascii_row >= 0].tolist()) | ({multibyte} if multibyte >= 0 else set())
            looping = {s: m for s in targets if (m := g.looping_tokens(s)) is not None}
            if looping:
                slot = np.full(g.num_states, -1, dtype=np.int64)
                slot[list(looping)] = np.arange(len(looping))
                table = np.stack(list(looping.values()))  # [looping states, words]
                at = slot[states]
                sel = np.nonzero((at >= 0) & ((offsets > 1) | (info.bytes_at[0, walk] < 0x80)))[0]
                t = walk[sel]
                ends = sel[((table[at[sel], t >> 5] >> (t & 31).astype(np.uint32)) & 1).astype(bool)]
                self.allowed[walk[ends]] = True
                rest = np.ones(len(walk), dtype=bool)
                rest[ends] = False
                states, walk, offsets = states[rest], walk[rest], offsets[rest]
            if len(walk):
                self.run(stack[:-1], states, walk, offsets.astype(np.int64))

    def fork(self, own: tuple, idx: np.ndarray, off: np.ndarray, skip: tuple | None = None) -> None:
        """Tokens `idx` (having read `off` bytes) at `own`: go on from each stack its calls and returns
        lead to (`skip`: the stack the caller walks on itself)."""
        g = self.g
        stacks, ends = g.expand(own)
        self.depth = max(self.depth, g.deepest(own))
        if ends and self.relative:
            self.below.append((idx, off))  # returns below the walked frame: the real stack decides
        b = self.info.bytes_at.reshape(-1)[off * self.info.vocab_size + idx]
        # Onto a stack whose top reads literal text (an optional member's comma and name: one stack
        # per property that may come next), the tokens' rests are compared with the text as strings.
        rests: dict[int, tuple[dict, int]] = {}  # a literal's first byte -> the tokens starting with it
        inside: dict[bytes, list[int]] = {}  # rests that end inside a literal -> their tokens
        for other in stacks:
            if other == skip:
                continue
            text, end = g.literal(other[-1]) if g.first_only[other[-1]] >= 0 else (b"", -1)
            if len(text) > 1 and len(idx) > SCALAR_MAX_TOKENS:
                grouped = rests.get(text[0])
                if grouped is None:
                    picked = b == text[0]
                    grouped = rests[text[0]] = by_rest(self.info, idx[picked], off[picked])
                on_ids, on_offsets = match_rests(text, *grouped, inside)
                if len(on_ids):
                    self.run(other[:-1], np.full(len(on_ids), end, dtype=np.int64), on_ids, on_offsets)
            else:
                nxt = g.automaton.trans[other[-1], b].astype(np.int64)
                ok = nxt >= 0
                if ok.any():
                    self.run(other[:-1], nxt[ok], idx[ok], off[ok] + 1)
        if inside:
            self.allowed[[t for ids in inside.values() for t in ids]] = True

    def _skip_loops(self, states, idx, off):
        """Move each token past the bytes ahead of it that loop on its state (a long token's run of
        spaces or dashes would otherwise take a step per byte). Not on a fork state, where each of
        those bytes could also be read after a call or return."""
        info, trans = self.info, self.g.automaton.trans
        ends = info.lengths[idx]
        span = int((ends - off).max())
        if span < SKIP_EVERY:
            return off
        pos = off[:, None] + np.arange(span)[None, :]
        ahead = info.bytes_at[np.minimum(pos, len(info.bytes_at) - 1), idx[:, None]].astype(np.int64)
        loops = (trans[states[:, None], ahead] == states[:, None]) & (pos < ends[:, None])
        skip = np.where(loops.all(axis=1), span, (~loops).argmax(axis=1))
        return off + np.where(self.g.fork_states[states], 0, skip)

    def run(self, lower: tuple, states, idx, off) -> None:
        """Tokens `idx` have read `off` bytes and sit in `states` (tops of stacks `lower + (state,)`)."""
        if len(idx) <= SCALAR_MAX_TOKENS:
            for q, t, o in zip(states.tolist(), idx.tolist(), off.tolist()):
                self.one(lower, q, t, o)
            return
        g, info = self.g, self.info
        vocab = info.vocab_size
        flat_bytes = info.bytes_at.reshape(-1)
        flat_trans = g.automaton.trans.reshape(-1)
        fork_states = g.fork_states
        suffix = info.plain_suffix.reshape(-1)
        ahead = info.plain_ahead.reshape(-1)
        pos = off * vocab + idx  # each token's next byte in the flat byte (and suffix) table; its id is pos % vocab
        steps = 0
        while True:
            steps += 1
            if steps % SKIP_EVERY == 0 and len(pos) <= SKIP_MAX_TOKENS:
                idx = pos % vocab
                pos = self._skip_loops(states, idx, pos // vocab) * vocab + idx
            # Done: all bytes read (a rest of 0 characters), or a plain-text rest that the state's
            # character chain takes whole (any length, where every plain character leads back).
            reach = g.plain_reach(states)
            rest = suffix[pos]
            done = (rest >= 0) & (rest <= reach)
            if done.any():
                self.allowed[pos[done] % vocab] = True
                keep = ~done
                states, pos, reach = states[keep], pos[keep], reach[keep]
                if not len(pos):
                    return
            forking = fork_states[states]
            if forking.any():
                for u in np.unique(states[forking]).tolist():
                    own = lower + (u,)
                    at = pos[states == u]
                    self.fork(own, at % vocab, at // vocab, skip=own)
            plain = reach >= LOOPS
            if plain.any():  # past the run of plain text ahead (the rest is not all plain: see above)
                pos = pos + np.where(plain, ahead[pos], 0).astype(np.int64) * vocab
            states = flat_trans[states * 256 + flat_bytes[pos]].astype(np.int64)
            ok = states >= 0
            states, pos = states[ok], pos[ok] + vocab
            if not len(pos):
                return
            if len(pos) <= SCALAR_MAX_TOKENS:
                for q, p in zip(states.tolist(), pos.tolist()):
                    self.one(lower, q, p % vocab, p // vocab)
                return

    def one(self, lower: tuple, q: int, t: int, off: int) -> None:
        """`run` for a single token, byte by byte in Python: the same walk without the shortcuts, which
        pay only over many tokens. A token already allowed needs no more walking."""
        g, allowed, data = self.g, self.allowed, self.info.vocab[t]
        if allowed[t]:
            return
        fork, rows, end = g.fork_list, g._rows, len(data)
        while off < end:
            b = data[off]
            if fork[q]:
                own = lower + (q,)
                stacks, ends = g.expand(own)
                self.depth = max(self.depth, g.deepest(own))
                if ends and self.relative:
                    self.below.append((np.array([t]), np.array([off])))
                for other in stacks:
                    if other != own:
                        nxt = g.row(other[-1])[b]
                        if nxt >= 0:
                            self.one(other[:-1], nxt, t, off + 1)
                if allowed[t]:  # (only a fork's branch can have allowed it meanwhile)
                    return
            q = (rows.get(q) or g.row(q))[b]
            if q < 0:
                return
            off += 1
        allowed[t] = True
