"""ComposedGrammar: a Lark grammar with one rule given as alternatives that are compiled apart.

An agent's step offers a subset of its tools, and the next step another: as one text, each subset
is a new grammar, compiled whole (128 tools took ~0.8 s, and masking one of them as long again). As
a composed grammar, each tool's call is a part, compiled once and kept by its text; a step is its
head (the text around the calls) and the parts it offers, linked in the compiler's state pool
(grammar/pool.py) without compiling either again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from agentkv.errors import GrammarError

_RULE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class ComposedGrammar:
    """`text` (a Lark grammar, start rule `start`) uses the rule `rule` without defining it, and
    `rule` is any one of `parts` (Lark grammars, each with its own start rule `start` and its own
    names). Each part must read at least one byte. `labels` name the parts in errors (a tool format
    gives "tool 'get_weather'"); without them a part is named by its place. Accepted wherever a Lark
    grammar's text is (`SamplingParams.grammar`, `GrammarCompiler.compile_lark`); `str(g)` is not its
    text."""

    text: str
    rule: str
    parts: tuple[str, ...]
    labels: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.text, str) or not all(isinstance(p, str) for p in self.parts):
            raise GrammarError("a composed grammar's text and parts are Lark grammar texts")
        if not self.parts:
            raise GrammarError(f"the composed rule {self.rule!r} needs at least one part")
        if not isinstance(self.rule, str) or not _RULE_NAME.fullmatch(self.rule):
            raise GrammarError(f"the composed rule's name {self.rule!r} must be a lowercase Lark rule name")
        if self.labels and len(self.labels) != len(self.parts):
            raise GrammarError(f"{len(self.labels)} labels for {len(self.parts)} parts: give one a part, or none")

    def label(self, k: int) -> str:
        return self.labels[k] if self.labels else f"part {k} of the composed rule {self.rule!r}"

    def __radd__(self, prefix: str) -> ComposedGrammar:
        """`prefix + grammar`: Lark rules written before the text (as a reasoning block's start rule
        is written before a reply's answer rules)."""
        if not isinstance(prefix, str):
            return NotImplemented
        return replace(self, text=prefix + self.text)
