"""Lark grammars -> expressions: the text as Lark is given it (source.py) and its trees lowered to
grammar rules (lower.py)."""
