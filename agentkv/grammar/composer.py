"""Composer: a GrammarCompiler's composed grammars (grammar/composed.py), built from cached fragments.

Each part and each head is compiled once into a `Fragment` (grammar/pool.py), kept by its text (LRU,
MAX_FRAGMENTS and MAX_FRAGMENT_BYTES), and placed once in the compiler's state pool. Composing a
grammar is then: the head's and parts' fragments looked up (compiled where new), placed where new,
one two-state rule that calls the parts' roots, and a copy of the pool's rule starts in which the
head's stand-in for the composed rule starts at that rule. A step whose tools differ from a
compiled one by one tool compiles that tool alone.

The head is compiled with a stand-in for the composed rule (a rule reading one NUL byte: it is
productive and never empty, as every part must be), so the head's trimming and left-recursion check
hold for the composed grammar; the stand-in's own states are never reached. `whole` builds the same
language the classic way, the parts' rules renamed into one rule set and linked together: the
reference the tests compare composed masks with.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

from agentkv.errors import GrammarError
from agentkv.grammar.automata.automaton import link
from agentkv.grammar.automata.expr import Ref, alt, lit, renamed
from agentkv.grammar.compiled import CompiledGrammar
from agentkv.grammar.composed import ComposedGrammar
from agentkv.grammar.pool import Fragment, StatePool

if TYPE_CHECKING:
    from agentkv.grammar.compiler import GrammarCompiler

MAX_COMPOSED_STATES = 1 << 18  # a composed grammar's states (1 KiB of transitions each: 256 MiB)
MAX_FRAGMENTS = 4096
MAX_FRAGMENT_BYTES = 256 << 20  # the fragments kept: their transition rows and the walk's tables
STAND_IN = lit(b"\x00")
STAND_IN_TEXT = '"composed"'  # (what Lark reads for the rule; its expression is then replaced)


class Composer:
    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self._fragments: OrderedDict[tuple, Fragment] = OrderedDict()
        self._fragment_bytes = 0
        self._pool = StatePool(words=compiler.info.words)
        self._pools = 1
        self._lock = threading.Lock()

    def compose(self, g: ComposedGrammar, deadline: float) -> CompiledGrammar:
        head = self._fragment(("head", g.text, g.rule), g.text, deadline, stand_in=g.rule)
        parts, total = [], head.n_states + 2
        for k, text in enumerate(g.parts):
            try:
                f = self._fragment(("part", text), text, deadline)
            except GrammarError as e:  # (which part: its own pointers are within it)
                err = GrammarError(f"{g.label(k)}: {e}")
                err.pointer = e.pointer
                raise err from None
            if f.nullable:
                raise GrammarError(f"{g.label(k)} matches the empty string; every part must read at least one byte")
            parts.append(f)
            total += f.n_states
            if total > MAX_COMPOSED_STATES:  # (before compiling the parts after it)
                big = max(range(len(parts)), key=lambda i: parts[i].n_states)
                raise GrammarError(f"the grammar would hold more than {MAX_COMPOSED_STATES:,} states; its largest part "
                                   f"so far is {g.label(big)} ({parts[big].n_states:,} states): offer fewer at once "
                                   "or simplify that one")
        with self._lock:
            pool = self._pool
            new = [f for f in [head, *parts] if id(f) not in pool.placed]
            if pool.full(sum(f.n_states for f in new) + 2):
                pool = self._pool = StatePool(words=self.compiler.info.words)
                self._pools += 1
                new = [head, *parts]
            new = list({id(f): f for f in new}.values())
            pool.reserve(sum(f.n_states for f in new) + 2, sum(f.n_calls for f in new) + len(parts),
                         sum(len(f.automaton.starts) for f in new) + 1)
            _, head_rules = pool.place(head)
            alternation = pool.alternation([pool.place(f)[1] for f in parts], g.rule)
            starts = pool.starts[:pool.n_rules].copy()
            variable = head_rules + head.automaton.rule_names.index("r:" + g.rule)
            starts[variable] = starts[alternation]
            own = head.n_states + 2 + sum(f.n_states for f in {id(f): f for f in parts}.values())
            auto = pool.automaton(starts, own, variable)
        auto.root = head_rules
        relaxed = tuple(dict.fromkeys([*head.relaxed, *(replace(r, part=g.label(k)) for k, f in enumerate(parts)
                                                         for r in f.relaxed)]))
        return CompiledGrammar(auto, self.compiler.info, f"composed grammar ({len(parts)} parts)", relaxed)

    def whole(self, g: ComposedGrammar, deadline: float) -> CompiledGrammar:
        """The same language as `compose` gives, compiled as one rule set (the reference)."""
        rules, relaxed = self.compiler.lark_rules(g.text + f"\n{g.rule}: {STAND_IN_TEXT}\n", deadline)
        roots = []
        for k, text in enumerate(g.parts):
            part, more = self.compiler.lark_rules(text, deadline)
            memo: dict = {}
            rules.update({f"p{k}/{name}": renamed(expr, f"p{k}/", memo) for name, expr in part.items()})
            roots.append(Ref(f"p{k}/r:start"))
            relaxed += tuple(replace(r, part=g.label(k)) for r in more)
        rules["r:" + g.rule] = alt(*roots)
        return self.compiler.from_rules(rules, "r:start", "composed grammar, whole", deadline,
                                         tuple(dict.fromkeys(relaxed)))

    def _fragment(self, key: tuple, text: str, deadline: float, stand_in: str | None = None) -> Fragment:
        with self._lock:
            hit = self._fragments.get(key)
            if hit is not None:
                self._fragments.move_to_end(key)
                return hit
        if stand_in is not None:
            text += f"\n{stand_in}: {STAND_IN_TEXT}\n"
        rules, relaxed = self.compiler.lark_rules(text, deadline)
        if stand_in is not None:
            rules["r:" + stand_in] = STAND_IN
        frag = Fragment.of(link(rules, "r:start", deadline), self.compiler.info.trie.max_len, relaxed)
        self.compiler.check_deadline(deadline, "a composed grammar's part")
        with self._lock:
            if key not in self._fragments:
                self._fragments[key] = frag
                self._fragment_bytes += frag.nbytes
            while len(self._fragments) > 1 and (len(self._fragments) > MAX_FRAGMENTS
                                                or self._fragment_bytes > MAX_FRAGMENT_BYTES):
                _, old = self._fragments.popitem(last=False)
                self._fragment_bytes -= old.nbytes
        return frag

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            store = self._pool.walk_store.stats() if self._pool.walk_store is not None else {}
            return {"parts": len(self._fragments), "part_bytes": self._fragment_bytes, "pool_states": self._pool.n,
                    "pools": self._pools, **store}
