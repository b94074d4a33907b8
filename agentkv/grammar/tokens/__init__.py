"""Automata -> tokens: the vocabulary as the grammar sees it (vocab.py), its byte trie (trie.py), the
token walk that makes masks (walk.py, walk_tables.py, state_tables.py) and the pre-tokenizer cuts jump-forward
respects (splits.py)."""
