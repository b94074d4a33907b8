"""Walks a grammar need not compute: a state of a long character chain (a string with a maxLength)
takes the walk of a state that provably walks every token like it (shifts.py), and a state of a rule
that calls no other rule takes the walk that another grammar with the same rule made (the tokenizer
keeps those, `TokenizerInfo.rule_walks`). CompiledGrammar inherits this; it provides `automaton`,
`info`, `fork_states` and the character chains of PlainRuns (`plain_run`, `plain_next`,
`_decide_along`, `_ascii_lo`, `_ascii_hi`).
"""

from __future__ import annotations

import bisect



class WalkReuse:
    def _init_walk_reuse(self) -> None:
        self._rule_keys: dict[int, _RuleKey | None] = {}  # rule index -> its key in `info.rule_walks`

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
