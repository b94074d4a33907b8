"""Where a token walk starts (masks.py's `_Walk` inherits these): from the top of a stack, most
tokens are decided without stepping them byte by byte, and the rest are handed to the walk with the
state and offset they have reached.

- Literal text (a state that reads one byte, then one again: a property name with its quotes and
  colon, a keyword): the tokens that are a prefix of it are looked up, and those that run past its
  end walk on from there (`_start_literal`); where such texts branch from one state (the names a
  strict object may write next, listed values), the same for each (`_start_tree`).
- From a state where plain text of any length lives (a string body, the names of an object that
  allows others), every prefix of plain text is one block; of the other tokens, the bytes that stop
  their plain run and the byte after it are stepped for all at once, and only those still alive walk
  (`_start_closed`). From a state of a closure near one walked before, only the tokens whose first
  byte leads elsewhere take this start (closure_walks.py).
- Plain tokens (text a JSON string takes as is) that end on a state's character chain are one block
  (`CompiledGrammar.plain_run`); along a long chain (a string with a maxLength), other tokens start
  past their plain head (`_start_along_chain`).
- From a counted repetition of a class (`[a-z0-9-]{1,63}`: each position a state, each class byte
  leading to the next), a token's head of class bytes is counted once per class and tokenizer: the
  tokens that are all head and fit end on the chain, the others start at the chain's state after
  their head (class_chains.py).
- From a state whose characters go different ways (a property name, a pattern's class), the same
  one character in: per first character, the chain of the state it leads to, and where that state
  loops on most characters, the tokens whose other bytes all loop there as one block, and of the
  others only those that can leave the loop alive walk (`_start_by_first_char`,
  `CompiledGrammar.looping_tokens`, `leaving_tokens`); where it leads every plain byte into such a
  loop (a dot before a hostname's label), the tokens whose second byte goes there and whose other
  bytes loop there too (`loop_past_class`).
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.char_steps import LOOPS, NONUNIFORM
from agentkv.grammar.class_chains import class_chain, start_along_class
from agentkv.grammar.literals import literal_tree, past_range, tokens_inside, tokens_inside_any, tokens_past
from agentkv.grammar.token_groups import (
    MANY_FIRST_CHARS,
    after_longer_first_char,
    by_first_char,
    first_byte_reads,
    first_char_bytes,
    first_steps,
    groups_mask,
    packed_has,
    packed_ids,
)
from agentkv.grammar.token_tables import ASCII_PLAIN

CHAIN_JUMP = 8  # from a character chain this long, non-plain tokens start past their plain head
TREE_PAST = 2048  # a tree of texts with more tokens running past its ends is walked by first character
WHOLE_GROUP_MASK = 4096  # a first character's whole group of more tokens is taken as a packed mask
CLASS_LOOP_GROUP = 256  # a first character's group with more tokens that walk tries the class loop after it


class WalkStarts:
    """The start routes of a token walk; the walk (masks._Walk) provides `g`, `info`, `allowed`,
    `packed`, `depth` and `run`."""

    def start(self, stack: tuple) -> None:
        """Every token from the top of `stack` (an expanded stack: its top can read a byte)."""
        g, info = self.g, self.info
        self.depth = max(self.depth, len(stack))
        q = stack[-1]
        if g.first_only[q] >= 0 and self._start_literal(stack):
            return
        reads = g.plain_closed(q)
        if reads is not None:  # every prefix of plain text is allowed (a string body, the names of an open object)
            # The others: those whose plain run stops at a byte some state there reads.
            self.packed.append(info.plain_prefixes[0])
            self._start_closed(stack, reads)
            return
        if g.plain_next(q) == NONUNIFORM:
            chain = class_chain(g, q)
            if chain is not None:
                start_along_class(self, stack, *chain)
            elif not self._start_tree(stack):
                self._start_by_first_char(stack)
            return
        upto, rest = g.plain_run(q)
        # Plain tokens of up to `upto` characters end on the top rule's character chain: allowed as a block.
        self.packed.append(info.plain_upto(upto))
        # Longer plain tokens take the byte walk ("walk") or die on the chain's last state ("dead").
        longer = len(info.plain_sorted) - info.plain_bounds[upto + 1] if rest == "walk" else 0
        row = g.automaton.trans[q]
        if upto >= CHAIN_JUMP:  # a long chain (a string of bounded length): start past the plain head
            self._start_along_chain(stack, upto, longer, rest == "dead" and upto < len(info.plain_bounds) - 2)
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

    def _start_closed(self, stack: tuple, reads: np.ndarray, firsts: np.ndarray | None = None) -> None:
        """`start` from a state where plain text of any length lives (`plain_closed`; its plain
        tokens are one block): the tokens whose plain run stops at a byte some state there `reads`
        (`stopped_by`). A token whose run is empty, or whose first byte leads to a state every plain
        character leads back to (an open object's free part of a name), reaches that byte from the
        state it is in; the byte and the one after it are stepped for all of them at once (most die
        there, or end: a name's quote with its colon). Only the others walk: from a state that can
        call or return after the stop byte, or on from the byte after it; and the tokens whose run
        passes other states (a declared name's prefix), from their first byte."""
        g, info = self.g, self.info
        q = stack[-1]
        trans = g.automaton.trans
        flat = trans.reshape(-1)
        stopped = info.stopped_by(reads)
        ids, heads, stop, after = stopped.ids, stopped.heads, stopped.stop, stopped.after
        b0 = info.bytes_at[0, ids]
        if firsts is not None:  # only the tokens with these first bytes ([256] bool; closure_walks.py)
            keep = firsts[b0]
            ids, heads, stop, after, b0 = ids[keep], heads[keep], stop[keep], after[keep], b0[keep]
        first = trans[q][b0].astype(np.int64)  # the state after each first byte
        live = first >= 0
        on = np.zeros(len(ids), dtype=bool)  # at the stop byte, from `at`
        on[live] = (heads[live] == 0) | (g.plain_reach(first[live]) >= LOOPS)
        walk_first = live & ~on  # through other states: from the first byte
        at = np.where(heads == 0, q, first)[on]
        x = flat[at * 256 + stop[on]].astype(np.int64)  # past the stop byte
        sel = np.flatnonzero(on)
        alive = x >= 0
        sel, x = sel[alive], x[alive]
        ends = after[sel] == 256
        self.allowed[ids[sel[ends]]] = True
        sel, x = sel[~ends], x[~ends]
        forks = g.fork_states[x]
        at_fork, x_fork = sel[forks], x[forks]  # (calls or returns there: the walk forks)
        sel, x = sel[~forks], x[~forks]
        y = flat[x * 256 + after[sel]].astype(np.int64)  # past the byte after it
        ok = y >= 0
        sel, y = sel[ok], y[ok]
        first_ids = np.flatnonzero(walk_first)
        idx = np.concatenate([ids[first_ids], ids[at_fork], ids[sel]])
        if len(idx):
            self.run(stack[:-1], np.concatenate([first[first_ids], x_fork, y]), idx,
                     np.concatenate([np.ones(len(first_ids), np.int64), heads[at_fork] + 1, heads[sel] + 2]))

    def _start_along_chain(self, stack: tuple, upto: int, longer: int, ends: bool) -> None:
        """`start` from a state whose plain characters lead along a chain of `upto` states (a string
        with a maximum length): a token that starts with k <= `upto` plain characters goes on from the
        chain's k-th state at its first byte that is not plain, instead of a numpy step per character.
        Where the chain `ends` there (every plain character dies after it), a token starting with more
        plain characters dies; otherwise it walks from the first byte, as do the tokens that start
        with no plain character and plain ones longer than the chain."""
        g, info = self.g, self.info
        q = stack[-1]
        row = g.automaton.trans[q]
        ids, chars, heads = info.non_plain_heads
        jump = (chars >= 1) & (chars <= upto)  # (none from `q` itself: its calls and returns are other stacks)
        states = [g.plain_chain(q, upto)[chars[jump]]]
        idx, offsets = [ids[jump]], [heads[jump]]
        # (A head past the chain's end: a run of 75 dashes and a newline would step every dash in Python.)
        others = ids[chars == 0] if ends else ids[~jump]
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
        ranges, count = [], 0  # (counted before any is gathered; a class's one-byte texts stop it early)
        for text in texts:
            lo, hi = past_range(info, text)
            count += hi - lo
            if count > TREE_PAST:
                return False
            ranges.append((lo, hi))
        past = [info.sorted_id_array[lo:hi] for lo, hi in ranges]
        self.allowed[tokens_inside_any(info, texts)] = True
        ids, counts = np.concatenate(past), [len(p) for p in past]
        if len(ids):
            self.run(stack[:-1], np.repeat(np.array(ends, dtype=np.int64), counts), ids,
                     np.repeat(np.array([len(t) for t in texts], dtype=np.int64), counts))
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
                past = g.loop_past_class(s) if not multibyte and len(ids) - k > CLASS_LOOP_GROUP else None
                if past is not None:  # (a dot before a hostname's label: 5,900 of 6,000 tokens end in it)
                    loop_state, loop = past
                    ids = ids[k:]  # (of two characters or more: a second byte)
                    ends = (g.automaton.trans[s][info.bytes_at[1, ids]] == loop_state) & packed_has(loop, ids)
                    blocks.append(ids[ends])
                    ids, k = ids[~ends], 0
                states.append(np.full(len(ids) - k, s, dtype=np.int64))
                walk.append(ids[k:])
                offsets.append(first_char_bytes(info, ids[k:]) if multibyte else np.ones(len(ids) - k, np.int64))

        chars = ASCII_PLAIN[row[ASCII_PLAIN] >= 0]
        # Characters that lead to a state looping on most characters but not all (a pattern's class):
        # the tokens whose later bytes loop there are allowed as one block per state, and only the
        # others (a quote or a character outside the class later on) walk on: those holding a byte
        # the state reads elsewhere (`leaving_tokens`; the rest die in the loop).
        for s in np.unique(row[chars]).tolist():
            loop = g.looping_tokens(s) if g.plain_next(s) == NONUNIFORM else None
            if loop is not None:
                loop, group = loop.view("<i4"), groups_mask(info, chars[row[chars] == s])
                self.packed.append(group & loop)
                leave = g.leaving_tokens(s)
                ids = packed_ids(group & ~loop if leave is None else group & ~loop & leave)
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
            block, ids, to, read = after_longer_first_char(g, info, q)
            if block is not None:
                self.packed.append(block)
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
            # their whole first character: not those stepped by a lead byte alone.) Of the others,
            # those with a one-byte first character die there unless `leaving_tokens` holds them.
            ascii_row = row[:0x80]
            targets = set(ascii_row[ascii_row >= 0].tolist()) | ({multibyte} if multibyte >= 0 else set())
            looping = {s: m for s in targets if (m := g.looping_tokens(s)) is not None}
            if looping:
                slot = np.full(g.num_states, -1, dtype=np.int64)
                slot[list(looping)] = np.arange(len(looping))
                table = np.stack(list(looping.values()))  # [looping states, words]
                leave = np.stack([np.full(info.words, -1, dtype="<i4") if (m := g.leaving_tokens(s)) is None
                                  else m for s in looping])  # (None: not known, every token kept)
                at = slot[states]
                one_byte = info.bytes_at[0, walk] < 0x80
                sel = np.nonzero((at >= 0) & ((offsets > 1) | one_byte))[0]
                t = walk[sel]
                word, bit = t >> 5, (t & 31).astype(np.uint32)
                ends = ((table[at[sel], word] >> bit) & 1).astype(bool)
                self.allowed[walk[sel[ends]]] = True
                dies = ~ends & (offsets[sel] == 1) & ~((leave[at[sel], word] >> bit) & 1).astype(bool)
                rest = np.ones(len(walk), dtype=bool)
                rest[sel[ends | dies]] = False
                states, walk, offsets = states[rest], walk[rest], offsets[rest]
            if len(walk):
                self.run(stack[:-1], states, walk, offsets.astype(np.int64))
