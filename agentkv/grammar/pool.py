"""Fragments and the state pool: what lets a grammar be composed from parts compiled apart.

A `Fragment` is a grammar's rules linked and trimmed in their own numbering (automaton.py), with the
per-state tables the token walk reads (tokens/state_tables.py: reach in plain text, byte classes,
fork and tail flags, calls in rows): all of them depend on the fragment's states alone, so they are
computed once, when the fragment is built, however many grammars use it.

A `StatePool` is one append-only state space that fragments are placed in, each once: its rows
written with their state and rule numbers moved by where it lands. A composed grammar is then a
view of the pool's first `n` states with its own copy of the rule starts (the one rule it gives as
alternatives starts at a two-state rule made for it: calls to the parts' roots); nothing a part
holds is copied again. A view never changes: later placements write past its end, and a pool that
outgrows its arrays moves to bigger ones, leaving the old ones to the grammars that use them.

A pool's grammars differ only in where their composed rule starts, so a token walk that never
expanded a call of that rule holds in all of them: the pool keeps such walks (`walk_store`,
csrc/mask_cache.c), and a new step's first mask over the text before its calls is walked once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from agentkv.grammar.automata.automaton import Automaton, fork_and_tail, nullable_rules
from agentkv.grammar.tokens.state_tables import state_tables
from agentkv.grammar.tokens.walk_tables import WalkStore

MAX_POOL_STATES = 1 << 16  # a pool's states (256 bytes of transitions each, 64 MiB); past it a new pool starts


@dataclass
class Fragment:
    """One grammar's automaton in its own numbering, with the walk's per-state tables."""

    automaton: Automaton
    text_reach: np.ndarray   # [n] int32
    class_bytes: np.ndarray  # [n, 4] uint64
    class_reach: np.ndarray  # [n] int32
    class_wide: np.ndarray   # [n] uint8
    fork: np.ndarray         # [n] bool: the state can call a rule or return
    tail: np.ndarray         # [n] bool: a return state with nothing after it
    nullable: bool           # the root rule matches the empty string
    relaxed: tuple = ()      # the JSON schema keywords its %json blocks relaxed (schema/relaxed.py)

    @classmethod
    def of(cls, automaton: Automaton, cap: int, relaxed: tuple = ()) -> Fragment:
        a = automaton
        reach, sets, class_reach, class_wide = state_tables(a.trans, cap)
        return cls(a, reach, sets, class_reach, class_wide, *fork_and_tail(a), nullable_rules(a)[0], relaxed)

    @classmethod
    def stub(cls, prefixes: tuple[bytes, ...]) -> Fragment:
        """Each of `prefixes` (none a prefix of another), then a call of its own rule (rule 1, 2, ...),
        not linked (its start is -1: the walk and the expansion stop there and ask for it,
        grammar/composer.py). The walk's tables are left without shortcuts (no reach, no classes):
        they only skip work, and a name is short."""
        states: dict[bytes, int] = {b"": 0}  # (a trie of the prefixes: a state a prefix of them)
        for prefix in prefixes:
            for k in range(1, len(prefix) + 1):
                states.setdefault(prefix[:k], len(states))
        n = len(states) + 1  # (and the accepting state every call returns to)
        trans = np.full((n, 256), -1, dtype=np.int32)
        for text, state in states.items():
            if text:
                trans[states[text[:-1]], text[-1]] = state
        accept = np.zeros(n, dtype=bool)
        accept[-1] = True
        calls = {states[prefix]: ((i + 1, n - 1),) for i, prefix in enumerate(prefixes)}
        names = ["r:start", *(f"r:start:rest{i}" for i in range(len(prefixes)))]
        a = Automaton(trans, calls, accept, (trans >= 0).any(axis=1), [0] + [-1] * len(prefixes), names)
        zeros = np.zeros(n, dtype=np.int32)
        return cls(a, zeros, np.zeros((n, 4), dtype=np.uint64), zeros.copy(), np.zeros(n, dtype=np.uint8),
                   *fork_and_tail(a), False)

    @property
    def n_states(self) -> int:
        return len(self.automaton.accept)

    @property
    def nbytes(self) -> int:
        return self.automaton.trans.nbytes + self.class_bytes.nbytes + 16 * self.n_states

    @property
    def n_calls(self) -> int:
        return sum(len(c) for c in self.automaton.calls.values())


class StatePool:
    """Append-only arrays of states, calls and rule starts (see the module docstring). Its compiler
    places fragments under a lock; `row_lists` takes its own."""

    def __init__(self, states: int = 1024, calls: int = 1024, rules: int = 256, words: int = 0):
        """`words`: the tokenizer's mask words, for the walks the pool's grammars share (0: none)."""
        self.n = self.n_calls = self.n_rules = 0
        self.walk_store = WalkStore(MAX_POOL_STATES, words) if words else None
        self.trans = np.full((states, 256), -1, dtype=np.int32)
        self.accept = np.zeros(states, dtype=bool)
        self.has_bytes = np.zeros(states, dtype=bool)
        self.fork = np.zeros(states, dtype=np.uint8)
        self.tail = np.zeros(states, dtype=np.uint8)
        self.text_reach = np.zeros(states, dtype=np.int32)
        self.class_bytes = np.zeros((states, 4), dtype=np.uint64)
        self.class_reach = np.zeros(states, dtype=np.int32)
        self.class_wide = np.zeros(states, dtype=np.uint8)
        self.call_off = np.zeros(states + 1, dtype=np.int32)
        self.call_rule = np.zeros(calls, dtype=np.int32)
        self.call_ret = np.zeros(calls, dtype=np.int32)
        self.starts = np.zeros(rules, dtype=np.int32)
        self.calls: dict[int, tuple[tuple[int, int], ...]] = {}  # (the Python walk's and expand's form)
        self.rule_names: list[str] = []
        self._rows: list[list[int]] = []  # transition rows as lists, made once (the Python walk's)
        self._rows_lock = threading.Lock()  # (grammars' mask threads ask for them)
        self.placed: dict[int, tuple[int, int]] = {}  # id(fragment) -> (state base, rule base)
        self.stubbed: dict[int, tuple] = {}  # a stub's rule not linked yet -> (its part: composer.LazyPart, which rest)
        self.keep: list[Fragment] = []  # (their ids stay theirs while placed)

    def full(self, states: int) -> bool:
        return self.n + states > MAX_POOL_STATES

    def place(self, frag: Fragment) -> tuple[int, int]:
        """Where `frag`'s states and rules are in the pool: (state base, rule base), placing it once."""
        hit = self.placed.get(id(frag))
        if hit is not None:
            return hit
        a = frag.automaton
        s0, r0 = self._grow(frag.n_states, frag.n_calls, len(a.starts))
        n = frag.n_states
        rows = slice(s0, s0 + n)
        self.trans[rows] = a.trans
        np.add(self.trans[rows], s0, out=self.trans[rows], where=self.trans[rows] >= 0)
        self.accept[rows] = a.accept
        self.has_bytes[rows] = a.has_bytes
        self.fork[rows] = frag.fork
        self.tail[rows] = frag.tail
        self.text_reach[rows] = frag.text_reach
        self.class_bytes[rows] = frag.class_bytes
        self.class_reach[rows] = frag.class_reach
        self.class_wide[rows] = frag.class_wide
        starts = np.asarray(a.starts, dtype=np.int32)
        self.starts[r0:r0 + len(a.starts)] = np.where(starts >= 0, starts + s0, -1)  # (-1: a stub's, not linked)
        self.rule_names.extend(a.rule_names)
        self._add_calls(s0, {s + s0: tuple((r + r0, t + s0) for r, t in c) for s, c in a.calls.items()}, n)
        self.placed[id(frag)] = (s0, r0)
        self.keep.append(frag)
        return s0, r0

    def alternation(self, roots: list[int], name: str) -> int:
        """A rule of two states, the first calling each rule of `roots` and returning to the second
        (which accepts); its rule index."""
        s0, r0 = self._grow(2, len(roots), 1)
        rows = slice(s0, s0 + 2)
        self.trans[rows] = -1
        self.accept[rows] = (False, True)
        self.has_bytes[rows] = False
        self.fork[rows] = 1
        self.tail[rows] = (0, 1)
        self.text_reach[rows] = 0
        self.class_bytes[rows] = 0
        self.class_reach[rows] = 0
        self.class_wide[rows] = 0
        self.starts[r0] = s0
        self.rule_names.append(name)
        self._add_calls(s0, {s0: tuple((r, s0 + 1) for r in roots)}, 2)
        return r0

    def automaton(self, starts: np.ndarray, own_states: int, variable_rule: int = -1) -> Automaton:
        """The pool's states so far as one grammar's automaton, with its rule `starts` (the pool's, or
        a copy in which `variable_rule` starts elsewhere); `own_states` counts what the grammar
        reaches (its bytes)."""
        n = self.n
        return Automaton(self.trans[:n], self.calls, self.accept[:n], self.has_bytes[:n], starts.tolist(),
                         self.rule_names, own_states=own_states,
                         tables=dict(fork=self.fork[:n], tail=self.tail[:n], text_reach=self.text_reach[:n],
                                     class_bytes=self.class_bytes[:n], class_reach=self.class_reach[:n],
                                     class_wide=self.class_wide[:n],
                                     call_off=self.call_off[:n + 1], call_rule=self.call_rule[:max(self.n_calls, 1)],
                                     call_ret=self.call_ret[:max(self.n_calls, 1)], starts=starts,
                                     rows=lambda: self.row_lists(n), variable_rule=variable_rule,
                                     walk_store=self.walk_store))

    def row_lists(self, n: int) -> list[list[int]]:
        """The first `n` transition rows as lists (the Python walk reads them one entry at a time),
        shared by the pool's grammars: each row is made once, not once a grammar."""
        with self._rows_lock:
            rows = self._rows
            if len(rows) < n:
                rows.extend(self.trans[len(rows):n].tolist())
        return rows

    # ---- growth ---------------------------------------------------------------------------------------

    def _add_calls(self, s0: int, calls: dict[int, tuple], n: int) -> None:
        """Rows s0..s0+n of the call table (CSR: a state's calls are [call_off[s], call_off[s + 1]))."""
        counts = np.zeros(n, dtype=np.int32)
        k = self.n_calls
        for s in sorted(calls):
            c = calls[s]
            counts[s - s0] = len(c)
            self.call_rule[k:k + len(c)] = [r for r, _ in c]
            self.call_ret[k:k + len(c)] = [t for _, t in c]
            k += len(c)
        self.call_off[s0 + 1:s0 + n + 1] = self.n_calls + np.cumsum(counts)
        self.n_calls = k
        self.calls.update(calls)

    def reserve(self, states: int, calls: int, rules: int) -> None:
        """Room for that much more at once: a composition places its new fragments one by one, and
        growing for each would copy the arrays (16 MiB of transitions at 128 tools) several times."""
        self._room(self.n + states, self.n_calls + calls, self.n_rules + rules)

    def _grow(self, states: int, calls: int, rules: int) -> tuple[int, int]:
        """Room for that much more (see `_room`); the new states' and rules' first numbers."""
        self._room(self.n + states, self.n_calls + calls, self.n_rules + rules)
        s0, r0 = self.n, self.n_rules
        self.n += states
        self.n_rules += rules
        return s0, r0

    def _room(self, states: int, calls: int, rules: int) -> None:
        """Arrays that hold `states`, `calls` and `rules` in all: doubled as needed, the old ones
        left to the views that use them. Rows past `n` are never read (a placement writes each row
        whole before `n` passes it), so new rows are left unwritten: writing them would touch every
        page of a pool that may never fill."""
        def bigger(arr, need):
            if need <= len(arr):
                return arr
            out = np.empty((max(need, 2 * len(arr)),) + arr.shape[1:], dtype=arr.dtype)
            out[:len(arr)] = arr
            return out

        if states > len(self.accept):
            for name in ("trans", "accept", "has_bytes", "fork", "tail", "text_reach", "class_bytes", "class_reach",
                         "class_wide"):
                setattr(self, name, bigger(getattr(self, name), states))
            # (one past the states' room: doubled apart from them, its length would drift ahead of
            # theirs and a later growth would leave it short)
            self.call_off = bigger(self.call_off, len(self.accept) + 1)
        self.call_rule = bigger(self.call_rule, calls)
        self.call_ret = bigger(self.call_ret, calls)
        self.starts = bigger(self.starts, rules)
