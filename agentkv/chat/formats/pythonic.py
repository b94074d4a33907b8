"""The pythonic format (Llama 3.2's and Llama 4's tool prompts, Gemma 3's, ToolACE and others): a reply that
calls tools is a Python list of calls, `[get_weather(city="Paris", unit="C"), add(a=1)]` (the whole
reply: free text may not write `[get_weather(` or another offered tool's head), each
argument a keyword whose value is a Python literal (True, False, None where JSON has true, false,
null). The grammar writes each argument under its own property schema (`%pyjson`), required ones
in the schema's order and optional ones where they stand, so a call always evaluates and validates.
A reply's calls go back as the text the model wrote, but to a template that writes them itself and
must (vLLM's Gemma 3 template checks that the turns without `tool_calls` alternate), as `tool_calls`.
"""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize
import unicodedata
from dataclasses import dataclass, replace
from typing import ClassVar

from agentkv.chat.calls import CallProgress, ToolCall
from agentkv.chat.formats.base import ToolFormat, arguments_schema, lark_literal, lark_schema
from agentkv.errors import RequestError
from agentkv.grammar.schema.objects import python_dumps

SEPARATOR = ", "
_PARTIAL = re.compile(r"(?:\[|, )([^\W\d]\w*)\(")
_KEYWORD = "__agentkv_keyword_"  # a keyword written as a name (`from=`, `class(`), while Python reads the calls


def _is_identifier(name: str) -> bool:
    """A name a call can write and Python reads back as itself: an identifier (Unicode letters
    included, `año`), in the NFKC form Python's parser gives it. Keywords (`from`, `class`) are
    names here: the calls are read with them renamed (_calls)."""
    return name.isidentifier() and unicodedata.normalize("NFKC", name) == name


@dataclass(frozen=True)
class Pythonic(ToolFormat):
    structured: bool = False  # calls go back as `tool_calls` (the template's rendering of them), not as text

    name: ClassVar[str] = "pythonic"
    opening: ClassVar[str] = "["
    instruction: ClassVar[str] = (
        "If you decide to invoke any of the function(s), you MUST put it in the format of "
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)] "
        "and write nothing else in that reply.")

    @classmethod
    def knows(cls, chat_template: str) -> bool:
        # or Gemma 3's own template, which takes no tools: Google's function-calling guide prompts
        # the model for these calls
        return "func_name1(" in chat_template or ("<start_of_turn>" in chat_template
                                                   and "first_user_prefix" in chat_template)

    @classmethod
    def for_template(cls, chat_template: str | None, special_tokens=()) -> ToolFormat:
        fmt = super().for_template(chat_template, special_tokens)
        # a template that counts the turns without tool_calls (its roles must alternate) needs them
        counts = bool(chat_template) and 'selectattr("tool_calls", "undefined")' in chat_template
        return replace(fmt, structured=fmt.native and counts)

    def assistant_message(self, content: str, calls: list[ToolCall], text: str | None = None) -> dict:
        if not self.structured:
            return super().assistant_message(content, calls, text)
        # the template writes each value `| tojson`: numbers and strings as the grammar wrote them
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in calls]}

    def text_words(self, tools) -> tuple[str, ...]:
        # a call is the whole reply: text may not write one of an offered tool (it would be content)
        return self.forbidden + tuple(f"[{t.name}(" for t in tools if _is_identifier(t.name))

    def calls_rules(self, parallel) -> str:
        more = f' ({lark_literal(SEPARATOR)} call)*' if parallel else ""
        return f'calls: "[" call{more} "]"\n'

    def call_part(self, tool, close_objects) -> str:
        if not _is_identifier(tool.name):
            raise RequestError(f"the tool name {tool.name!r} is not a Python identifier, which the pythonic tool "
                               "format needs; rename the tool, or choose another tool_format")
        rules: list[str] = []
        kwargs = _kwargs(rules, "a", arguments_schema(tool, close_objects))
        return f"start: {lark_literal(tool.name + '(')} {kwargs} {lark_literal(')')}\n" + "\n".join(rules) + "\n"

    def parse_calls(self, text: str, start: int) -> tuple[list[ToolCall], int]:
        # the longest run of complete calls: the whole list, or the part before a call cut short
        ends = [text.rfind("]")] + [i for i in range(len(text) - 1, start, -1) if text[i] == ")"]
        for end in ends:
            if end <= start:
                continue
            source = text[start:end + 1] + ("" if text[end] == "]" else "]")
            calls = _calls(source)
            if calls is not None:
                return calls, end + 1
        return [], 0

    def calls_progress(self, text: str, start: int) -> list[CallProgress]:
        calls, end = self.parse_calls(text, start)
        out = [CallProgress(c.name, c.arguments_json, True) for c in calls]
        m = _PARTIAL.match(text, end if calls else start)  # a call begun after them
        if m:
            out.append(CallProgress(m.group(1), "", False))
        return out

    def calls_text(self, calls: list[ToolCall]) -> str:
        return "[" + SEPARATOR.join(f"{c.name}({_kwargs_text(c.arguments)})" for c in calls) + "]"


def _kwargs(rules: list[str], rule: str, schema: dict) -> str:
    """The expression of a call's keyword arguments (adding its rules to `rules`): each property
    `name=value` once, required ones always, in the schema's order, separated by ", "."""
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    shared = {k: schema[k] for k in ("$defs", "definitions") if k in schema}  # what $refs in a property point at
    items = []
    for name, sub in props.items():
        if not _is_identifier(name):
            raise RequestError(f"the argument name {name!r} is not a Python identifier, which the pythonic tool "
                               "format needs; rename it, or choose another tool_format")
        sub = {**(sub if isinstance(sub, dict) else {} if sub is True else {"not": {}}), **shared}
        items.append((f"{lark_literal(name + '=')} {lark_schema('%pyjson', sub)}", name in required))
    if not items:
        return ""
    n = len(items)
    needed = [any(r for _, r in items[i:]) for i in range(n + 1)]  # a required argument from i on
    for i in range(n - 1, -1, -1):
        item, req = items[i]
        for started in (0, 1):
            head = (lark_literal(SEPARATOR) + " " if started else "") + item
            tail = "" if i + 1 == n else f" {rule}_{i + 1}_1" if needed[i + 1] else f" ({rule}_{i + 1}_1)?"
            alts = [head + tail]
            if not req and i + 1 < n:
                alts.append(f"{rule}_{i + 1}_{started}")
            rules.append(f"{rule}_{i}_{started}: " + " | ".join(f"({a})" for a in alts))
    return f"{rule}_0_0" if needed[0] else f"({rule}_0_0)?"


def _calls(source: str) -> list[ToolCall] | None:
    try:
        tree = ast.parse(_keywords_renamed(source), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            args = {kw.arg.removeprefix(_KEYWORD): ast.literal_eval(kw.value) for kw in node.keywords}
        except ValueError:
            return None
        calls.append(ToolCall(node.func.id.removeprefix(_KEYWORD), args))
    return calls


def _keywords_renamed(source: str) -> str:
    """`source` with each keyword that stands as a call's or an argument's name (`convert(from="USD")`,
    a tool named `import`) renamed to a name Python reads, strings left alone (its own tokenizer)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source
    named = False
    for i, tok in enumerate(tokens[:-1]):
        if tok.type == tokenize.NAME and keyword.iskeyword(tok.string) and tokens[i + 1].string in ("=", "("):
            tokens[i] = tok._replace(string=_KEYWORD + tok.string)
            named = True
    return tokenize.untokenize(tokens) if named else source


def _kwargs_text(arguments: dict) -> str:
    return SEPARATOR.join(f"{k}={python_dumps(v)}" for k, v in arguments.items())
