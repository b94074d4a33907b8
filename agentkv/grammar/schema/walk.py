"""Find how a compiled JSON grammar writes a given JSON value, if it accepts it at all.

JSON objects are unordered, while the grammar writes properties in one order; this searches the
key orders (depth first, remembering failed (configuration, remaining keys) pairs so converging
paths are not explored twice) and returns the compact text the grammar accepts. Tests and
benchmarks use it to check schema instances; users can use it to validate few-shot examples.
"""

from __future__ import annotations

from agentkv.grammar.compiled import DEAD, CompiledGrammar
from agentkv.grammar.schema.objects import dumps


class SearchBudgetExceeded(Exception):
    pass


def find_serialization(grammar: CompiledGrammar, value, budget: int = 2_000_000) -> str | None:
    """The compact JSON text of `value` that `grammar` accepts in full, or None."""
    w = _Walker(grammar, budget)
    for cid, text in w.walk(grammar.initial, value):
        if grammar.can_end(cid):
            return "".join(text)
    return None


class _Walker:
    def __init__(self, g: CompiledGrammar, budget: int):
        self.g, self.budget = g, budget
        self.failed: set = set()
        self.first_ends: dict = {}

    def _adv(self, cid: int, text: str) -> int:
        self.budget -= 1
        if self.budget < 0:
            raise SearchBudgetExceeded
        return self.g.advance(cid, text.encode())

    def walk(self, cid: int, value):
        """Yield (configuration, text pieces) after writing `value` from `cid`, one per distinct end."""
        if isinstance(value, dict):
            c = self._adv(cid, "{")
            if c != DEAD:
                for end, text in self._members(c, value, tuple(value), True):
                    yield end, ["{", *text]
        elif isinstance(value, list):
            c = self._adv(cid, "[")
            if c != DEAD:
                for end, text in self._items(c, value, 0):
                    yield end, ["[", *text]
        else:
            for text in _texts(value):
                c = self._adv(cid, text)
                if c != DEAD:
                    yield c, [text]

    def _members(self, cid: int, obj: dict, remaining: tuple, first: bool):
        """The rest of an object after '{' or after a member: members in some order, then '}'."""
        key = ("o", cid, remaining, id(obj))
        if key in self.failed:
            return
        found, yielded = False, set()
        if not remaining:
            c = self._adv(cid, "}")
            if c != DEAD:
                found = True
                yield c, ["}"]
        for k, head, c in self._candidates(cid, obj, remaining, first):
            rest = tuple(x for x in remaining if x != k)
            ends = set()
            for c2, text in self.walk(c, obj[k]):
                if c2 in ends:
                    continue
                ends.add(c2)
                for c3, tail in self._members(c2, obj, rest, False):
                    found = True
                    if c3 not in yielded:  # other key orders reaching the same end add nothing
                        yielded.add(c3)
                        yield c3, [head, *text, *tail]
        if not found:
            self.failed.add(key)

    def _candidates(self, cid: int, obj: dict, remaining: tuple, first: bool):
        """Keys the grammar accepts next, best first: the one that leaves the most others acceptable.

        A grammar writes declared properties in a fixed order; taking the key that keeps the most
        remaining keys possible picks that order without trying the permutations.
        """
        found = []
        for k in remaining:
            head = ("" if first else ",") + dumps(k) + ":"
            c = self._adv(cid, head)
            if c != DEAD:
                found.append((k, head, c))
        if len(found) <= 1:
            return found
        score = {}
        for k, _, c in found:
            end = self._first_end(c, obj[k])
            score[k] = -1 if end is None else sum(
                self._adv(end[0], "," + dumps(x) + ":") != DEAD for x in remaining if x != k)
        return sorted(found, key=lambda f: -score[f[0]])

    def _first_end(self, cid: int, value):
        key = (cid, id(value))
        if key not in self.first_ends:
            self.first_ends[key] = next(iter(self.walk(cid, value)), None)
        return self.first_ends[key]

    def _items(self, cid: int, arr: list, i: int):
        key = ("a", cid, i, id(arr))
        if key in self.failed:
            return
        found, yielded = False, set()
        if i == len(arr):
            c = self._adv(cid, "]")
            if c != DEAD:
                found = True
                yield c, ["]"]
        else:
            c = self._adv(cid, ",") if i else cid
            if c != DEAD:
                ends = set()
                for c2, text in self.walk(c, arr[i]):
                    if c2 in ends:
                        continue
                    ends.add(c2)
                    for c3, tail in self._items(c2, arr, i + 1):
                        found = True
                        if c3 not in yielded:
                            yielded.add(c3)
                            yield c3, ([","] if i else []) + text + tail
        if not found:
            self.failed.add(key)


def _texts(value) -> list[str]:
    """The texts that write a scalar: its compact JSON, and for a number also its plain decimal
    notation (a bounded number is written without an exponent: 2.5e-09 as 0.0000000025) and, where
    it has no fraction, the integer (to JSON Schema 2.0 is an integer)."""
    first = dumps(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [first]
    from decimal import Decimal

    d = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    texts = [first, format(d, "f")]
    if d == d.to_integral_value():
        texts.append(str(int(d)))
    return list(dict.fromkeys(texts))
