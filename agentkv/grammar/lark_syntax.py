"""The syntax of a Lark definition's right-hand side: tokens and a recursive-descent parser.

The parser turns one definition's tokens into a small tree of tuples (alternatives, sequences,
repetitions, literals, regexes, rule and terminal names, inline `%json` schemas) that lark.py lowers
to grammar expressions. Errors go through the grammar's `error(pos, what)`, which adds the line,
column and a caret.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from agentkv.errors import GrammarError
from agentkv.grammar.expr import chars, lit, seq
from agentkv.grammar.regex import match_expr

TOKEN = re.compile(r"""
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
class Tok:
    kind: str
    text: str
    pos: int


class ExpansionParser:
    """Recursive descent over one definition's tokens: expansions -> alternatives of sequences."""

    def __init__(self, g, toks: list[Tok]):
        self.g, self.toks, self.i = g, toks, 0

    def peek(self) -> Tok | None:
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

    def expect(self, kind: str) -> Tok:
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
            text = unquote(t.text, self.g, t.pos)
            nxt = self.peek()
            if nxt is not None and nxt.kind == "range":  # "a".."z"
                self.i += 1
                hi_tok = self.expect("string")
                hi = unquote(hi_tok.text, self.g, hi_tok.pos)
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
        if t.kind in ("json", "pyjson"):
            try:
                schema = json.loads(t.text)
            except json.JSONDecodeError as e:
                raise self.g.error(t.pos, f"%{t.kind} schema is not valid JSON: {e}") from None
            self.g.json_count += 1
            return ("json", f"json{self.g.json_count}", t.pos, schema, t.kind == "pyjson")
        raise self.g.error(t.pos, f"unexpected {t.text!r}")

    def close(self, what: str, opener: Tok) -> None:
        t = self.peek()
        if t is None or t.text != what:
            raise self.g.error(opener.pos, f"'{opener.text}' is never closed with '{what}'")
        self.i += 1


def unquote(text: str, g, pos: int) -> str:
    body = text[:-1] if text.endswith("i") else text
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        try:
            return body[1:-1].encode().decode("unicode_escape")
        except UnicodeDecodeError:
            raise g.error(pos, "malformed string literal") from None


def balanced_json_end(text: str, start: int) -> int:
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


