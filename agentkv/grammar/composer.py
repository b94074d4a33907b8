"""Composer: a GrammarCompiler's composed grammars (grammar/composed.py), built from cached fragments.

Each head is compiled once into a `Fragment` (grammar/pool.py), kept by its text (LRU,
MAX_FRAGMENTS and MAX_FRAGMENT_BYTES), and placed once in the compiler's state pool. Each part's front
end runs once (its errors are the composition's), and a part whose start rule opens with a literal
(a tool's name), or with alternatives that each do (a JSON call in either style), becomes a
`LazyPart`: a stub of those literals, each then a call of a rule not linked yet, a rest linked and
placed when a step first reaches its call (`_view`'s `link_part`, asked by
CompiledGrammar when a walk or a step stops there): a step offers many tools and calls a few.
Composing a grammar is then: the head's and parts' fragments looked up (compiled where new), placed
where new, one two-state rule that calls the parts' roots, and a copy of the pool's rule starts in
which the head's stand-in for the composed rule starts at that rule. A step whose tools differ from
a compiled one by one tool runs that tool's front end alone.

The head is compiled with a stand-in for the composed rule (a rule reading one NUL byte: it is
productive and never empty, as every part must be), so the head's trimming and left-recursion check
hold for the composed grammar; the stand-in's own states are never reached. `whole` builds the same
language the classic way, the parts' rules renamed into one rule set and linked together: the
reference the tests compare composed masks with.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.automata.automaton import Automaton, link
from agentkv.grammar.automata.expr import Alt, Lit, Ref, Seq, alt, lit, renamed, seq
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
        self._linked = 0  # lazy parts' rests linked into a pool
        self._lock = threading.Lock()

    def compose(self, g: ComposedGrammar, deadline: float) -> CompiledGrammar:
        head = self._fragment(("head", g.text, g.rule), g.text, deadline, stand_in=g.rule)
        parts, total = [], head.n_states + 2
        for k, text in enumerate(g.parts):
            try:
                part = self._part(text, deadline)
            except GrammarError as e:  # (which part: its own pointers are within it)
                err = GrammarError(f"{g.label(k)}: {e}")
                err.pointer = e.pointer
                raise err from None
            f = part.stub if isinstance(part, LazyPart) else part
            if f.nullable:
                raise GrammarError(f"{g.label(k)} matches the empty string; every part must read at least one byte")
            parts.append(part)
            total += f.n_states
            if total > MAX_COMPOSED_STATES:  # (before compiling the parts after it)
                big = max(range(len(parts)), key=lambda i: _placed(parts[i]).n_states)
                raise GrammarError(f"the grammar would hold more than {MAX_COMPOSED_STATES:,} states; its largest part "
                                   f"so far is {g.label(big)} ({_placed(parts[big]).n_states:,} states): offer fewer "
                                   "at once or simplify that one")
        with self._lock:
            pool = self._pool
            frags = list({id(f): f for f in [head, *map(_placed, parts)]}.values())
            new = [f for f in frags if id(f) not in pool.placed]
            if pool.full(sum(f.n_states for f in new) + 2):
                pool = self._pool = StatePool(words=self.compiler.info.words)
                self._pools += 1
                new = frags
            pool.reserve(sum(f.n_states for f in new) + 2, sum(f.n_calls for f in new) + len(parts),
                         sum(len(f.automaton.starts) for f in new) + 1)
            _, head_rules = pool.place(head)
            alternation = pool.alternation([self._place(pool, part) for part in parts], g.rule)
            starts = pool.starts[:pool.n_rules].copy()
            variable = head_rules + head.automaton.rule_names.index("r:" + g.rule)
            starts[variable] = starts[alternation]
            own = sum(f.n_states for f in frags) + 2
            auto = self._view(pool, starts, own, variable, head_rules)
        relaxed = tuple(dict.fromkeys([*head.relaxed, *(replace(r, part=g.label(k)) for k, f in enumerate(parts)
                                                         for r in f.relaxed)]))
        return CompiledGrammar(auto, self.compiler.info, f"composed grammar ({len(parts)} parts)", relaxed)

    def _place(self, pool: StatePool, part: Fragment | LazyPart) -> int:
        """Place a part (a lazy one's stub) in `pool`; its root rule."""
        if isinstance(part, Fragment):
            return pool.place(part)[1]
        _, r0 = pool.place(part.stub)
        for i in range(len(part.prefixes)):
            pool.stubbed[r0 + 1 + i] = (part, i)
        return r0

    def _view(self, pool: StatePool, starts, own: int, variable: int, root: int) -> Automaton:
        """A composed grammar's automaton over `pool`, and how it links a lazy part's rest when a
        walk or a step first reaches it (CompiledGrammar._link_part): the part placed in the pool once,
        the grammar's view made again over the longer pool, with its own rule starts."""
        auto = pool.automaton(starts, own, variable)
        auto.root = root

        def link_part(rule: int) -> Automaton:
            with self._lock:
                part, i = pool.stubbed[rule]
                rest = part.linked(i, self.compiler, time.monotonic() + self.compiler.timeout_s)
                if pool.starts[rule] < 0:
                    pool.reserve(rest.n_states, rest.n_calls, len(rest.automaton.starts))
                    pool.starts[rule] = pool.starts[pool.place(rest)[1]]
                    self._linked += 1
                more = np.concatenate([starts, pool.starts[len(starts):pool.n_rules]])  # (the rest's rules too)
                more[rule] = pool.starts[rule]
                return self._view(pool, more, own + rest.n_states, variable, root)

        auto.tables["link_part"] = link_part
        return auto

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
        hit = self._cached(key)
        if hit is not None:
            return hit
        if stand_in is not None:
            text += f"\n{stand_in}: {STAND_IN_TEXT}\n"
        rules, relaxed = self.compiler.lark_rules(text, deadline)
        if stand_in is not None:
            rules["r:" + stand_in] = STAND_IN
        return self._keep(key, self._linked_fragment(rules, "r:start", relaxed, deadline))

    def _part(self, text: str, deadline: float) -> Fragment | LazyPart:
        """A part, kept by its text: its front end run now (so that its errors are the composition's),
        and, where its start rule begins with a literal (a tool's name, as every format writes it), or
        is alternatives that each do (a JSON call in either style), its automaton left to be linked
        when a step first reads past such a literal (LazyPart)."""
        key = ("part", text)
        hit = self._cached(key)
        if hit is not None:
            return hit
        rules, relaxed = self.compiler.lark_rules(text, deadline)
        heads = _literal_heads(rules["r:start"])
        if heads is None:
            return self._keep(key, self._linked_fragment(rules, "r:start", relaxed, deadline))
        for i, (_, rest) in enumerate(heads):
            rules[f"r:start:rest{i}"] = rest
        return self._keep(key, LazyPart(tuple(p for p, _ in heads), rules, relaxed))

    def _linked_fragment(self, rules: dict, root: str, relaxed: tuple, deadline: float) -> Fragment:
        frag = Fragment.of(link(rules, root, deadline), self.compiler.info.trie.max_len, relaxed)
        self.compiler.check_deadline(deadline, "a composed grammar's part")
        return frag

    def _cached(self, key: tuple):
        with self._lock:
            hit = self._fragments.get(key)
            if hit is not None:
                self._fragments.move_to_end(key)
            return hit

    def _keep(self, key: tuple, frag):
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
                    "pools": self._pools, "parts_linked": self._linked, **store}


class LazyPart:
    """A part whose front end has run but whose automaton is linked when first reached: `stub` (its
    literal prefixes, each then a call of a rule not linked yet) is what compositions place; `rules`
    hold what follows prefix i as `r:start:rest{i}`, linked once (`linked`) for every pool and
    grammar that reaches it. Linking cannot fail where the front end did not (the rules resolved,
    their regexes read), save for memory or the compiler's timeout: such a failure ends the
    requests that reached it."""

    def __init__(self, prefixes: tuple[bytes, ...], rules: dict, relaxed: tuple):
        self.prefixes, self.rules, self.relaxed = prefixes, rules, relaxed
        self.stub = Fragment.stub(prefixes)
        self._rests: dict[int, Fragment] = {}

    @property
    def nbytes(self) -> int:  # (the rests' are not counted in the composer's budget: a rest is small)
        return self.stub.nbytes

    def linked(self, i: int, compiler: GrammarCompiler, deadline: float) -> Fragment:
        """The part after its prefix `i`, linked (once)."""
        if i not in self._rests:
            self._rests[i] = Fragment.of(link(self.rules, f"r:start:rest{i}", deadline), compiler.info.trie.max_len,
                                         self.relaxed)
            compiler.check_deadline(deadline, "a composed grammar's part")
        return self._rests[i]


def _literal_heads(root) -> list[tuple[bytes, object]] | None:
    """A start rule as (literal prefix, the rest) pairs: one where it begins with a literal, one an
    alternative where it begins with alternatives that each do (`("a" x | "b" y) z`); None otherwise,
    or where one prefix begins another (the stub's calls would stand in one state)."""
    first, tail = (root.items[0], root.items[1:]) if isinstance(root, Seq) else (root, ())
    heads = []
    for b in first.items if isinstance(first, Alt) else (first,):
        if isinstance(b, Lit) and b.data:
            heads.append((b.data, seq(*tail)))
        elif isinstance(b, Seq) and isinstance(b.items[0], Lit) and b.items[0].data:
            heads.append((b.items[0].data, seq(*b.items[1:], *tail)))
        else:
            return None
    prefixes = [p for p, _ in heads]
    if any(i != j and b.startswith(a) for i, a in enumerate(prefixes) for j, b in enumerate(prefixes)):
        return None
    return heads


def _placed(part: Fragment | LazyPart) -> Fragment:
    """What a composition places of a part (a lazy part's stub)."""
    return part.stub if isinstance(part, LazyPart) else part
