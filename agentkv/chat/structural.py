"""Structural tags: free text, except that where the model writes a trigger, what follows is one of
the tags that start with it, exactly: its begin text, JSON matching its schema, its end text; then
free text again. The shape vLLM and xgrammar accept in `response_format`:

    {"type": "structural_tag",
     "structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

The grammar (start rule `answer`, so a reasoning block may come first) is text that holds no
trigger, then tags and text in turn. Each tag's JSON is read back and checked against its whole
schema after generation, as any output is (what its grammar relaxed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentkv.chat.calls import text_without
from agentkv.chat.formats.base import json_rule, lark_literal
from agentkv.errors import OutputValidationError, RequestError
from agentkv.grammar.compiler import output_grammar_schema
from agentkv.grammar.schema.validation import schema_check


@dataclass(frozen=True)
class Tag:
    begin: str
    schema: Any
    end: str


@dataclass(frozen=True)
class StructuralTag:
    tags: tuple[Tag, ...]
    triggers: tuple[str, ...]

    @classmethod
    def parse(cls, spec: dict, where: str = "response_format") -> StructuralTag:
        """The tag a request describes; RequestError naming the field otherwise."""
        structures, triggers = spec.get("structures"), spec.get("triggers")
        if not isinstance(structures, list) or not structures:
            raise RequestError(f"{where}.structures: give a list of {{\"begin\", \"schema\", \"end\"}}")
        if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise RequestError(f"{where}.triggers: give the texts that start a tag (each structure's begin starts "
                               "with one)")
        tags = []
        for i, s in enumerate(structures):
            begin, end = (s.get("begin"), s.get("end")) if isinstance(s, dict) else (None, None)
            if not isinstance(begin, str) or not isinstance(end, str) or "schema" not in s:
                raise RequestError(f"{where}.structures[{i}]: a structure is {{\"begin\": text, \"schema\": {{...}}, "
                                   "\"end\": text}")
            if not any(begin.startswith(t) for t in triggers):
                raise RequestError(f"{where}.structures[{i}].begin: {begin!r} starts with none of the triggers "
                                   f"{triggers}; free text could not lead into it")
            tags.append(Tag(begin, output_grammar_schema(s["schema"]), end))
        return cls(tuple(tags), tuple(triggers))

    def grammar(self) -> str:
        """Lark rules whose start rule is `answer`."""
        try:
            text = text_without(self.triggers)
        except ValueError:
            raise RequestError("structural_tag triggers must be 2 or more characters long, and none may hold a "
                               "trigger's first character again after its start (as '<function=' does not)") from None
        rules = ["answer: TEXT (tag TEXT)*", "tag: " + " | ".join(f"tag{i}" for i in range(len(self.tags)))]
        rules += [f"tag{i}: {lark_literal(t.begin)} {json_rule(t.schema)} {lark_literal(t.end)}"
                  for i, t in enumerate(self.tags)]
        return "\n".join(rules) + f"\nTEXT: /{text}/\n"

    def check(self, text: str, finish_reason: str | None = None) -> None:
        """Each complete tag's JSON against its whole schema (OutputValidationError naming the keyword)."""
        decoder = json.JSONDecoder()
        at = 0
        while True:
            found = [(text.find(t.begin, at), t) for t in self.tags]
            found = [(i, t) for i, t in found if i >= 0]
            if not found:
                return
            start, tag = min(found, key=lambda p: (p[0], -len(p[1].begin)))
            try:
                value, at = decoder.raw_decode(text, start + len(tag.begin))
            except json.JSONDecodeError:
                return  # cut by max_tokens: an incomplete tag is not a value
            failure = schema_check(tag.schema).failure(value)
            if failure is not None:
                raise OutputValidationError(f"the JSON of the tag {tag.begin!r} does not validate against its schema: "
                                            f"{failure.message}", text, finish_reason, failure.keyword,
                                            failure.pointer)
