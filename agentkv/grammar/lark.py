"""Lark grammars (the dialect llguidance and xgrammar share) -> grammar rules.

Lowercase rules are context-free (they become rules, called through the stack); UPPERCASE terminals
are regular (inlined as expressions; a terminal that refers to itself is an error). Supported:
literals ("..." and "..."i), regex terminals (/.../ with flags i and s), "a".."z" ranges, `|`,
`?`, `*`, `+`, `[...]`, `(...)`, `x{m}`/`x{m,n}`, `x ~ m`/`x ~ m..n`, `%ignore`, `%import common.X`
(or `(X, Y)`), inline `%json {...}` schemas as a rule (`%pyjson {...}`: values with Python's True, False
and None, for pythonic tool calls), `?rule` / `!rule` / `rule.2` prefixes and
`-> alias` (accepted, no effect on the language). The start rule is `start`.

Matching is scannerless: terminals are not split by a longest-match lexer first, so where a lexer
would split text one way only (`NAME NAME` without separator), this accepts every way. Direct left
recursion (`sum: sum "+" term | term`) is rewritten to repetition; indirect left recursion is an error.
Errors carry the line and column, with a caret under the offending text.
"""

from __future__ import annotations

from agentkv.errors import GrammarError
from agentkv.grammar.expr import (
    Ref,
    Repeat,
    alt,
    opt,
    seq,
    star,
)
from agentkv.grammar.lark_syntax import TOKEN, ExpansionParser, Tok, balanced_json_end
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

    def tokens(self) -> list[Tok]:
        out, i, text = [], 0, self.text
        while i < len(text):
            if text.startswith(("%json", "%pyjson"), i):
                kind = "pyjson" if text.startswith("%pyjson", i) else "json"
                j = text.find("{", i)
                if j < 0:
                    raise self.error(i, f"%{kind} needs a JSON schema object after it")
                end = balanced_json_end(text, j)
                if end < 0:
                    raise self.error(j, f"the %{kind} schema is not closed")
                out.append(Tok(kind, text[j:end], i))
                i = end
                continue
            m = TOKEN.match(text, i)
            if not m:
                if text[i] in "/\"":  # the literal runs to the end of the line without its closing mark
                    raise self.error(i, f"this {'regex' if text[i] == '/' else 'string'} is not closed: "
                                        f"end it with {text[i]} on the same line")
                raise self.error(i, f"unexpected character {text[i]!r}")
            kind = m.lastgroup
            if kind != "ws":
                out.append(Tok(kind, m.group(), i))
            i = m.end()
        out.append(Tok("nl", "\n", len(text)))
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
                body = ExpansionParser(self, st[2:]).expansions_all()
                target = self.terminals if name.isupper() or name.lstrip("_").isupper() else self.rules
                if name in target:
                    raise self.error(head.pos, f"'{name}' is defined twice")
                target[name] = body
            else:
                raise self.error(head.pos, "expected a definition `name: ...` or a %directive")

    def directive(self, st: list[Tok]) -> None:
        d = st[0]
        if d.text == "%ignore":
            body = ExpansionParser(self, st[1:]).expansions_all()
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
    """Parse Lark `text`; `json_compile(schema, prefix, python)` turns each %json schema into rules
    (`python`: a %pyjson schema, whose values are written with Python's True, False and None)."""
    g = _Grammar(text)
    g.parse()
    # %json nodes: compile their schemas to rules under their own name prefix.
    for node in _json_nodes(g):
        _, name, _, schema, python = node
        rules = json_compile(schema, name, python)
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
