"""Tool calls: the nouns every format shares (a call, a tool as the format sees it, a call still
being written), the rule for tool names, and the regexes of free text that may not write a format's
markup. The formats themselves (how each model family offers tools and writes its calls) are in
agentkv/chat/formats/.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names: no markup in a call


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""  # set by a format whose calls carry one (Kimi K2's), else by who returns the call
    # the arguments as the model wrote them (JSON), where it wrote JSON; not part of a call's identity
    arguments_text: str | None = field(default=None, compare=False, repr=False)
    # the whole call as the model wrote it, where a format reads it as one JSON object (its spacing
    # written back as it was: the next prompt re-reads it from the cache)
    text: str | None = field(default=None, compare=False, repr=False)

    @property
    def arguments_json(self) -> str:
        """The arguments as a JSON string (OpenAI's `function.arguments`): the model's own text
        where it wrote JSON, so streamed argument deltas add up to it."""
        return self.arguments_text if self.arguments_text is not None else compact(self.arguments)


@dataclass(frozen=True)
class CallProgress:
    """A call as far as a reply has written it: its name, its arguments' text so far, whether done."""

    name: str
    arguments_text: str
    done: bool
    id: str = ""  # the id the call wrote, in a format whose calls carry one (Kimi K2's)


@dataclass(frozen=True)
class FunctionSpec:
    """A tool as the format needs it: what `ak.tool` objects and OpenAI tool definitions both give."""

    name: str
    parameters: dict

    @property
    def definition(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "parameters": self.parameters}}


# A format whose arguments are not JSON text reads the call at an index as (its name, its arguments
# complete so far, whether the call is complete, where it ends), or None before its name is complete.
CallReader = Callable[[str, int], "tuple[str, dict, bool, int] | None"]


def read_calls(read: CallReader, text: str, start: int, between: str = "") -> tuple[list[ToolCall], int]:
    """The complete calls from `start` (each `between` the last), and where the last of them ends."""
    calls, end, i = [], 0, start
    while (got := read(text, i)) is not None and got[2]:
        calls.append(ToolCall(got[0], got[1]))
        end = got[3]
        i = end + len(between)
    return calls, end


def read_progress(read: CallReader, text: str, start: int, between: str = "") -> list[CallProgress]:
    """The calls from `start` as far as they are written: each one's arguments complete so far as
    compact JSON (closed once the call is), so streamed deltas add up to `ToolCall.arguments_json`."""
    out, i = [], start
    while (got := read(text, i)) is not None:
        name, args, done, end = got
        body = ",".join(f"{compact(k)}:{compact(v)}" for k, v in args.items())
        out.append(CallProgress(name, "{" + body + ("}" if done else ""), done))
        if not done:
            break
        i = end + len(between)
    return out


def compact(value) -> str:
    """JSON as the grammar writes it: no spaces, characters as they are."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tool_name_problem(name: Any) -> str | None:
    """What is wrong with a tool's name, or None."""
    if isinstance(name, str) and TOOL_NAME.fullmatch(name):
        return None
    return f"the tool name {name!r} must be 1 to 64 letters, digits, underscores or dashes"


def without_partial(text: str, word: str) -> str:
    """`text` less a start of `word` it ends with (text still being written may be beginning it)."""
    for k in range(min(len(word) - 1, len(text)), 0, -1):
        if text.endswith(word[:k]):
            return text[:-k]
    return text


def free_text(words, first: str = "") -> str:
    """A regex for text in tool mode: none of `words` in it, and its first character after any
    whitespace starts no word, no tag (`<`) and is not `first` (a format's calls start with it);
    or nothing at all."""
    words = [words] if isinstance(words, str) else list(words)
    firsts = "".join(_cls(c) for c in sorted({"<"} | set(first) | {w[0] for w in words}))
    return f"(?:\\s*[^\\s{firsts}]{text_without(words)})?"


def text_without(words) -> str:
    """A regex (no lookaround) for the strings in which none of `words` occurs.

    No word may contain a word's first character except at its start (true of `<tool_call>` and
    `<|im_start|>` alike), which keeps the automaton a trie: a string is then free characters, and
    partial matches (a proper prefix of a word), each ended either by a first character (which starts
    the next one) or by a character that continues no word (`leave`); it may end inside one.
    """
    return _text_without((words,) if isinstance(words, str) else tuple(dict.fromkeys(words)))


@functools.lru_cache(maxsize=256)  # (each tool's part of a tag format writes one: 0.1 ms each)
def _text_without(words: tuple[str, ...]) -> str:
    words = [w for w in words if not any(v != w and v in w for v in words)]  # one inside another: the shorter
    firsts = {w[0] for w in words}
    if any(len(w) < 2 or any(c in firsts for c in w[1:]) for w in words):
        raise ValueError(f"text_without needs words of 2+ characters that hold no first character again: {words!r}")
    prefixes = sorted({w[:k] for w in words for k in range(1, len(w))})
    follow = {p: {w[len(p)] for w in words if w.startswith(p) and len(w) > len(p)} for p in prefixes}
    free = "".join(_cls(c) for c in sorted(firsts))
    partial = "|".join(_re(p) for p in prefixes)
    leave = "|".join(f"{_re(p)}[^{''.join(_cls(c) for c in sorted(follow[p] | firsts))}]" for p in prefixes)
    return f"(?:[^{free}]|(?:{partial})*(?:{leave}))*(?:{partial})*"


def _re(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/-" else c for c in text)


def _cls(c: str) -> str:
    return "\\" + c if c in r"\]^-[/" else c
