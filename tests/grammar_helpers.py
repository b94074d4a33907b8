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


def is_prefix(g: CompiledGrammar, text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    return g.advance(g.initial, data) != DEAD
