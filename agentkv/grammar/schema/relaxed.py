"""What a compiled JSON schema does not enforce: the keywords its grammar relaxed, each with its pointer.

A keyword the grammar cannot enforce exactly (`uniqueItems`, an overlapping `oneOf`, a lookbehind in
a `pattern`, ...) is dropped from the grammar, which then allows a superset of the schema's values,
and the finished output is validated against the whole schema (`checked`). Formats agentkv does not
know are annotations under JSON Schema 2020-12: accepted as any string and not validated either
(`checked=False`). `GrammarCompiler(strict=True)` refuses all of these with a `GrammarError` instead.
A `$ref` to a document that was not given is refused either way (nothing is fetched, and nothing
could check a value there): pass it as `documents=`.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentkv.errors import GrammarError


@dataclass(frozen=True)
class Relaxed:
    """One keyword the grammar does not enforce.

    `pointer`: its JSON pointer (`#/properties/tags/uniqueItems`); `reason`: why; `checked`: whether
    validating the output against the schema checks it (False for an annotation-only format);
    `part`: in a composed grammar, the part whose schema it is in ("tool 'search'"; the pointer is
    within that part's schema)."""

    pointer: str
    keyword: str
    reason: str
    checked: bool = True
    part: str = ""

    def __str__(self) -> str:
        after = "validated after generation" if self.checked else "not enforced"
        where = f"{self.part} " if self.part else ""
        return f"{where}{self.pointer}: {self.keyword} ({after}: {self.reason})"


class Relaxations:
    """Mixed into the converter (schema/json_schema.py): `relax` records a keyword the grammar drops, or in
    strict mode raises the `GrammarError` that says so. While a caller probes (tells oneOf branches
    apart, say), relaxing raises too: a probe must see the schema as written, and its answer is
    thrown away on error."""

    def _init_relaxations(self, strict: bool) -> None:
        self.strict = strict
        self.relaxed: dict[tuple[str, str], Relaxed] = {}
        self._probing = 0

    def relax(self, keyword: str, pointer: str, reason: str, *, checked: bool = True) -> None:
        if self.strict or self._probing:
            after = "checks it after generation" if checked else "leaves it as an annotation"
            raise GrammarError(f"{reason} (a strict GrammarCompiler refuses it; a default one drops it from the "
                               f"grammar and {after})", pointer)
        self.relaxed.setdefault((pointer, keyword), Relaxed(pointer, keyword, reason, checked))

    def probing(self) -> _Probe:
        return _Probe(self)


class _Probe:
    def __init__(self, owner: Relaxations):
        self.owner = owner

    def __enter__(self) -> None:
        self.owner._probing += 1

    def __exit__(self, *exc: object) -> None:
        self.owner._probing -= 1
