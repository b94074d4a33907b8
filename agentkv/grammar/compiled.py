"""CompiledGrammar: the automaton of one grammar for one tokenizer, and everything derived from it lazily.

A parser configuration is the set of stacks the input so far can have left (several only where the
grammar is ambiguous at a rule call). Each stack is a tuple of automaton states, bottom first: the
top is the current state, the others are return states. Configurations are *expanded* (every
possible call pushed and every possible return popped) and interned to small integers, so that a
byte step, a token mask and the forced text are each computed once per configuration and then
shared by every request using this grammar.
"""

from __future__ import annotations

import threading
from functools import cached_property

import numpy as np

from agentkv.errors import GrammarError
from agentkv.grammar.automata.automaton import Automaton, fork_and_tail
from agentkv.grammar.automata.shortest import Shortest
from agentkv.grammar.schema.relaxed import Relaxed
from agentkv.grammar.tokens.trie import packed_has
from agentkv.grammar.tokens.vocab import TokenizerInfo
from agentkv.grammar.tokens.walk import (
    PendingRule,
    StateTokens,
    continue_below,
    stack_walk,
    top_state_tokens,
)
from agentkv.grammar.tokens.walk_tables import WalkTables

MAX_STACK_DEPTH = 512       # nesting deeper than this is refused (the token that would open it is masked)
MAX_FORCED_BYTES = 4096
MAX_CACHED_MASKS = 4096     # per grammar: 4096 x 19 KB at a 151k vocabulary
MAX_CACHED_STATES = 4096    # per grammar: top-state walks kept by the Python walk
MAX_TABLE_BYTES = 64 << 20  # per grammar: configurations, steps and forced text; past it the compiler
                            # hands out a renewed grammar (`renewed`) and this one ends with its requests
DEAD = -1


class CompiledGrammar:
    """Shared by all matchers of one grammar; thread-safe (caches are filled under a lock)."""

    def __init__(self, automaton: Automaton, info: TokenizerInfo, description: str = "grammar",
                 relaxed: tuple[Relaxed, ...] = (), shared: CompiledGrammar | None = None):
        """`shared`: a grammar of the same automaton whose token walks, top-state walks and lock this
        one uses (`renewed`)."""
        self.automaton = automaton
        self.info = info
        self.description = description
        # The JSON schema keywords this grammar does not enforce (schema/relaxed.py): `checked` ones make
        # an output worth validating against the schema.
        self.relaxed = relaxed
        a = automaton
        if a.tables:  # (composed in a state pool: computed once per part, grammar/pool.py)
            self.fork_states = a.tables["fork"].view(bool)
            self.tail_states = a.tables["tail"].view(bool)
        else:
            self.fork_states, self.tail_states = fork_and_tail(a)
        self.max_depth = MAX_STACK_DEPTH if shared is None else shared.max_depth  # (read here: tests lower it)
        self._lock = threading.RLock() if shared is None else shared._lock
        self._expanded: dict[tuple, tuple[tuple[tuple, ...], bool]] = {}
        self._state_tokens: dict[int, StateTokens] = {} if shared is None else shared._state_tokens
        if shared is not None and "walk_tables" in shared.__dict__:
            self.walk_tables = shared.walk_tables  # (keyed by automaton state: valid for every configuration)
        self._configs: list[tuple[tuple[tuple, ...], bool]] = []
        self._ids: dict[tuple, int] = {}
        self._steps: dict[tuple[int, int], int] = {}
        self._masks: dict[int, np.ndarray] = {}
        self._forced: dict[int, bytes] = {}
        self._completions: dict[int, bytes | None] = {}
        # (settled per automaton state, so a renewed grammar keeps what its first settled)
        self._shortest = Shortest(automaton) if shared is None else shared._shortest
        self._table_bytes = 0  # what the four tables above hold, estimated as they grow (table_bytes)
        self._mask_evictions = 0
        self.initial = self._linking(self._intern, [(a.starts[a.root],)])

    def __repr__(self) -> str:
        return f"CompiledGrammar({self.description}, {self.num_states} states)"

    @property
    def needs_validation(self) -> bool:
        """Does a finished output need checking against its schema (a keyword was relaxed)?"""
        return any(r.checked for r in self.relaxed)

    @property
    def num_states(self) -> int:
        a = self.automaton
        return len(a.accept) if a.own_states < 0 else a.own_states

    # -- configurations ----------------------------------------------------------------------------

    def expand(self, stack: tuple) -> tuple[tuple[tuple, ...], bool]:
        """Stacks reachable from `stack` by calls and returns alone whose top can read a byte; can end?"""
        hit = self._expanded.get(stack)
        if hit is not None:
            return hit
        a = self.automaton
        out, can_end, seen, todo = [], False, set(), [stack]
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            top = s[-1]
            if a.has_bytes[top]:
                out.append(s)
            if len(s) < self.max_depth:
                for rule, ret in a.calls.get(top, ()):
                    if a.starts[rule] < 0:  # (nothing of this expansion is kept: it is asked again)
                        raise PendingRule(rule)
                    todo.append(s[:-1] + ((a.starts[rule],) if self.tail_states[ret] else (ret, a.starts[rule])))
            if a.accept[top]:
                if len(s) == 1:
                    can_end = True
                else:
                    todo.append(s[:-1])
        result = (tuple(sorted(out)), can_end)
        self._expanded[stack] = result
        self._table_bytes += 96 + 8 * len(stack)
        return result

    def _intern(self, stacks) -> int:
        out, can_end = set(), False
        for s in stacks:
            ex, end = self.expand(s)
            out.update(ex)
            can_end |= end
        if not out and not can_end:
            return DEAD
        key = (tuple(sorted(out)), can_end)
        cid = self._ids.get(key)
        if cid is None:
            cid = len(self._configs)
            self._configs.append(key)
            self._ids[key] = cid
            self._table_bytes += 96 + sum(48 + 8 * len(s) for s in key[0])
        return cid

    def can_end(self, cid: int) -> bool:
        return self._configs[cid][1]

    def stacks(self, cid: int) -> tuple[tuple, ...]:
        return self._configs[cid][0]

    def step(self, cid: int, byte: int) -> int:
        key = (cid, byte)
        nxt = self._steps.get(key)
        if nxt is None:
            with self._lock:
                nxt = self._linking(self._step, cid, byte)
                self._steps[key] = nxt
                self._table_bytes += 72
        return nxt

    def _step(self, cid: int, byte: int) -> int:
        trans = self.automaton.trans
        moved = [s[:-1] + (int(trans[s[-1], byte]),) for s in self._configs[cid][0] if trans[s[-1], byte] >= 0]
        return self._intern(moved) if moved else DEAD

    def _linking(self, fn, *args):
        """`fn(*args)`, after linking each composed part it reaches that is not linked yet (a part's
        call from its name's end: grammar/composer.py). Held under the lock."""
        while True:
            try:
                return fn(*args)
            except PendingRule as p:
                self._link_part(p.rule)

    def _link_part(self, rule: int) -> None:
        """Link the part `rule` stands for, and take the automaton that holds it: its states are
        placed past this one's, so everything computed so far (which never reached them) stays."""
        a = self.automaton.tables["link_part"](rule)
        if a.starts[rule] < 0:  # (asked again, it would never end)
            raise GrammarError(f"{self.description}: rule {a.rule_names[rule]!r} could not be linked")
        self.automaton = a
        self._shortest.use(a)
        self.fork_states = a.tables["fork"].view(bool)
        self.tail_states = a.tables["tail"].view(bool)
        self.__dict__.pop("walk_tables", None)  # (made again over the longer view when next asked)

    def advance(self, cid: int, data: bytes) -> int:
        for b in data:
            cid = self.step(cid, b)
            if cid == DEAD:
                return DEAD
        return cid

    # -- derived per configuration ------------------------------------------------------------------

    @cached_property
    def walk_tables(self) -> WalkTables:
        """The automaton as the token walk reads it (tokens/walk_tables.py)."""
        return WalkTables(self)

    def mask(self, cid: int) -> np.ndarray:
        """Allowed tokens as an int32 bitmask row (bit i of word i // 32 is token i); EOS where it may end."""
        m = self._masks.get(cid)
        if m is None:
            with self._lock:
                m = self._linking(self._walk_mask, self._configs[cid][0])
                if self._configs[cid][1]:
                    bits = m.view(np.uint32)
                    for e in self.info.eos_ids:
                        bits[e >> 5] |= np.uint32(1 << (e & 31))
                m.flags.writeable = False
                if len(self._masks) >= MAX_CACHED_MASKS:  # bounded memory: drop the oldest mask
                    del self._masks[next(iter(self._masks))]
                    self._mask_evictions += 1
                self._masks[cid] = m
        return m

    def _walk_mask(self, stacks) -> np.ndarray:
        m = np.zeros(self.info.words, dtype="<i4")
        if self.walk_tables.cache is not None:
            self.walk_tables.mask_into(stacks, m)  # (in C, without the GIL)
        else:
            self._mask_in_python(stacks, m)
        return m

    def _mask_in_python(self, stacks, m: np.ndarray) -> None:
        """csrc/mask_cache.c's mask, in Python: each stack's top-state walk (kept per state), the tokens
        returning below it walked on through its real frames, or the whole stack walked near the
        nesting limit."""
        for stack in stacks:
            st = self.state_tokens(stack[-1])
            if st.depth + max(len(stack) - 2, 0) < self.max_depth:
                m |= st.allowed
                if len(stack) > 1:
                    continue_below(self, stack[:-1], st.below, m)
            else:  # so deep that the nesting limit may cut a token short: walk it whole
                stack_walk(self, stack, m)

    def tokens_past(self, end: int, text: bytes) -> list[int]:
        """The tokens that start with `text`, run past its end, and whose rest configuration `end`
        (reached after `text`) can read: one walk of the trie below `text` (jump-forward's boundary
        question, without computing a whole mask)."""
        trie = self.info.trie
        node = trie.node_of(text)
        if node < 0 or end == DEAD:
            return []
        ids = trie.sorted_ids[trie.tok[node] + trie.n_end[node]:trie.tok[trie.next[node]]]
        if not len(ids):
            return []
        def past() -> np.ndarray:
            words = np.zeros(self.info.words, dtype="<i4")
            self.walk_tables.past_into(self.stacks(end), node, len(text), words)
            return words

        with self._lock:
            words = self._linking(past)
        return ids[packed_has(words, ids)].tolist()

    def state_tokens(self, q: int) -> StateTokens:
        """The tokens state `q` allows whatever lies below it, and where they return below (tokens/walk.py)."""
        st = self._state_tokens.get(q)
        if st is None:
            with self._lock:
                st = top_state_tokens(self, q)
                if len(self._state_tokens) >= MAX_CACHED_STATES:
                    del self._state_tokens[next(iter(self._state_tokens))]
                self._state_tokens[q] = st
        return st

    def allowed_bytes(self, cid: int) -> np.ndarray:
        tops = [s[-1] for s in self._configs[cid][0]]
        if not tops:
            return np.zeros(0, dtype=np.int64)
        return np.nonzero((self.automaton.trans[tops] >= 0).any(axis=0))[0]

    def forced_bytes(self, cid: int) -> bytes:
        """The text every continuation from `cid` starts with (empty where the grammar may end here)."""
        hit = self._forced.get(cid)
        if hit is not None:
            return hit
        out, cur = bytearray(), cid
        while len(out) < MAX_FORCED_BYTES and not self.can_end(cur):
            nxt = self.allowed_bytes(cur)
            if len(nxt) != 1:
                break
            out.append(int(nxt[0]))
            cur = self.step(cur, int(nxt[0]))
        self._forced[cid] = bytes(out)
        self._table_bytes += 64 + len(out)
        return self._forced[cid]

    def completion(self, cid: int) -> bytes | None:
        """The shortest text that completes the output from `cid` (empty where it may end there; None
        where none does): each stack's distance is the sum of its states' distances to their rules'
        ends (automata/shortest.py), its text theirs, top first."""
        if cid in self._completions:
            return self._completions[cid]
        with self._lock:
            text = self._shortest_completion(cid)
            sh = self._shortest
            # A way out only through parts not linked yet: link one (the first a search met) and ask
            # again. The text is then some completion, the shortest through the parts linked so far.
            while text is None and sh.pending and "link_part" in self.automaton.tables:
                rule = min(sh.pending)
                if self.automaton.starts[rule] < 0:
                    self._link_part(rule)
                sh.relinked()
                text = self._shortest_completion(cid)
            self._completions[cid] = text
            self._table_bytes += 64 + len(text or b"")
        return text

    def _shortest_completion(self, cid: int) -> bytes | None:
        if self.can_end(cid):
            return b""
        sh, best = self._shortest, None
        for stack in self.stacks(cid):
            ds = [sh.distance(s) for s in stack]
            if None not in ds and (best is None or sum(ds) < best[0]):
                best = (sum(ds), stack)
        return None if best is None else b"".join(sh.text(s) for s in reversed(best[1]))

    def table_bytes(self) -> int:
        """The configurations, their expansions, byte steps and forced text, in bytes: an estimate, each
        entry counted at a typical size for its kind as it is added (not measured)."""
        return self._table_bytes

    def renewed(self) -> CompiledGrammar:
        """This grammar with empty configuration tables and masks, sharing the automaton, the token
        walks and the lock. Configuration ids are only valid in the grammar that made them, so the
        tables cannot be emptied under the matchers using them: the compiler hands new requests a
        renewed grammar instead, and this one is freed when its last matcher is."""
        return CompiledGrammar(self.automaton, self.info, self.description, self.relaxed, shared=self)

    def cache_bytes(self) -> int:
        """What this grammar holds, in bytes: its automaton, configuration tables, token masks and the
        native walks kept (as cache_info counts them)."""
        info = self.cache_info()
        return int(self.automaton.nbytes + info["table_bytes"] + info["mask_bytes"] + info.get("walk_bytes", 0))

    def cache_info(self) -> dict[str, int]:
        """What this grammar keeps: configurations, byte steps, masks (and their bytes), top-state
        walks (native: their bytes), and what was evicted. (Walk tables not built yet stay unbuilt.)"""
        with self._lock:  # (the native cache is read while no mask call changes it)
            walks = self.walk_tables.cache_stats() if "walk_tables" in self.__dict__ else {}
            masks = len(self._masks)
        return {"configs": len(self._configs), "masks": masks, "steps": len(self._steps),
                "table_bytes": self._table_bytes,
                "states": walks.get("walks", len(self._state_tokens)), "mask_bytes": masks * self.info.words * 4,
                "mask_evictions": self._mask_evictions, **walks}
