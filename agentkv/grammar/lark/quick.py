"""The common subset of Lark's grammar text, read without Lark: definitions of rules and terminals
over literals, regexes, names, groups, `[...]`, `? * +` and `~ m..n`, alternatives (also on lines
that start with `|`), `-> alias`, and the `%declare` lines of a text's `%json` schemas.

Every tool format writes its parts in this subset, and a step with 128 tools reads 128 of them: Lark's
parser of grammars (its LALR run and the trees after it) was half of such a step's cold compile. This
reader gives `lark/lower.py` the same tuples that lowering Lark's trees gives, or None wherever the
text steps outside the subset or Lark would refuse it (a comment, an import, `%ignore`, a template, a
priority, a rule modifier, a name used but not defined or defined twice, a terminal that uses a rule
or itself, any error): such texts go through Lark, which reads or refuses them as before. The tests
compare both readings over the formats' parts and the Lark tests' grammars.
"""

from __future__ import annotations

import re

from agentkv.errors import GrammarError

_TOKEN = re.compile(r"""
    (?P<NL>(?:\r?\n)+\s*)
  | (?P<WS>[ \t]+)
  | (?P<STRING>"(?:\\"|\\\\|[^"\n])*?"i?)
  | (?P<REGEXP>/(?!/)(?:\\/|\\\\|[^/])*?/[imslux]*)
  | (?P<TO>->)
  | (?P<DOTDOT>\.\.)
  | (?P<NUMBER>[+-]?\d+)
  | (?P<RULE>_?[a-z][_a-z0-9]*)
  | (?P<TERMINAL>_?[A-Z][_A-Z0-9]*)
  | (?P<OP>[+*]|[?](?![a-z_]))
  | (?P<TILDE>~)
  | (?P<PUNCT>[:|()\[\]])
  | (?P<DECLARE>%declare\b)
""", re.X)


class _Outside(Exception):
    """The text is not in the subset (Lark reads it)."""


class _Token(str):
    """A token as lark/lower.py reads Lark's (its text, `type`, `value` and `start_pos`): a lark.Token
    costs ~1 us to make, and a step of 128 tools reads ~6,000 of them."""

    __slots__ = ("type", "value", "start_pos")


def _token(kind: str, value: str, at: int) -> _Token:
    t = _Token(value)
    t.type, t.value, t.start_pos = kind, value, at
    return t


def quick_definitions(text: str, grammar) -> tuple[dict, dict] | None:
    """(rules, terminals) as `_Grammar.load` would make them from Lark's trees of `text` (the
    rewritten source), each name -> its tuple tree; None where Lark must read the text.
    `grammar` is the `_Grammar` whose literal, string and repeat readers the trees use."""
    try:
        return _Reader(text, grammar).read()
    except (_Outside, GrammarError):
        return None


class _Reader:
    def __init__(self, text: str, grammar):
        self.g = grammar
        self.toks: list[_Token] = []
        at, text = 0, text + "\n"  # (as Lark reads it)
        for m in _TOKEN.finditer(text):
            if m.start() != at:
                raise _Outside  # (finditer skipped what no token matches)
            kind, at = m.lastgroup, m.end()
            if kind != "WS":
                value = m.group()
                if kind == "PUNCT" or kind == "NL" and value.rstrip().endswith("|"):
                    kind = value.strip() or kind
                self.toks.append(_token(kind, value, m.start()))
        if at != len(text):
            raise _Outside
        self.toks.append(_token("END", "", len(text)))
        self.k = 0
        self.json = grammar.src.json

    def peek(self) -> str:
        return self.toks[self.k].type

    def take(self, kind: str | None = None) -> _Token:
        tok = self.toks[self.k]
        if kind is not None and tok.type != kind:
            raise _Outside
        self.k += 1
        return tok

    # -- definitions --------------------------------------------------------------------------------

    def read(self) -> tuple[dict, dict]:
        rules: dict[str, object] = {}
        terminals: dict[str, object] = {}
        used_in: dict[str, set[str]] = {}
        while self.peek() != "END":
            if self.peek() == "NL":
                self.take()
                continue
            if self.peek() == "DECLARE":  # (only the schemas' terminals: others are Lark's to refuse)
                self.take()
                while self.peek() in ("TERMINAL", "RULE"):
                    if self.take().value not in self.json:
                        raise _Outside
                self.take("NL")
                continue
            name = self.take().value if self.peek() in ("RULE", "TERMINAL") else self._outside()
            self.take(":")
            if name in rules or name in terminals or name in self.json:
                raise _Outside
            used: set[str] = set()
            body = self.expansions(used)
            if self.peek() != "END":
                self.take("NL")
            (terminals if name.lstrip("_")[:1].isupper() else rules)[name] = body
            used_in[name] = used
        for name, used in used_in.items():
            for u in used:
                if u not in rules and u not in terminals and u not in self.json:
                    raise _Outside  # (Lark words the error)
                if name in terminals and u not in terminals:
                    raise _Outside  # (a rule or a schema inside a terminal)
        return rules, {name: self.inlined(body, (name,), terminals) for name, body in terminals.items()}

    def inlined(self, node, path: tuple, terminals: dict):
        """A terminal's tree with the terminals it uses put in place (as Lark resolves them)."""
        if node[0] == "name":
            if node[1] in path:
                raise _Outside  # (recursion in a terminal: Lark words the error)
            return self.inlined(terminals[node[1]], path + (node[1],), terminals)
        if node[0] in ("alt", "seq"):
            return (node[0], [self.inlined(x, path, terminals) for x in node[1]])
        if node[0] == "rep":
            return ("rep", self.inlined(node[1], path, terminals), node[2], node[3])
        return node

    # -- expansions -----------------------------------------------------------------------------------

    def expansions(self, used: set):
        alts = [self.alias(used)]
        while self.peek() == "|" or self.peek().startswith("NL") and self.toks[self.k].value.rstrip().endswith("|"):
            self.take()
            alts.append(self.alias(used))
        return ("alt", alts) if len(alts) > 1 else alts[0]

    def alias(self, used: set):
        items = []
        while self.peek() in ("(", "[", "STRING", "REGEXP", "RULE", "TERMINAL"):
            items.append(self.expr(used))
        if self.peek() == "TO":
            self.take()
            self.take("RULE")
        return ("seq", items)

    def expr(self, used: set):
        atom = self.atom(used)
        if self.peek() == "OP":
            return self.g.repeat(atom, [self.take()])
        if self.peek() == "TILDE":
            ops = [self.take(), self.take("NUMBER")]
            if self.peek() == "DOTDOT":
                self.take()
                ops.append(self.take("NUMBER"))
            return self.g.repeat(atom, ops)
        return atom

    def atom(self, used: set):
        tok = self.take()
        if tok.type in ("(", "["):
            inner = self.expansions(used)
            self.take(")" if tok.type == "(" else "]")
            return inner if tok.type == "(" else ("rep", inner, 0, 1)
        if tok.type == "STRING" and self.peek() == "DOTDOT":
            self.take()
            return self.g.range_of(tok, self.take("STRING"))
        if tok.type in ("STRING", "REGEXP"):
            return self.g.literal(tok)
        used.add(tok.value)
        return ("json", tok.value) if tok.value in self.json else ("name", tok.value)

    def _outside(self):
        raise _Outside
