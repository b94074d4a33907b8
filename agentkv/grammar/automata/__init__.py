"""Expressions -> automata: the expression language every source lowers to (expr.py), regexes
parsed into it (regex.py), one rule's minimal DFA built in C or Python and cached (dfa.py), and all
rules linked into one table (automaton.py)."""
