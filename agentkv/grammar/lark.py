"""Lark grammars (the dialect llguidance and xgrammar share) -> grammar rules.

Lowercase rules are context-free (they become rules, called through the stack); UPPERCASE terminals
are regular (inlined as expressions; a terminal that refers to itself is an error). Supported:
literals ("..." and "..."i), regex terminals (/.../ with flags i and s), "a".."z" ranges, `|`,
`?`, `*`, `+`, `[...]`, `(...)`, `x{m}`/`x{m,n}`, `x ~ m`/`x ~ m..n`, `%ignore`, `%import common.X`
(or `(X, Y)`), inline `%json {...}` schemas as a rule, `?rule` / `!rule` / `rule.2` prefixes and
`-> alias` (accepted, no effect on the language). The start rule is `start`.

Matching is scannerless: terminals are not split by a longest-match lexer first, so where a lexer
would split text one way only (`NAME NAME` without separator), this accepts every way. Direct left
recursion (`sum: sum "+" term | term`) is rewritten to repetition; indirect left recursion is an error.
Errors carry the line and column, with a caret under the offending text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from agentkv.errors import GrammarError
from agentkv.grammar.expr import (
    Ref,
    Repeat,
    alt,
    chars,
    lit,
    opt,
    seq,
    star,
)
from agentkv.grammar.regex import match_expr

COMMON = {
    "DIGIT": r"[0-9]", "HEXDIGIT": r"[a-fA-F0-9]", "INT": r"[0-9]+", "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"[0-9]+\.[0-9]*|\.[0-9]+", "_EXP": r"[eE][+-]?[0-9]+",
    "FLOAT": r"[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?",
    "SIGNED_FLOAT": r"[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)",
    "NUMBER": r"[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+",
    "SIGNED_NUMBER": r"[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+)",
    "ESCAPED_STRING": r'"([^"\\]|\\.)*"', "LCASE_LETTER": r"[a-z]", "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[a-zA-Z]", "WORD": r"[a-zA-Z]+", "CNAME": r"[a-zA-Z_][a-zA-Z0-9_]*",
    "WS_INLINE": r"[ \t]+", "WS": r"[ \t\f\r\n]+", "CR": r"\r", "LF": r"\n", "NEWLINE": r"(\r?\n)+",
    "SH_COMMENT": r"#[^\n]*", "CPP_COMMENT": r"//[^\n]*", "C_COMMENT": r"/\*([^*]|\*+[^*/])*\*+/",
}

_TOKEN = re.compile(r"""
    (?P<ws>[ \t]+|//[^\n]*)
  | (?P<nl>\r?\n)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imsux]*)
  | (?P<directive>%[a-z]+)
  | (?P<arrow>->)
  | (?P<range>\.\.)
  | (?P<number>[0-9]+)
  | (?P<name>[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.[0-9]+)?)
  | (?P<op>[:|?*+()\[\]~{},.])
""", re.VERBOSE)


@dataclass
class _Tok:
    kind: str
    text: str
    pos: int


class _Grammar:
    def __init__(self, text: str):
        self.text = text
        self.rules: dict[str, object] = {}      # lowercase name -> expansion tree
        self.terminals: dict[str, object] = {}  # UPPERCASE name -> expansion tree, inlined where used
        self.ignore: list = []                  # %ignore expansion trees
        self.ignore_expr = None                 # their union, repeated (set by build)
        self.json_rules: dict[str, object] = {}  # rules of the %json schemas
        self.json_count = 0

    def error(self, pos: int, what: str) -> GrammarError:
        line = self.text.count("\n", 0, pos) + 1
        start = self.text.rfind("\n", 0, pos) + 1
        end = self.text.find("\n", pos)
        src = self.text[start:end if end >= 0 else len(self.text)]
        return GrammarError(f"Lark grammar, line {line}, column {pos - start + 1}: {what}\n  {src}\n  "
                            f"{' ' * (pos - start)}^")

    # -- lexing ---------------------------------------------------------------------------------

    def tokens(self) -> list[_Tok]:
        out, i, text = [], 0, self.text
        while i < len(text):
            if text.startswith("%json", i):
                j = text.find("{", i)
                if j < 0:
                    raise self.error(i, "%json needs a JSON schema object after it")
                end = _balanced_json_end(text, j)
                if end < 0:
                    raise self.error(j, "the %json schema is not closed")
                out.append(_Tok("json", text[j:end], i))
                i = end
                continue
            m = _TOKEN.match(text, i)
            if not m:
                raise self.error(i, f"unexpected character {text[i]!r}")
            kind = m.lastgroup
            if kind != "ws":
                out.append(_Tok(kind, m.group(), i))
            i = m.end()
        out.append(_Tok("nl", "\n", len(text)))
        return out

    # -- statements -----------------------------------------------------------------------------

    def parse(self) -> None:
        toks = self.tokens()
        stmts, cur = [], []
        for k, t in enumerate(toks):
            starts_stmt = (t.kind in ("name", "directive") and (k == 0 or toks[k - 1].kind == "nl")
                           and (t.kind == "directive" or (k + 1 < len(toks) and toks[k + 1].text == ":")))
            if starts_stmt and cur:
                stmts.append(cur)
                cur = []
            if t.kind != "nl":
                cur.append(t)
        if cur:
            stmts.append(cur)
        for st in stmts:
            head = st[0]
            if head.kind == "directive":
                self.directive(st)
            elif head.kind == "name" and len(st) > 1 and st[1].text == ":":
                name = head.text.lstrip("?!").split(".")[0]
                body = _Parser(self, st[2:]).expansions_all()
                target = self.terminals if name.isupper() or name.lstrip("_").isupper() else self.rules
                if name in target:
                    raise self.error(head.pos, f"'{name}' is defined twice")
                target[name] = body
            else:
                raise self.error(head.pos, "expected a definition `name: ...` or a %directive")

    def directive(self, st: list[_Tok]) -> None:
        d = st[0]
        if d.text == "%ignore":
            body = _Parser(self, st[1:]).expansions_all()
            self.ignore.append(body)
        elif d.text == "%import":
            names = [t.text for t in st[1:] if t.kind == "name"]
            if not names or not names[0].startswith("common"):
                raise self.error(d.pos, "only `%import common.NAME` (or `%import common (A, B)`) is available")
            wanted = [n.split(".", 1)[1] for n in names if "." in n] + [n for n in names[1:] if "." not in n]
            for n in wanted:
                if n not in COMMON:
                    raise self.error(d.pos, f"common.{n} is not available (known: {', '.join(sorted(COMMON))})")
                self.terminals.setdefault(n, ("regex", COMMON[n], d.pos))
        else:
            raise self.error(d.pos, f"directive {d.text} is not supported (use %ignore, %import, %json)")

    # -- lowering -------------------------------------------------------------------------------

    def terminal(self, name: str, pos: int, stack=()) -> object:
        if name not in self.terminals:
            raise self.error(pos, f"terminal '{name}' is not defined")
        if name in stack:
            raise self.error(pos, f"terminal '{name}' refers to itself; terminals must be regular "
                                  "(make it a lowercase rule)")
        return self.lower(self.terminals[name], terminal_stack=(*stack, name))

    def lower(self, node, terminal_stack=None):
        """Expansion tree -> expression. Inside a terminal, names are inlined; in rules they are calls."""
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "regex":
            return match_expr(node[1], None) if len(node) < 4 else node[3]
        if kind == "name":
            name, pos = node[1], node[2]
            if name.isupper() or name.lstrip("_").isupper():
                return self.terminal(name, pos, terminal_stack or ())
            if terminal_stack is not None:
                raise self.error(pos, f"terminal {terminal_stack[-1]} uses the rule '{name}'; terminals "
                                      "may use only terminals")
            if name not in self.rules:
                raise self.error(pos, f"rule '{name}' is not defined")
            return Ref(f"r:{name}")
        if kind == "json":
            if terminal_stack is not None:
                raise self.error(node[2], "%json cannot appear inside a terminal")
            return Ref(node[1])
        if kind == "seq":
            parts = [self.lower(x, terminal_stack) for x in node[1]]
            if terminal_stack is None and self.ignore_expr is not None and len(parts) > 1:
                with_ws = [parts[0]]
                for p in parts[1:]:
                    with_ws += [self.ignore_expr, p]
                parts = with_ws
            return seq(*parts)
        if kind == "alt":
            return alt(*[self.lower(x, terminal_stack) for x in node[1]])
        if kind == "rep":
            inner = self.lower(node[1], terminal_stack)
            lo, hi = node[2], node[3]
            if terminal_stack is None and self.ignore_expr is not None and (hi is None or hi > 1):
                # separators between repetitions of rules may be ignored text too
                rest = Repeat(seq(self.ignore_expr, inner), max(lo - 1, 0), None if hi is None else hi - 1)
                body = seq(inner, rest)
                return body if lo >= 1 else opt(body)
            return Repeat(inner, lo, hi)
        raise AssertionError(kind)

    def build(self) -> dict[str, object]:
        if "start" not in self.rules:
            raise GrammarError("Lark grammar has no `start` rule")
        self.ignore_expr = None
        if self.ignore:
            self.ignore_expr = star(alt(*[self.lower(i, terminal_stack=()) for i in self.ignore]))
        out: dict[str, object] = {}
        for name, body in self.rules.items():
            out[f"r:{name}"] = self.lower(_remove_left_recursion(name, body))
        if self.ignore_expr is not None:
            out["r:start"] = seq(self.ignore_expr, out["r:start"], self.ignore_expr)
        out.update(self.json_rules)
        return out


class _Parser:
    """Recursive descent over one definition's tokens: expansions -> alternatives of sequences."""

    def __init__(self, g: _Grammar, toks: list[_Tok]):
        self.g, self.toks, self.i = g, toks, 0

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def expansions_all(self):
        e = self.expansions()
        if self.peek() is not None:
            raise self.g.error(self.peek().pos, f"unexpected {self.peek().text!r}")
        return e

    def expansions(self):
        alts = [self.alias_seq()]
        while self.peek() is not None and self.peek().text == "|":
            self.i += 1
            alts.append(self.alias_seq())
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def alias_seq(self):
        items = []
        while self.peek() is not None and self.peek().text not in ("|", ")", "]") and self.peek().kind != "arrow":
            items.append(self.postfix())
        if self.peek() is not None and self.peek().kind == "arrow":
            self.i += 2  # `-> alias`: a tree label, no effect on the language
        return ("seq", items)

    def postfix(self):
        atom = self.atom()
        while self.peek() is not None:
            t = self.peek()
            if t.text in ("?", "*", "+"):
                self.i += 1
                atom = ("rep", atom, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[t.text])
            elif t.text == "{" or t.text == "~":
                self.i += 1
                lo, hi = self.bounds(t.text == "{")
                atom = ("rep", atom, lo, hi)
            else:
                break
        return atom

    def bounds(self, braces: bool):
        first = self.expect("number")
        lo = hi = int(first.text)
        t = self.peek()
        if braces and t is not None and t.text == ",":
            self.i += 1
            hi = int(self.expect("number").text) if self.peek() is not None and self.peek().kind == "number" else None
        elif not braces and t is not None and t.kind == "range":
            self.i += 1
            hi = int(self.expect("number").text)
        if braces and (self.peek() is None or self.peek().text != "}"):
            raise self.g.error(first.pos, "expected '}' to close the repetition bounds")
        if braces:
            self.i += 1
        if hi is not None and hi < lo:
            raise self.g.error(first.pos, "repetition bounds out of order")
        return lo, hi

    def expect(self, kind: str) -> _Tok:
        t = self.peek()
        if t is None or t.kind != kind:
            pos = t.pos if t is not None else (self.toks[-1].pos if self.toks else 0)
            raise self.g.error(pos, f"expected a {kind}")
        self.i += 1
        return t

    def atom(self):
        t = self.peek()
        if t is None:
            raise self.g.error(self.toks[-1].pos if self.toks else 0, "expected an item")
        self.i += 1
        if t.text == "(":
            e = self.expansions()
            self.close(")", t)
            return e
        if t.text == "[":
            e = self.expansions()
            self.close("]", t)
            return ("rep", e, 0, 1)
        if t.kind == "string":
            text = _unquote(t.text, self.g, t.pos)
            nxt = self.peek()
            if nxt is not None and nxt.kind == "range":  # "a".."z"
                self.i += 1
                hi_tok = self.expect("string")
                hi = _unquote(hi_tok.text, self.g, hi_tok.pos)
                if len(text) != 1 or len(hi) != 1:
                    raise self.g.error(t.pos, "a range needs single characters: \"a\"..\"z\"")
                return ("lit", chars((text, hi)))
            if t.text.endswith("i"):
                return ("lit", seq(*[chars(c.lower(), c.upper()) if c.isalpha() else lit(c) for c in text]))
            return ("lit", lit(text))
        if t.kind == "regex":
            body, flags = t.text[1:].rsplit("/", 1)
            if set(flags) - {"i", "s"}:
                raise self.g.error(t.pos, f"regex flags {flags!r}: only i and s are supported")
            if "i" in flags:
                raise self.g.error(t.pos, "the regex flag i is not supported; spell out [aA] classes")
            pattern = body.replace("\\/", "/")
            if "s" in flags:
                pattern = pattern.replace(".", r"[\s\S]") if "\\." not in pattern else pattern
            try:
                return ("regex", pattern, t.pos, match_expr(pattern, None))
            except GrammarError as e:
                raise self.g.error(t.pos, str(e)) from None
        if t.kind == "name":
            if t.text.startswith(("?", "!")):
                raise self.g.error(t.pos, f"unexpected {t.text!r}")
            return ("name", t.text, t.pos)
        if t.kind == "json":
            try:
                schema = json.loads(t.text)
            except json.JSONDecodeError as e:
                raise self.g.error(t.pos, f"%json schema is not valid JSON: {e}") from None
            self.g.json_count += 1
            return ("json", f"json{self.g.json_count}", t.pos, schema)
        raise self.g.error(t.pos, f"unexpected {t.text!r}")

    def close(self, what: str, opener: _Tok) -> None:
        t = self.peek()
        if t is None or t.text != what:
            raise self.g.error(opener.pos, f"'{opener.text}' is never closed with '{what}'")
        self.i += 1


def _unquote(text: str, g: _Grammar, pos: int) -> str:
    body = text[:-1] if text.endswith("i") else text
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        try:
            return body[1:-1].encode().decode("unicode_escape")
        except UnicodeDecodeError:
            raise g.error(pos, "malformed string literal") from None


def _balanced_json_end(text: str, start: int) -> int:
    depth, i, in_str = 0, start, False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _remove_left_recursion(name: str, body):
    """`a: a x | a y | b | c`  ->  `a: (b | c) (x | y)*` (the same language, no left call)."""
    alts = body[1] if body[0] == "alt" else [body]
    rec, base = [], []
    for a in alts:
        items = a[1] if a[0] == "seq" else [a]
        if items and items[0][0] == "name" and items[0][1] == name:
            rec.append(("seq", items[1:]))
        else:
            base.append(a)
    if not rec:
        return body
    if not base:
        return ("alt", [])
    head = base[0] if len(base) == 1 else ("alt", base)
    tail = rec[0] if len(rec) == 1 else ("alt", rec)
    return ("seq", [head, ("rep", tail, 0, None)])


def lark_rules(text: str, json_compile) -> dict[str, object]:
    """Parse Lark `text`; `json_compile(schema, prefix)` turns each %json schema into rules."""
    g = _Grammar(text)
    g.parse()
    # %json nodes: compile their schemas to rules under their own name prefix.
    for node in _json_nodes(g):
        _, name, _, schema = node
        rules = json_compile(schema, name)
        g.json_rules.update(rules)
    return g.build()


def _json_nodes(g: _Grammar):
    stack = list(g.rules.values())
    while stack:
        n = stack.pop()
        if not isinstance(n, tuple):
            continue
        if n[0] == "json":
            yield n
        elif n[0] in ("seq", "alt"):
            stack.extend(n[1])
        elif n[0] == "rep":
            stack.append(n[1])


__all__ = ["lark_rules"]
