"""A Lark grammar's text as Lark is given it, and the way back to the text as the user wrote it.

Two things of the dialect are not Lark's own and are rewritten before Lark parses the text: an inline
`%json {...}` (or `%pyjson {...}`; `%json:spaced {...}` names the block's JSON style, schema/style.py)
schema becomes a declared terminal that lark/lower.py turns into the
schema's rules, and a repetition `x{m}` / `x{m,}` / `x{m,n}` becomes Lark's `x ~ m..n`. Strings,
regexes and comments are skipped over, so their text is never rewritten. Every position Lark (or
lark/lower.py) reports is in the rewritten text; `error` places it in the original, with the line, the
column and a caret.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re

from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken

from agentkv.errors import GrammarError
from agentkv.grammar.schema.style import JSON_STYLES

MARKS = re.compile(r'//|["/%{]')  # where a comment, string, regex, schema or repetition may start
SCHEMA = re.compile(r"%(py)?json\b")
STYLE = re.compile(r":([a-z]+)")  # `%json:spaced`: the block's JSON style
REPEAT = re.compile(r"\{[ \t]*([0-9]+)[ \t]*(?:(,)[ \t]*([0-9]*)[ \t]*)?\}")
IMPORT = re.compile(r"^[ \t]*%import[ \t]*([\w.]*)(.*)$", re.M)
_JSON = json.JSONDecoder()
UNBOUNDED = 2 ** 62  # the upper bound written for `x{m,}`; lark/lower.py reads it back as none


class Source:
    def __init__(self, original: str):
        self.original = original
        # terminal name -> (schema, written with Python's literals, its JSON style or None: the compiler's)
        self.json: dict[str, tuple[object, bool, str | None]] = {}
        self._edits: list[tuple[int, int, int, int]] = []  # (start, length) rewritten, (start, end) original
        self._names: dict[tuple[str, bool, str | None], str] = {}  # (schema text, python, style) -> its terminal
        self._prefix = "AK_JSON_"  # the schemas' terminals: AK_JSON_1, ..., names the grammar does not use
        while self._prefix in original:
            self._prefix += "X"
        self.text = self._rewrite()
        self.common = self._imports()  # name in this grammar -> the common.lark terminal it imports

    # -- rewriting --------------------------------------------------------------------------------

    def _rewrite(self) -> str:
        t, out, i, copied, length = self.original, [], 0, 0, 0
        while (found := MARKS.search(t, i)) is not None:
            i, c = found.start(), found.group()
            if c == "//":
                i = _line_end(t, i)
                continue
            if c in "\"/":
                i = _quoted_end(t, i)
                continue
            if c == "%" and SCHEMA.match(t, i):
                end, replacement = self._schema(t, i)
            elif c == "{" and (m := REPEAT.match(t, i)):
                hi = m.group(3) or (str(UNBOUNDED) if m.group(2) else m.group(1))
                end, replacement = m.end(), f" ~ {m.group(1)}..{hi}"
            else:
                i += 1
                continue
            out += [t[copied:i], replacement]
            length += i - copied
            self._edits.append((length, len(replacement), i, end))
            length += len(replacement)
            i = copied = end
        out.append(t[copied:])
        declared = "".join(f"\n%declare {name}" for name in self.json)
        return "".join(out) + declared

    def _schema(self, t: str, i: int) -> tuple[int, str]:
        python = t.startswith("%pyjson", i)
        kind = "%pyjson" if python else "%json"
        j = i + len(kind)
        style = None
        if (m := STYLE.match(t, j)) is not None:
            style, j = m.group(1), m.end()
            if style not in JSON_STYLES:
                raise self.error_original(i, f"{kind}:{style} names no JSON style; write one of "
                                             f"{', '.join(f'{kind}:{s}' for s in JSON_STYLES)}")
        while j < len(t) and t[j] in " \t":
            j += 1
        if _in_terminal(t, i):
            raise self.error_original(i, f"{kind} cannot appear inside a terminal: use it in a lowercase rule")
        if j >= len(t) or t[j] != "{":
            raise self.error_original(i, f"{kind} needs a JSON schema object after it")
        try:  # (parsed and measured in one C call; the scans below only word an error)
            schema, end = _JSON.raw_decode(t, j)
        except json.JSONDecodeError:
            end = balanced_json_end(t, j)
            if end < 0:
                raise self.error_original(j, f"the {kind} schema is not closed") from None
            try:
                json.loads(t[j:end])
            except json.JSONDecodeError as e:
                raise self.error_original(j, f"{kind} schema is not valid JSON: {e}") from None
            raise
        key = (t[j:end], python, style)
        if key not in self._names:  # a schema written twice (tool formats do) is one set of rules
            self._names[key] = f"{self._prefix}{len(self.json) + 1}"
            self.json[self._names[key]] = (schema, python, style)
        return end, self._names[key]

    def _imports(self) -> dict[str, str]:
        """The terminals imported from common.lark, by the names this grammar gives them (a name
        common.lark lacks is an error here: Lark would import it as nothing)."""
        names: dict[str, str] = {}
        for m in IMPORT.finditer(self.text):
            path, rest = m.group(1), m.group(2)
            if not re.fullmatch(r"common(\.\w+)?", path):
                continue  # (any other import is refused where Lark makes it: lark/lower.py's _Builder)
            if "." in path:
                alias = re.search(r"->\s*(\w+)", rest)
                found = {alias.group(1) if alias else path.split(".")[-1]: path.split(".")[-1]}
            else:
                found = {n: n for n in re.findall(r"\w+", rest)}
            for name in found.values():
                if name not in _common_names():  # (Lark would import it as nothing)
                    at = m.start() + re.search(rf"\b{name}\b", m.group(0)).start()
                    raise self.error(at, f"Lark's common grammar has no {name}")
            names.update(found)
        return names

    # -- positions --------------------------------------------------------------------------------

    def import_at(self, path: str) -> int:
        """Where the %import of `path` (dotted) is, or the first %import."""
        first = path.split(".")[0]
        m = re.search(rf"%import[ \t]*\.?{re.escape(first)}", self.text) or re.search("%import", self.text)
        return m.start() if m else 0

    def original_pos(self, pos: int) -> int:
        """The original position of `pos` in the rewritten text (a rewritten piece: where it began)."""
        shift = 0
        for start, length, o_start, o_end in self._edits:
            if pos < start:
                break
            if pos < start + length:
                return o_start
            shift = o_end - (start + length)
        return min(pos + shift, len(self.original))

    def offset(self, line: int, column: int) -> int:
        """Lark's line and column (from 1) -> a position in the rewritten text."""
        start = 0
        for _ in range(line - 1):
            start = self.text.find("\n", start) + 1
        return start + column - 1

    @staticmethod
    def at(token) -> int:
        return token.start_pos or 0

    def definition(self, name: str, last: bool = False) -> int:
        """Where `name` is defined (the last definition with `last`), or 0 when not found."""
        found = list(re.finditer(rf"^[ \t]*[?!]?{re.escape(name)}\b", self.text, re.M))
        return (found[-1] if last else found[0]).start() if found else 0

    def use(self, name: str, owner: str) -> int:
        """Where the definition of `owner` uses `name`, or the definition itself."""
        start = self.definition(owner)
        colon = self.text.find(":", start)
        m = re.compile(rf"(?<![\w\"]){re.escape(name)}\b").search(self.text, colon + 1 if colon >= 0 else start)
        return m.start() if m else start

    def lark_error(self, e: Exception) -> GrammarError:
        """Lark's error, placed in the text as given and said as what to change."""
        msg = str(e)
        if isinstance(e, UnexpectedInput) and getattr(e, "line", -1) > 0:
            pos = self.offset(e.line, e.column)
        elif m := re.search(r"at line (\d+),? column (\d+)", msg):
            pos = self.offset(int(m.group(1)), int(m.group(2)))
        else:
            for pattern, place in _PLACED:
                if m := re.search(pattern, msg):
                    return self.error(*place(self, *m.groups()))
            return GrammarError(f"Lark grammar: {msg.strip()}")
        if isinstance(e, (UnexpectedToken, UnexpectedEOF)):
            closers = [c for c in ("_RPAR", "_RBRA") if c in getattr(e, "expected", ())]
            if closers and (isinstance(e, UnexpectedEOF) or e.token.type in ("_NL", "$END")):
                opener, closer = ("(", ")") if closers[0] == "_RPAR" else ("[", "]")
                return self.error(pos, f"a '{opener}' is never closed: add '{closer}'")
            return self.error(pos, f"unexpected {'end' if isinstance(e, UnexpectedEOF) else repr(str(e.token))}")
        o = self.original_pos(pos)
        c = self.original[o : o + 1]
        if c and c in "/\"" and self.original[_quoted_end(self.original, o) - 1 :][:1] != c:
            return self.error(pos, f"this {'regex' if c == '/' else 'string'} is not closed: end it with {c} "
                                   "on the same line")
        what = re.split(r",? at line", msg)[0].strip()
        return self.error(pos, f"unexpected {c!r}" if what == "Unexpected input" and c else what)

    def error(self, pos: int, what: str) -> GrammarError:
        return self.error_original(self.original_pos(pos), what)

    def error_original(self, pos: int, what: str) -> GrammarError:
        text = self.original
        line = text.count("\n", 0, pos) + 1
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        src = text[start:end if end >= 0 else len(text)]
        return GrammarError(f"Lark grammar, line {line}, column {pos - start + 1}: {what}\n  {src}\n  "
                            f"{' ' * (pos - start)}^")


@functools.cache
def _common_names() -> frozenset[str]:
    text = (importlib.resources.files("lark") / "grammars" / "common.lark").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^(\w+)\s*:", text, re.M))


def _kind(name: str) -> str:
    return "terminal" if name.lstrip("_")[:1].isupper() else "rule"


# Lark's messages that name what is wrong but not where: (pattern, its groups -> (position, message))
_PLACED = [
    (r"Template '([^']+)' used but not defined \(in \w+ (\w+)\)",
     lambda s, name, owner: (s.use(name, owner), f"template '{name}' is not defined: define it")),
    (r"'([^']+)' used but not defined \(in \w+ (\w+)\)",
     lambda s, name, owner: (s.use(name, owner), f"{_kind(name)} '{name}' is not defined: define it"
                             + (f" or `%import common.{name}`" if _kind(name) == "terminal" else ""))),
    (r"Recursion in terminal '(\w+)'",
     lambda s, name: (s.use(name, name), f"terminal '{name}' refers to itself; terminals must be regular "
                                         "(make it a lowercase rule)")),
    (r"NonTerminal\('(\w+)'\) in (\w+)",
     lambda s, rule, term: (s.use(rule, term), f"terminal {term} uses the rule '{rule}'; terminals may use "
                                               f"only terminals (make {term} a lowercase rule)")),
    (r"'(\w+)' defined more than once",
     lambda s, name: (s.definition(name, last=True), f"'{name}' is defined twice")),
    (r"Terminals \{'(\w+)'.*marked to ignore",
     lambda s, name: (s.text.find("%ignore"), f"%ignore {name}: terminal '{name}' is not defined")),
]


def _in_terminal(t: str, i: int) -> bool:
    """Whether position i is inside an UPPERCASE definition (its head is the last line before i that
    does not go on with `|`)."""
    line = t.rfind("\n", 0, i) + 1
    while line > 0 and t[line:i].lstrip().startswith("|"):
        i = line - 1
        line = t.rfind("\n", 0, i) + 1
    return re.match(r"[ \t]*_?[A-Z][A-Z0-9_]*(\.-?[0-9]+)?[ \t]*:", t[line:]) is not None


def _line_end(t: str, i: int) -> int:
    end = t.find("\n", i)
    return len(t) if end < 0 else end


# (an escape skips the next character; a regex may hold raw newlines, as Lark's lexer reads it, and
# tool formats write them: Qwen's XML value text is a regex over the lines before its end tag)
_QUOTED_BODY = {'"': re.compile(r'(?:[^"\\\n]|\\[\s\S])*'), "/": re.compile(r"(?:[^/\\]|\\[\s\S])*")}


def _quoted_end(t: str, i: int) -> int:
    """The end of the string or regex opened at i: after its closing mark, or where it is left open
    (a string at its line's end, a regex at the text's: Lark reports it)."""
    quote = t[i]
    end = _QUOTED_BODY[quote].match(t, i + 1).end()
    if end < len(t) and t[end] == quote:
        return end + 1
    return end + 2 if end < len(t) and t[end] == "\\" else end  # (a backslash that ends the text)


def balanced_json_end(text: str, start: int) -> int:
    """The end of the JSON value that opens at `start` with { or [, or -1 if it is never closed."""
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
