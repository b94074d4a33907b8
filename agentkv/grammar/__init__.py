"""Schemas, regexes and Lark grammars -> automata -> token masks and canonical jump-forward.

Pure Python and numpy (no torch): `TokenizerInfo` describes a vocabulary, `GrammarCompiler` compiles
(and caches) grammars for it, `CompiledGrammar` is shared by every request, and `Matcher` is one
request's position. See docs/grammar.md for the supported dialects and choices.
"""

from agentkv.errors import GrammarError
from agentkv.grammar.compiled import CompiledGrammar
from agentkv.grammar.compiler import GrammarCompiler
from agentkv.grammar.matcher import Matcher, fill_next_token_bitmasks
from agentkv.grammar.tokens.vocab import TokenizerInfo

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "Matcher", "TokenizerInfo", "fill_next_token_bitmasks"]
