"""DFA minimization of one rule in Python (Moore's partition refinement, vectorized over states): the
twin of csrc/dfa_minimize.c's where no compiler is present.

Subset construction leaves states that no input can tell apart: an unanchored `pattern` that has
matched keeps tracking fresh partial matches that can no longer change the outcome, so `.*1\\.1.*`
ends in several equivalent states instead of one. Merging them makes the automaton smaller and,
more to the point, turns such tails into a single state that every plain character loops on, which
the token walk then allows as a block instead of walking each token byte by byte.

Calls are symbols like bytes: states merge only where they call the same rules and return to
equivalent states.
"""

from __future__ import annotations

import time

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.automata.rule_dfa import RuleDFA

# Each round tells apart states one more symbol ahead; a long chain (a string with a large maxLength)
# would take as many rounds as it is long, and such chains rarely have states to merge: past this
# many rounds the rule is left as it is (unminimized is just as correct).
MAX_ROUNDS = 48


def minimize(d, deadline: float):
    """The minimal DFA equivalent to `d` (a RuleDFA), start state still 0."""

    n = len(d.accept)
    if n < 2:
        return d
    table = d.table.astype(np.int64)
    # Bytes that every state treats alike form one column (found by hashing, then checked).
    col_sig = _weights(n) @ (table + 1).astype(np.uint64)
    _, reps, inverse = np.unique(col_sig, return_index=True, return_inverse=True)
    columns = table[:, reps] if (table[:, reps[inverse.reshape(-1)]] == table).all() else table
    names = sorted({name for row in d.calls for name, _ in row})
    called = np.full((n, len(names)), -1, dtype=np.int64)
    for s, row in enumerate(d.calls):
        for name, t in row:
            called[s, names.index(name)] = t
    targets = np.hstack([columns, called])
    accept = np.asarray(d.accept, dtype=np.int64)
    # Each round hashes (class, classes of the targets) to a 64-bit signature: one vector product
    # instead of sorting rows. A collision could only merge too much, and the check below refuses
    # any partition that is not a congruence, so the result is exact either way.
    weights = _weights(targets.shape[1] + 1)
    cls, count = accept, len(np.unique(accept))
    for _ in range(MAX_ROUNDS):
        if time.monotonic() > deadline:
            raise GrammarError("grammar compilation timed out")
        ext = np.append(cls, -1) + 2  # a missing transition (-1) reads as class -1
        sig = np.hstack([(cls + 2)[:, None], ext[targets]]).astype(np.uint64) @ weights
        _, new = np.unique(sig, return_inverse=True)
        new = new.reshape(-1)
        new_count = int(new.max()) + 1
        cls = new
        if new_count == count:
            break
        if new_count == n:
            return d  # every state is distinct already
        count = new_count
    else:
        return d
    if count == n:
        return d
    first = np.full(count, n, dtype=np.int64)
    np.minimum.at(first, cls, np.arange(n))
    ext = np.append(cls, -1)
    if (accept != accept[first[cls]]).any() or (ext[targets] != ext[targets[first[cls]]]).any():
        return d  # a hash collision merged states that differ: keep the DFA as it is
    # Number the classes by their first state, so the start state's class is 0.
    order = np.argsort(first)
    renumber = np.empty(count, dtype=np.int64)
    renumber[order] = np.arange(count)
    cls = renumber[cls].tolist()
    reps = np.sort(first).tolist()
    ext = np.append(np.asarray(cls, dtype=np.int32), -1)
    table = ext[d.table[reps]]  # (a missing transition, -1, reads ext[-1] = -1)
    calls = [[(name, cls[t]) for name, t in d.calls[r]] for r in reps]
    return RuleDFA(np.ascontiguousarray(table, dtype=np.int32), calls, np.asarray(d.accept, dtype=bool)[reps])


_WEIGHTS = np.zeros(0, dtype=np.uint64)


def _weights(n: int) -> np.ndarray:
    """n fixed odd 64-bit hashing weights (grown on demand, the same every run)."""
    global _WEIGHTS
    if len(_WEIGHTS) < n:
        rng = np.random.default_rng(0x5EED)
        _WEIGHTS = rng.integers(1, 2**63, size=max(n, 2 * len(_WEIGHTS), 1024), dtype=np.uint64) | np.uint64(1)
    return _WEIGHTS[:n]
