"""All rules' DFAs (automata/dfa.py) -> one global transition table.

All rules' states are numbered globally: `trans[state, byte]` is the next state or -1,
`calls[state]` the (rule, return state) pairs, `accept[state]` whether the rule may return there.
States that cannot reach acceptance are removed, so every live state is a viable prefix; left
recursion and rules that accept nothing are compile errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar import native
from agentkv.grammar.automata.dfa import minimal_dfa


@dataclass
class Automaton:
    """All rules' DFAs in one state space (see the module docstring)."""

    trans: np.ndarray          # [n_states, 256] int32, -1 = no transition
    calls: dict[int, tuple[tuple[int, int], ...]]  # state -> ((rule index, return state), ...)
    accept: np.ndarray         # [n_states] bool
    has_bytes: np.ndarray      # [n_states] bool
    starts: list[int]          # rule index -> start state
    rule_names: list[str]
    # A grammar composed in a state pool (grammar/pool.py) sees the pool's states, of which it reaches
    # `own_states`, and takes the walk's per-state tables from the pool (`tables`) instead of
    # deriving them from the states (tokens/walk_tables.py).
    own_states: int = -1
    tables: dict = field(default_factory=dict)
    root: int = 0              # the start rule's index

    @property
    def nbytes(self) -> int:
        """The transition rows this grammar holds (in a pool: those it reaches)."""
        return self.trans.nbytes if self.own_states < 0 else self.own_states * 256 * 4


def link(rules: dict[str, object], root: str, deadline: float) -> Automaton:
    """Compile every rule reachable from `root` and link them into one automaton."""
    names, todo, built = [], [root], {}
    while todo:
        n = todo.pop()
        if n in built:
            continue
        if n not in rules:
            raise GrammarError(f"rule '{n}' is used but never defined")
        built[n] = d = minimal_dfa(rules[n], deadline)
        names.append(n)
        todo.extend(d.rules)  # (the rules it calls, as its construction found them: no walk of the expression)
    rule_ix = {n: i for i, n in enumerate(names)}
    dfas = [built[n] for n in names]
    offsets, total = [], 0
    for d in dfas:
        offsets.append(total)
        total += len(d.accept)
    # Every rule's table shifted by its offset, in one pass over all of them (-1 stays -1), in place:
    # a temporary the size of the table cost more in fresh pages than the addition.
    trans = np.concatenate([d.table for d in dfas])
    shift = np.repeat(np.array(offsets, dtype=np.int32), [len(d.accept) for d in dfas])
    np.add(trans, shift[:, None], out=trans, where=trans >= 0)
    accept = np.concatenate([d.accept for d in dfas])
    calls: dict[int, tuple] = {}
    for d, off in zip(dfas, offsets):
        for s, row in enumerate(d.calls):
            if row:
                calls[off + s] = tuple((rule_ix[name], off + t) for name, t in row)
    starts = list(offsets)
    auto = Automaton(trans, calls, accept, None, starts, names)  # (has_bytes: set by _trim)
    _trim(auto)
    _check_left_recursion(auto)
    return auto


def _trim(a: Automaton) -> None:
    """Drop states that cannot reach acceptance, and calls into rules that accept nothing."""
    live, productive = _cut_native(a) if native.load() is not None else _cut_python(a)
    if not live[a.starts[0]]:
        raise GrammarError("the grammar accepts no string at all" + _dead_ends(a, productive))
    a.calls = {s: kept for s, c in a.calls.items() if live[s]
               for kept in [tuple((r, t) for r, t in c if productive[r] and live[t])] if kept}


def _dead_ends(a: Automaton, productive) -> str:
    """Where a grammar that accepts nothing goes wrong: the innermost schema locations (rules named
    `at:<pointer>`) or rules that accept nothing."""
    dead = [n for r, n in enumerate(a.rule_names) if not productive[r] and r != a.root]
    at = {n.split("at:", 1)[1] for n in dead if "at:" in n}
    inner = sorted(p for p in at if not any(q.startswith(p + "/") for q in at))
    if inner:
        return (f": no value meets the schema at {', '.join(inner[:3])} (contradictory constraints there, such as "
                "an enum or const whose values are not of the `type` beside it, or minimum above maximum; fix them)")
    if dead:
        return f": rules {', '.join(repr(n) for n in dead[:3])} accept nothing (contradictory constraints?)"
    return " (contradictory constraints?)"


def _cut_native(a: Automaton) -> tuple[np.ndarray, list[bool]]:
    """_cut_python in C (csrc/trim.c): the search, the cut edges and `has_bytes` in one call."""
    n = len(a.accept)
    counts = np.zeros(n + 1, dtype=np.int32)
    rule, ret = [], []
    for s in sorted(a.calls):
        counts[s + 1] = len(a.calls[s])
        for r, t in a.calls[s]:
            rule.append(r)
            ret.append(t)
    call_off = np.cumsum(counts, dtype=np.int32)
    call_rule, call_ret = np.array(rule, dtype=np.int32), np.array(ret, dtype=np.int32)
    a.trans = np.ascontiguousarray(a.trans, dtype=np.int32)  # (C cuts it in place: as it already is, no copy)
    accept = a.accept.astype(np.uint8)
    starts = np.array(a.starts, dtype=np.int32)
    live = np.zeros(n, dtype=np.uint8)
    productive = np.zeros(len(a.starts), dtype=np.uint8)
    has_bytes = np.zeros(n, dtype=np.uint8)
    if native.load().agentkv_trim(n, *(x.ctypes.data for x in (a.trans, accept)), len(starts),
                                  *(x.ctypes.data for x in (starts, call_off, call_rule, call_ret, live, productive,
                                                            has_bytes))):
        raise MemoryError("trimming the grammar's automaton ran out of memory")
    a.has_bytes = has_bytes.view(bool)
    return live.view(bool), productive.astype(bool).tolist()


def _cut_python(a: Automaton) -> tuple[np.ndarray, list[bool]]:
    """(live states, productive rules), with every edge into or out of a dead state cut from
    `a.trans` and `a.has_bytes` set from what is left."""
    live, productive = _live_python(a)
    dead = ~live
    if dead.any():
        n, t = len(a.accept), a.trans
        bad = np.zeros(n + 1, dtype=bool)  # bad[-1] (the extra slot) is what a missing edge (-1) reads
        bad[:n] = dead
        t[bad[t]] = -1
        t[dead] = -1
    a.has_bytes = (a.trans >= 0).any(axis=1)
    return live, productive


def _live_python(a: Automaton) -> tuple[np.ndarray, list[bool]]:
    """(live states, productive rules): one backward search from the accepting states. A state is
    live if a byte leads to a live state, or a call to a productive rule returns to a live state
    (productivity grows as rule starts turn live)."""
    n = len(a.accept)
    src, byte = np.nonzero(a.trans >= 0)
    dst = a.trans[src, byte]
    pairs = np.unique(src.astype(np.int64) * n + dst)
    src, dst = pairs // n, pairs % n
    order = np.argsort(dst, kind="stable")
    rev_src = src[order]
    bounds = np.searchsorted(dst[order], np.arange(n + 1))
    start_of = {st: r for r, st in enumerate(a.starts)}
    calls_by_rule: dict[int, list[tuple[int, int]]] = {}
    for s, cs in a.calls.items():
        for r, t in cs:
            calls_by_rule.setdefault(r, []).append((s, t))
    live = a.accept.copy()
    productive = [False] * len(a.starts)
    waiting: dict[int, list[int]] = {}  # return state -> callers of productive rules
    queue = list(np.nonzero(live)[0])

    def mark(s: int) -> None:
        if not live[s]:
            live[s] = True
            queue.append(s)

    while queue:
        u = int(queue.pop())
        for p in rev_src[bounds[u]:bounds[u + 1]]:
            mark(int(p))
        for p in waiting.get(u, ()):
            mark(p)
        r = start_of.get(u)
        if r is not None and not productive[r]:
            productive[r] = True
            for s, t in calls_by_rule.get(r, ()):
                if live[t]:
                    mark(s)
                else:
                    waiting.setdefault(t, []).append(s)
    return live, productive


def fork_and_tail(a: Automaton) -> tuple[np.ndarray, np.ndarray]:
    """Per state: `fork`, it can call a rule or return from one (the token walk forks there); `tail`,
    a return state with nothing after it (a call from there replaces the frame, so right-recursive
    chains such as object member tails and Lark lists do not deepen the stack)."""
    called = np.zeros(len(a.accept), dtype=bool)
    called[list(a.calls)] = True
    return a.accept | called, a.accept & ~a.has_bytes & ~called


def nullable_rules(a: Automaton) -> list[bool]:
    """Per rule, whether it can return without reading a byte."""
    nullable = [False] * len(a.starts)
    accept = a.accept.tolist()  # (a list reads a state ~5x faster than the array, in the loops below)
    changed = True
    while changed:
        changed = False
        for r, start in enumerate(a.starts):
            if not nullable[r] and _reach_end_without_bytes(a, start, nullable, accept):
                nullable[r] = changed = True
    return nullable


def _check_left_recursion(a: Automaton) -> None:
    """A rule that can call itself before reading a byte would make the stack grow forever."""
    nullable = nullable_rules(a)
    left: list[set[int]] = []
    for start in a.starts:
        seen, stack, callees = {start}, [start], set()
        while stack:
            s = stack.pop()
            for r, t in a.calls.get(s, ()):
                callees.add(r)
                if nullable[r] and t not in seen:
                    seen.add(t)
                    stack.append(t)
        left.append(callees)
    for r in range(len(a.starts)):
        seen, stack = set(), list(left[r])
        while stack:
            x = stack.pop()
            if x == r:
                raise GrammarError(f"rule '{a.rule_names[r]}' is left-recursive (it can call itself before "
                                   "reading any text); rewrite it with repetition, e.g. `a: b (\"+\" b)*`")
            if x not in seen:
                seen.add(x)
                stack.extend(left[x])


def _reach_end_without_bytes(a: Automaton, start: int, nullable: list[bool], accept: list[bool]) -> bool:
    seen, stack = {start}, [start]
    while stack:
        s = stack.pop()
        if accept[s]:
            return True
        for r, t in a.calls.get(s, ()):
            if nullable[r] and t not in seen:
                seen.add(t)
                stack.append(t)
    return False
