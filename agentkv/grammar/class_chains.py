"""Character-class chains: a counted repetition of one class of ASCII characters (a pattern's
`[a-z0-9-]{1,63}`, `[A-Za-z0-9_]{3,7}`), where each position is its own state and every byte of the
class leads from one to the next.

A token walk from such a state stepped every token made of the class byte by byte through the
chain (34k tokens of `[A-Za-z0-9_]` at 151k, ~4 ms a position). Instead, per class and tokenizer,
each token that starts with a class byte has its head counted once: how many of its leading bytes
are in the class (`TokenTables.class_heads`). From the chain (`find_class_chain`), a token whose head is all of
it and fits ends alive; every other one goes on from the chain's state at its head, at the first
byte the chain does not decide (walk_starts.py's `_start_along_class`).
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.token_tables import ASCII_PLAIN

CLASS_CHAIN_MIN = 2  # a shorter chain (a class loop right after its first character) keeps the loop's blocks


def find_class_chain(trans: np.ndarray, fork: np.ndarray, q: int, width: int):
    """(class bytes, chain, end) where the plain ASCII bytes `q` reads all lead to one state and the
    same bytes go on leading from each state of the chain to the next: `chain[k]` is where k + 1
    class bytes lead from `q`. `end` says what the last state does with a class byte: "loop" (it
    stays there), "dead", or "stop" (another state per byte, a state met before, a call or return,
    or `width` positions: the longest token's). None where there is no such chain of
    CLASS_CHAIN_MIN states. Every state but the last is no fork, so a token walks through them
    without calls or returns."""
    row = trans[q, ASCII_PLAIN]
    live = row >= 0
    if not live.any() or row[live].min() != row[live].max():
        return None
    cb = ASCII_PLAIN[live]
    chain, seen, end = [int(row[live][0])], {q}, "stop"
    while len(chain) < width and not fork[chain[-1]]:
        s = chain[-1]
        seen.add(s)
        nxt = trans[s, cb]
        lo, hi = int(nxt.min()), int(nxt.max())
        if lo != hi:
            break
        if hi < 0:
            end = "dead"
            break
        if hi == s:
            end = "loop"
            break
        if hi in seen:
            break
        chain.append(hi)
    if len(chain) < CLASS_CHAIN_MIN:
        return None
    return cb, np.array(chain, dtype=np.int64), end

