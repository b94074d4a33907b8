"""Walks a grammar need not compute: a state of a long character chain (a string with a maxLength)
takes the walk of a state that provably walks every token like it (shifts.py), and a state of a rule
that calls no other rule takes the walk that another grammar with the same rule made (the tokenizer
keeps those, `TokenizerInfo.rule_walks`). CompiledGrammar inherits this; it provides `automaton`,
`info`, `fork_states` and the character chains of PlainRuns (`plain_run`, `plain_next`,
`_decide_along`, `_ascii_lo`, `_ascii_hi`).
"""

from __future__ import annotations

import bisect

from agentkv.grammar.masks import StateTokens
from agentkv.grammar.shifts import equivalent_runs

MAX_SHARED_CHAIN = 4096     # a character chain longer than this shares walks over its first states only


class WalkReuse:
    def _init_walk_reuse(self) -> None:
        self._rule_keys: dict[int, _RuleKey | None] = {}  # rule index -> its key in `info.rule_walks`
        self._chains_tried: set[int] = set()  # chain states `_chain_walk` has looked at
        self._chain_run: dict[int, int] = {}  # state -> its run of states that walk alike (shifts.py) ...
        self._chain_walks: list[StateTokens | None] = []  # ... and the run's walk, once computed
        self._chain_misses: dict[int, int] = {}  # rule index -> its chain states that missed

    def _chain_walk(self, q: int) -> StateTokens | None:
        """Where `q` lies on a long character chain (a string with a maxLength), the walk of a state
        that provably walks every token like it (shifts.py), once one is computed; the chain ahead of
        `q` is looked at once (from the second position of its rule that a walk asks for)."""
        limit = len(self.info.plain_bounds) - 2
        lo = self._ascii_lo[q]
        if lo == self._ascii_hi[q] and lo >= 0 and lo != q and q not in self._chains_tried \
                and self.plain_run(q) == (limit, "dead") and self._second_in_rule(q):  # (cheap tests first)
            self._decide_along(q, MAX_SHARED_CHAIN, through_decided=True)  # then followed
            chain, seen = [q], {q}
            while len(chain) < MAX_SHARED_CHAIN:
                nxt = self.plain_next(chain[-1])
                if nxt < 0 or self.fork_states[nxt] or nxt in seen or nxt in self._chains_tried:
                    break  # (a loop, a string body without a maximum: every state of it is one already)
                chain.append(nxt)
                seen.add(nxt)
            self._chains_tried.update(chain)
            horizon = int(self.info.lengths.max())
            if len(chain) > horizon + 1:
                for i, j in equivalent_runs(self.automaton.trans, self.fork_states, chain, horizon):
                    run = len(self._chain_walks)
                    self._chain_walks.append(None)
                    for s in chain[i:j]:
                        self._chain_run[s] = run
        run = self._chain_run.get(q)
        return None if run is None else self._chain_walks[run]

    def _second_in_rule(self, q: int) -> bool:
        """Is `q` the second chain state of its rule to miss? The proof costs ~50 ms for a chain of
        350 states: paid once a walk moves along the chain, not for a value that ends a token later."""
        r = bisect.bisect_right(self.automaton.starts, q) - 1
        self._chain_misses[r] = self._chain_misses.get(r, 0) + 1
        return self._chain_misses[r] >= 2

    def _walk_key(self, q: int):
        """A key under which the tokenizer keeps the walk from `q` (`info.rule_walks`), for a state of
        a rule that calls no other rule, or only itself: the walk depends on that rule alone, so
        another grammar with the same rule reuses it (a format, a pattern or a string type in another
        schema; the unconstrained JSON value, which calls itself): its expression (a call to itself
        names it), its DFA size and the state's place in it. (A rule calling others is left out:
        their names say where they sit in the schema, so another grammar rarely has the same.)"""
        a = self.automaton
        if a.rule_exprs is None:
            return None
        r = bisect.bisect_right(a.starts, q) - 1
        rule = self._rule_keys.get(r, False)
        if rule is False:
            size = (a.starts[r + 1] if r + 1 < len(a.starts) else len(a.accept)) - a.starts[r]
            expr = a.rule_exprs[r]  # (None for a rule that calls others)
            rule = None if expr is None else _RuleKey(expr, size)
            if rule is not None:  # one key object per rule and tokenizer: a lookup then compares it by
                # identity, not the expression tree (~14 us a lookup across grammars otherwise)
                rule = self.info.rule_keys.get_or_put(rule, lambda: rule)
            self._rule_keys[r] = rule
        return None if rule is None else (rule, q - a.starts[r])


class _RuleKey:
    """A rule's expression (see `_walk_key`) and DFA size as a cache key, hashed once: an
    expression's hash walks its whole tree (~100 us for a large one), which a key built per state
    would repeat per state."""

    __slots__ = ("expr", "size", "_hash")

    def __init__(self, expr, size: int):
        self.expr, self.size, self._hash = expr, size, hash((expr, size))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _RuleKey) and self._hash == other._hash and self.size == other.size \
            and (self.expr is other.expr or self.expr == other.expr)
