"""Shared helpers for grammar tests: byte vocabularies and whole-string acceptance."""

from __future__ import annotations

from agentkv.grammar import GrammarCompiler, TokenizerInfo
from agentkv.grammar.compiled import DEAD, CompiledGrammar

BYTE_INFO = TokenizerInfo([bytes([i]) for i in range(256)] + [None], eos_ids=[256])
BYTE_COMPILER = GrammarCompiler(BYTE_INFO)


def accepts(g: CompiledGrammar, text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    cid = g.advance(g.initial, data)
    return cid != DEAD and g.can_end(cid)


def assert_language(g: CompiledGrammar, good, bad, source: str) -> None:
    """Every string of `good` is accepted whole, none of `bad` is."""
    for s in good:
        assert accepts(g, s), (source, s)
    for s in bad:
        assert not accepts(g, s), (source, s)


def is_prefix(g: CompiledGrammar, text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    return g.advance(g.initial, data) != DEAD


def check_ratchet(path, current: set[str], what: str) -> int:
    """Fail if a name recorded in `path` is missing from `current`; return how many are new.

    `AGENTKV_UPDATE_RATCHET=1` rewrites the file with `current` (after an improvement).
    """
    import os

    recorded = set(path.read_text().splitlines()) if path.exists() else set()
    if os.environ.get("AGENTKV_UPDATE_RATCHET") == "1":
        path.write_text("".join(f"{n}\n" for n in sorted(current)))
        recorded = set(current)
    lost = sorted(recorded - current)
    assert not lost, f"{len(lost)} {what} before now fail, e.g. {lost[:5]}"
    return len(current - recorded)
