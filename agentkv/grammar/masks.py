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

Where a walk starts, most tokens are decided without stepping them (walk_starts.py: literal text
and trees of it looked up, plain tokens taken as blocks along a state's character chain or by first
character, tokens whose bytes all loop on a state as one block). A walk still going after a few
steps with few tokens left (long runs of spaces or dashes) moves each token past the bytes ahead of
it that loop on its state; in a state every plain character leads back to (a string body), a token
moves past its run of plain text in one step (`TokenizerInfo.plain_ahead`), to the quote or escape
that decides it. Down to a few dozen tokens, a walk goes on one token at a time in plain Python
(`_Walk.one`): a numpy step costs about the same at any size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentkv.grammar.char_steps import LOOPS
from agentkv.grammar.literals import NO_TOKENS, by_rest, match_rests
from agentkv.grammar.walk_starts import WalkStarts


SCALAR_MAX_TOKENS = 64  # this few tokens left: walk each in plain Python (a numpy step costs ~20 us at any size)
SKIP_EVERY, SKIP_MAX_TOKENS = 8, 1024  # every 8 steps, a walk down to 1,024 tokens skips loops of 8+ bytes
BELOW = -1  # the bottom of a relative stack: frames not known during a top-state walk


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
    return walk.found()


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


class _Walk(WalkStarts):
    """One walk's state: the tokens allowed so far, those returning below, packed blocks (the
    start routes are WalkStarts's)."""

    def __init__(self, grammar, allowed: np.ndarray, relative: bool):
        self.g = grammar
        self.info = grammar.info
        self.allowed = allowed
        self.relative = relative
        self.below: list[tuple[np.ndarray, np.ndarray]] = []
        self.packed: list[np.ndarray] = []  # blocks of allowed tokens as packed masks (not in `allowed`)
        self.depth = 0

    def found(self) -> StateTokens:
        """What a walk with the frames below unknown found: its allowed tokens and blocks packed
        together, and the tokens that returned below."""
        if self.below:
            ids = np.concatenate([i for i, _ in self.below])
            offsets = np.concatenate([o for _, o in self.below])
        else:
            ids = offsets = NO_TOKENS
        packed = np.packbits(self.allowed, bitorder="little").view("<i4")
        for block in self.packed:
            packed |= block
        return StateTokens(packed, ids, offsets, self.depth)

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
        info, trans, width = self.info, self.g.automaton.trans, len(self.info.bytes_at)
        ends = info.lengths[idx]
        if int((ends - off).max()) < SKIP_EVERY:
            return off
        skip = np.zeros(len(idx), dtype=np.int64)
        on = np.flatnonzero(~self.g.fork_states[states] & (ends > off))
        # SKIP_EVERY bytes ahead first (most tokens stop within them; a [tokens, longest rest] gather
        # cost ~0.4 ms at 1,024 tokens), then the whole rest of the few that looped on all of them (a
        # run of 100 dashes: 8 bytes at a time took a dozen rounds, ~0.5 ms).
        for span in (SKIP_EVERY, None):
            if not len(on):
                break
            start = off[on] + skip[on]
            span = span or int((ends[on] - start).max())
            if not span:  # (those left end where the first round did)
                break
            pos = start[:, None] + np.arange(span)
            ahead = info.bytes_at[np.minimum(pos, width - 1), idx[on, None]]
            at = states[on, None]
            loops = (trans[at, ahead] == at) & (pos < ends[on, None])
            whole = loops.all(axis=1)
            skip[on] += np.where(whole, span, (~loops).argmax(axis=1))
            on = on[whole]
        return off + skip

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
            rest = suffix[pos]
            reach = g.plain_reach(states, rest)
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
