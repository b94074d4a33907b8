"""Character-class chains: a counted repetition of one class of ASCII characters (a pattern's
`[a-z0-9-]{1,63}`, `[A-Za-z0-9_]{3,7}`), where each position is its own state and every byte of the
class leads from one to the next.

A token walk from such a state stepped every token made of the class byte by byte through the
chain (34k tokens of `[A-Za-z0-9_]` at 151k, ~4 ms a position). Instead, per class and tokenizer,
each token that starts with a class byte has its head counted once: how many of its leading bytes
are in the class (`class_heads`). From the chain (`class_chain`), a token whose head is all of it
and fits ends alive; every other one goes on from the chain's state at its head, at the first byte
the chain does not decide (`start_along_class`, a start route of walk_starts.py).
"""

from __future__ import annotations

import numpy as np

from agentkv.grammar.plain_runs import MAX_CACHED_STATES
from agentkv.grammar.token_groups import first_byte_reads
from agentkv.grammar.token_tables import ASCII_PLAIN

CLASS_CHAIN_MIN = 2  # a shorter chain (a class loop right after its first character) keeps the loop's blocks
MAX_CLASS_SETS = 32  # classes whose heads a tokenizer keeps (up to ~40k tokens each at 151k)


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


def class_chain(g, q: int) -> tuple[np.ndarray, np.ndarray, str] | None:
    """`find_class_chain` from grammar `g`'s state `q`, cached per state (`g._class_chains`). The
    states along the chain that read the same class bytes take the rest of it as theirs (a walk at
    each later position of a `[a-z0-9-]{1,63}` asks again)."""
    hit = g._class_chains.get(q, False)
    if hit is not False:
        return hit
    trans = g.automaton.trans
    hit = find_class_chain(trans, g.fork_states, q, len(g.info.bytes_at)) if g._ascii_one_way[q] else None
    with g._lock:
        if len(g._class_chains) >= MAX_CACHED_STATES:
            g._class_chains.clear()
        g._class_chains[q] = hit
        if hit is not None:
            cb, chain, end = hit
            reads = np.zeros(0x80, dtype=bool)
            reads[cb] = True
            along = chain[:len(chain) - CLASS_CHAIN_MIN]
            same = ((trans[along][:, :0x80] >= 0) == reads)[:, ASCII_PLAIN].all(axis=1)
            for k in np.flatnonzero(same).tolist():
                g._class_chains.setdefault(int(along[k]), (cb, chain[k + 1:], end))
    return hit


def class_heads(info, cb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, heads, whole), kept per class by the tokenizer (`info._class_heads`): the text tokens
    whose first byte is one of the class bytes `cb`, how many of their leading bytes are (at least
    1), and whether that is all of them (every position of a chain, and every grammar with the
    class, reads the same). Eight bytes a step, on only the tokens whose last eight were all in the
    class."""
    key = cb.astype(np.uint8).tobytes()
    hit = info._class_heads.get(key)
    if hit is None:
        inside = np.zeros(256, dtype=bool)
        inside[cb] = True
        groups = info.first_byte_groups
        ids = np.concatenate([groups[b] for b in cb.tolist()] + [np.zeros(0, np.int64)])
        heads = np.zeros(len(ids), dtype=np.int64)
        on, at = np.arange(len(ids)), 0
        while len(on) and at < len(info.bytes_at):  # (past a token's end the padding is 0, in no class)
            rows = inside[info.bytes_at[at:at + 8, ids[on]]]  # [8, tokens]
            whole = rows.all(axis=0)
            heads[on] += np.where(whole, len(rows), (~rows).argmax(axis=0))
            on, at = on[whole], at + 8
        hit = (ids, heads, heads == info.lengths[ids])
        for a in hit:
            a.flags.writeable = False
        if len(info._class_heads) >= MAX_CLASS_SETS:
            info._class_heads.clear()
        info._class_heads[key] = hit
    return hit


def start_along_class(walk, stack: tuple, cb: np.ndarray, chain: np.ndarray, end: str) -> None:
    """A token walk's start (walk_starts.py) from a state whose plain ASCII bytes `cb` lead along
    `chain`: a token whose leading class bytes (its head) are all of it ends alive where the chain
    or its loop takes them; any other goes on from the chain's state after its head, at the byte
    after it (past the chain's last state, which may be a fork: there). Where the chain ends
    "dead", a head longer than it dies. The tokens starting with another byte walk from it."""
    g, info = walk.g, walk.info
    ids, heads, whole = class_heads(info, cb)
    n = len(chain)
    at = np.minimum(heads, n)  # class bytes read along the chain
    if end == "loop":  # the last state keeps every later class byte: it takes the whole head
        done, live, off = whole, ~whole, heads
    else:
        done = whole & (heads <= n)
        live, off = ~done & ((heads <= n) if end == "dead" else True), at
    walk.allowed[ids[done]] = True
    row = g.automaton.trans[stack[-1]].copy()
    row[cb] = -1
    others, first = first_byte_reads(info.first_byte_groups, row)
    idx = np.concatenate([ids[live], others])
    if len(idx):
        walk.run(stack[:-1], np.concatenate([chain[at[live] - 1], first]), idx,
                 np.concatenate([off[live], np.ones(len(others), np.int64)]))
