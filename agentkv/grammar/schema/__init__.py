"""JSON Schema (and Pydantic models, through their schemas) -> expressions: the keywords lowered to
grammar rules (json_schema.py and its parts), what a grammar relaxed (relaxed.py), and the check of a
finished value against the whole schema (validation.py)."""
