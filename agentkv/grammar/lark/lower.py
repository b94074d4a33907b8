"""Lark grammars (the dialect llguidance and xgrammar share) -> grammar rules.

The `lark` package parses the text (its own grammar of grammars: definitions, templates, `%import`,
`%ignore`, `%declare`, priorities, aliases); this module lowers its trees to expressions. Texts in the
common subset every tool format writes are read by lark/quick.py instead, to the same trees. Lowercase
rules are context-free (rules, called through the stack); UPPERCASE terminals are regular (inlined as
expressions; a terminal that refers to itself is an error). Two extensions are lifted out of the text
before Lark sees it: inline `%json {...}` schemas (`%pyjson {...}`: values written with Python's True,
False and None, for pythonic tool calls), each a rule of its own, and `x{m}` / `x{m,}` / `x{m,n}`
repetitions, rewritten to Lark's `x ~ m..n`. Only `%import common...` is allowed (a grammar from a
request must not read files).

Matching is scannerless: terminals are not split by a longest-match lexer first, so where a lexer
would split text one way only (`NAME NAME` without separator), this accepts every way. Terminal
priorities, `?rule`, `!rule` and `-> alias` shape Lark's parse trees, not the language: they are
accepted and have no effect. Direct left recursion (`sum: sum "+" term | term`) is rewritten to
repetition; indirect left recursion is an error. Errors carry the line and column of the text as
given, with a caret under the offending place.
"""

from __future__ import annotations

import copy
import json

from lark import Token
from lark.exceptions import GrammarError as LarkGrammarError
from lark.exceptions import LarkError
from lark.grammar import NonTerminal, Terminal
from lark.load_grammar import GrammarBuilder

from agentkv.errors import GrammarError
from agentkv.grammar.automata.expr import Ref, Repeat, alt, chars, lit, opt, seq, star
from agentkv.grammar.automata.regex import match_expr
from agentkv.grammar.lark.quick import quick_definitions
from agentkv.grammar.lark.source import UNBOUNDED, Source

QUICK = True  # read the common subset without Lark (lark/quick.py); the tests turn it off to compare

# common.lark's terminals whose definition relies on a lexer's lazy, lookbehind matching (`/.*?/`,
# `(?<!\\)`): their language, as a regular expression
EXACT_COMMON = {"ESCAPED_STRING": r'"([^"\\]|\\.)*"', "C_COMMENT": r"/\*([^*]|\*+[^*/])*\*+/"}


class _ImportRefused(Exception):
    def __init__(self, path: str):
        self.path = path


class _Builder(GrammarBuilder):
    """Lark's grammar builder, importing from Lark's common.lark only (any other import opens a file,
    relative to the working directory where Lark finds no such grammar of its own), and each import of
    it read once per process (parsing common.lark took ~3.5 ms of every compile that imports from it,
    3x the rest of a small grammar's compile)."""

    def do_import(self, dotted_path, base_path, aliases, base_mangle=None):
        if tuple(dotted_path) != ("common",) or base_path is not None:
            raise _ImportRefused(".".join(dotted_path))
        key = (dotted_path, tuple(sorted(aliases.items())))
        if key not in _imported:
            gb = GrammarBuilder()
            gb.do_import(dotted_path, base_path, aliases, base_mangle)
            while len(_imported) >= 256:
                _imported.pop(next(iter(_imported)))
            _imported[key] = gb._definitions
        for name in _imported[key]:
            if name in self._definitions:
                raise LarkGrammarError(f"Cannot import '{name}': Symbol already defined.")
        self._definitions.update(copy.deepcopy(_imported[key]))  # Lark resolves terminals in place


_imported: dict[tuple, dict] = {}  # (path, aliases) -> the definitions an import adds


class _Grammar:
    def __init__(self, text: str, json_compile):
        self.src = Source(text)
        self.json_compile = json_compile
        self.rules: dict[str, object] = {}      # lowercase name -> tree of tuples
        self.terminals: dict[str, object] = {}  # UPPERCASE name -> tree of tuples, inlined where used
        self.templates: dict[str, tuple] = {}   # template name -> (params, Lark tree)
        self.instances: dict[tuple, str] = {}   # (template, its arguments) -> the rule made for them
        self.json_rules: dict[str, object] = {}  # rules of the %json schemas
        self.ignore_expr = None

    def error(self, pos: int, what: str) -> GrammarError:
        return self.src.error(pos, what)

    # -- Lark's trees -> tuples ------------------------------------------------------------------

    def load(self) -> None:
        quick = quick_definitions(self.src.text, self) if QUICK else None
        if quick is not None:  # (the common subset, read without Lark: lark/quick.py)
            self.rules, self.terminals = quick
            self.ignore = []
            return
        gb = _Builder()
        try:
            gb.load_grammar(self.src.text, "<grammar>")
            grammar = gb.build()
        except _ImportRefused as e:
            raise self.error(self.src.import_at(e.path), "only `%import common.NAME` (or `%import common (A, B)`) "
                                                         "is available: define the rule here instead") from None
        except (LarkError, AssertionError) as e:  # (Lark asserts on a few grammars it cannot load)
            raise self.src.lark_error(e) from None
        except (RecursionError, MemoryError):
            raise
        except Exception as e:  # (Lark's own error message fails on a few texts: a TypeError)
            raise GrammarError(f"Lark grammar: Lark could not read it ({type(e).__name__} in its error report); "
                               "check the syntax of its last edited definition") from None
        self.ignore = list(grammar.ignore)
        if any(name in self.src.json for name in self.ignore):  # (a %json block stands for a rule, not a terminal)
            raise GrammarError("Lark grammar: `%ignore` takes terminals, not a %json / %pyjson schema: define a "
                               "terminal for the text to ignore")
        for name, params, tree, _ in grammar.rule_defs:
            if params:
                self.templates[name] = (params, tree)
        for name, params, tree, _ in grammar.rule_defs:
            if tree is None:  # (`%declare` of a lowercase name: a rule nothing defines)
                raise self.error(self.src.definition(name), f"rule '{name}' is declared but never defined: "
                                                            "give it a definition")
            if not params:
                self.rules[name] = self.convert(tree, {})
        for name, (tree, _) in grammar.term_defs:
            if name in self.src.json:
                continue
            if tree is None:
                raise self.error(self.src.definition(name), f"terminal '{name}' is declared but never defined: "
                                                            "give it a definition")
            if self.src.common.get(name) in EXACT_COMMON:
                self.terminals[name] = ("lit", match_expr(EXACT_COMMON[self.src.common[name]], None))
            else:
                self.terminals[name] = self.convert(tree, {})

    def convert(self, t, env: dict):
        """A Lark tree -> ("alt" | "seq", [...]), ("rep", x, lo, hi), ("lit", expr), ("name", name),
        ("json", rule name). `env`: a template's parameters, bound to the converted arguments."""
        if isinstance(t, (NonTerminal, Terminal)):
            if t.name in env:
                return env[t.name]
            if t.name in self.src.json:
                return ("json", t.name)
            return ("name", t.name)
        kind = t.data
        kids = t.children
        if kind == "expansions":
            return ("alt", [self.convert(k, env) for k in kids]) if len(kids) > 1 else self.convert(kids[0], env)
        if kind == "expansion":
            return ("seq", [self.convert(k, env) for k in kids])
        if kind in ("alias", "value"):
            return self.convert(kids[0], env)
        if kind == "maybe":
            return ("rep", self.convert(kids[0], env), 0, 1)
        if kind == "expr":
            return self.repeat(self.convert(kids[0], env), kids[1:])
        if kind == "literal":
            return self.literal(kids[0])
        if kind == "range":
            return self.range_of(*kids)
        if kind == "template_usage":
            return self.instance(kids[0].name, [self.convert(k, env) for k in kids[1:]])
        raise GrammarError(f"Lark grammar: {kind!r} in Lark's parse of it is not supported")  # a newer Lark

    def range_of(self, lo: Token, hi: Token):
        a, b = self.string(lo), self.string(hi)
        if len(a) != 1 or len(b) != 1 or a > b:
            raise self.error(self.src.at(lo), 'a range needs two single characters in order: "a".."z"')
        return ("lit", chars((a, b)))

    def repeat(self, atom, ops: list[Token]):
        op = ops[0]
        if op.type == "OP":
            return ("rep", atom, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[str(op)])
        lo = int(ops[1])
        hi = int(ops[2]) if len(ops) > 2 else lo
        if hi < lo:
            raise self.error(self.src.at(ops[1]), "repetition bounds out of order")
        return ("rep", atom, lo, None if hi >= UNBOUNDED else hi)

    def instance(self, name: str, args: list):
        """A template used with arguments: one rule per distinct use, as Lark makes (numbered: a name
        spelling out its arguments would grow with each nesting of templates in templates)."""
        params, tree = self.templates[name]  # (Lark checked the name and the number of arguments)
        use = (name, _frozen(args))
        key = self.instances.get(use)
        if key is None:
            key = self.instances[use] = f"{name}#{len(self.instances)}"
            self.rules[key] = ("alt", [])  # a recursive use of the same instance calls it
            self.rules[key] = self.convert(tree, dict(zip(params, args)))
        return ("name", key)

    def literal(self, tok: Token):
        if tok.type == "STRING":
            text = self.string(tok)
            if tok.endswith("i"):
                return ("lit", seq(*[chars(c.lower(), c.upper()) if c.isalpha() else lit(c) for c in text]))
            return ("lit", lit(text))
        body, flags = tok[1:].rsplit("/", 1)
        if set(flags) - {"i", "s"} or "i" in flags:
            raise self.error(self.src.at(tok), f"regex flags {flags!r}: only s is supported (spell out [aA] "
                                               "classes for i)")
        pattern = body.replace("\\/", "/")
        if "s" in flags:
            pattern = pattern.replace(".", r"[\s\S]") if "\\." not in pattern else pattern
        try:
            return ("lit", match_expr(pattern, None))
        except GrammarError as e:
            raise self.error(self.src.at(tok), str(e)) from None

    def string(self, tok: Token) -> str:
        body = tok[:-1] if tok.endswith("i") else str(tok)
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            try:
                return body[1:-1].encode().decode("unicode_escape")
            except UnicodeDecodeError:
                raise self.error(self.src.at(tok), "malformed string literal") from None

    # -- lowering ---------------------------------------------------------------------------------

    def terminal(self, name: str) -> object:
        # (Lark checked that every terminal is defined, regular, and uses terminals only)
        return self.lower(self.terminals[name], in_terminal=True)

    def lower(self, node, in_terminal: bool = False):
        """Tuples -> expression. Inside a terminal, names are inlined; in rules they are calls."""
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "name":
            name = node[1]
            if name.lstrip("_")[:1].isupper():
                return self.terminal(name)
            return Ref(f"r:{name}")
        if kind == "json":
            return Ref(node[1])
        if kind == "seq":
            parts = [self.lower(x, in_terminal) for x in node[1]]
            if not in_terminal and self.ignore_expr is not None and len(parts) > 1:
                with_ws = [parts[0]]
                for p in parts[1:]:
                    with_ws += [self.ignore_expr, p]
                parts = with_ws
            return seq(*parts)
        if kind == "alt":
            return alt(*[self.lower(x, in_terminal) for x in node[1]])
        if kind == "rep":
            inner = self.lower(node[1], in_terminal)
            lo, hi = node[2], node[3]
            if not in_terminal and self.ignore_expr is not None and (hi is None or hi > 1):
                # separators between repetitions of rules may be ignored text too
                rest = Repeat(seq(self.ignore_expr, inner), max(lo - 1, 0), None if hi is None else hi - 1)
                body = seq(inner, rest)
                return body if lo >= 1 else opt(body)
            return Repeat(inner, lo, hi)
        raise AssertionError(kind)

    def build(self) -> dict[str, object]:
        if "start" not in self.rules:
            raise GrammarError("Lark grammar has no `start` rule: add one (`start: ...`)")
        for name, (schema, python, style) in self.src.json.items():
            self.json_rules.update(self.json_compile(schema, name, python, style))
        self.ignore_expr = None
        if self.ignore:
            self.ignore_expr = star(alt(*[self.terminal(n) for n in self.ignore]))
        out: dict[str, object] = {}
        for name, body in self.rules.items():
            out[f"r:{name}"] = self.lower(_remove_left_recursion(name, body))
        if self.ignore_expr is not None:
            out["r:start"] = seq(self.ignore_expr, out["r:start"], self.ignore_expr)
        out.update(self.json_rules)
        return out


def _frozen(node):
    """A tree of tuples, hashable (its lists as tuples)."""
    return tuple(map(_frozen, node)) if isinstance(node, (list, tuple)) else node


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
    """Parse Lark `text`; `json_compile(schema, rule name, python, style)` turns each %json schema into
    rules (`python`: a %pyjson schema, whose values are written with Python's True, False and None;
    `style`: the block's JSON style, None where it names none)."""
    g = _Grammar(text, json_compile)
    g.load()
    return g.build()


__all__ = ["lark_rules"]
