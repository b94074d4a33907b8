"""Reading calls written as JSON objects `{"name":"...","<key>":{...}}`, as the grammar writes them
(the name first, compact or spaced: `{"name": "...", "<key>": {...}}`): complete ones, and ones still
being written (for streamed arguments).

The arguments' text is kept as the model wrote it, so a client's `function.arguments` is the very
text its streamed deltas added up to.
"""

from __future__ import annotations

import json
import re

from agentkv.chat.calls import CallProgress, ToolCall, compact
from agentkv.grammar.lark.source import balanced_json_end
from agentkv.grammar.schema.style import SEPARATORS

_HEADS: dict[str, re.Pattern] = {}
_DECODER = json.JSONDecoder()


def _head(key: str) -> re.Pattern:
    if key not in _HEADS:
        _HEADS[key] = re.compile(r'\{"name": ?"([a-zA-Z0-9_-]{1,64})", ?"' + re.escape(key) + '": ?')
    return _HEADS[key]


def decode_call(text: str, i: int, key: str) -> tuple[ToolCall, int] | None:
    """The call whose object starts at `i`, and where it ends; None where it is cut short."""
    m = _head(key).match(text, i)
    if not m:
        return None
    try:  # decode rather than search for the end: an argument string may hold any markup
        args, end = _DECODER.raw_decode(text, m.end())
    except json.JSONDecodeError:
        return None
    if not text.startswith("}", end):
        return None
    return ToolCall(m.group(1), args, arguments_text=text[m.end():end], text=text[i:end + 1]), end + 1


def call_progress(text: str, i: int, key: str) -> tuple[CallProgress, int] | None:
    """The call whose object starts at `i` as far as it is written (None before its name is
    complete), and where it ends (or the text's end)."""
    m = _head(key).match(text, i)
    if not m:
        return None
    end = value_end(text, m.end())
    if end < 0:
        return CallProgress(m.group(1), text[m.end():], False), len(text)
    done = text.startswith("}", end)
    return CallProgress(m.group(1), text[m.end():end], done), end + 1 if done else len(text)


def value_end(text: str, i: int) -> int:
    """Where the JSON value starting at `i` ends, or -1 where the text ends first. Objects and
    arrays are scanned (strings and escapes skipped); a scalar is complete only when decoded and
    followed by more text."""
    if i >= len(text):
        return -1
    if text[i] not in "{[":
        try:
            _, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            return -1
        return end if end < len(text) else -1
    return balanced_json_end(text, i)


def call_object(call: ToolCall, key: str, style: str | None = None) -> str:
    """A call as the model wrote it, or as the grammar writes it in `style` (None or "model": the
    style its arguments were written in, else compact)."""
    if call.text is not None and _head(key).match(call.text):
        return call.text
    args = call.arguments_text
    if style in (None, "model"):
        style = written_style(args) if args is not None else "compact"
    comma, colon = SEPARATORS[style]
    if args is None:
        args = json.dumps(call.arguments, ensure_ascii=False, separators=(comma, colon))
    return f'{{"name"{colon}{compact(call.name)}{comma}"{key}"{colon}{args}}}'


def written_style(text: str) -> str:
    """The JSON style of a value's text: spaced where its first separator is followed by a space."""
    in_string = escaped = False
    for i, c in enumerate(text):
        if in_string:
            in_string, escaped = (not (c == '"' and not escaped)), (c == "\\" and not escaped)
        elif c == '"':
            in_string = True
        elif c in ",:":
            return "spaced" if text.startswith(" ", i + 1) else "compact"
    return "compact"
