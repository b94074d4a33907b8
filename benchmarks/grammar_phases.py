"""Where a cold JSON Schema compile goes, phase by phase, at the median.

Compiles the SchemaStore schemas that llguidance also compiles (every 3rd, as benchmarks/grammar.py
takes them) in order with one compiler and an empty rule-automaton cache, as grammar.py's first
(49k) pass does, and times each phase of every compile. Prints each phase's median over the schemas
whose whole compile lies between the 35th and 65th percentile, so that the rows add up to about the
median compile the benchmark's ratio is taken at. An indented row is a part of the row above it,
but products are also built by the front end's emptiness checks (timed wherever they run).
`--passes 2` runs the whole again, from an empty cache again.

    python benchmarks/grammar_phases.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar import DATA, documents, tokenizers  # noqa: E402

import agentkv.grammar.compiler as compiler_module  # noqa: E402
from agentkv.grammar import GrammarCompiler, GrammarError  # noqa: E402
from agentkv.grammar.automata import automaton, dfa, dfa_native  # noqa: E402
from agentkv.grammar.schema import json_schema, validation  # noqa: E402
from agentkv.grammar.tokens import walk_tables  # noqa: E402

# (row, module or class, attribute): each timed where it is called from
PHASES = [
    ("$refs read", compiler_module, "SchemaResources"),
    ("front end (schema -> rules)", json_schema.JsonSchemaConverter, "convert"),
    ("  rule automata (hits and misses)", automaton, "minimal_dfa"),
    ("    a rule's automaton, encoded and built", dfa_native, "expression"),
    ("    products (intersections, differences)", dfa_native, "product"),
    ("  trim", automaton, "_trim"),
    ("link (rule automata, tables, trim)", compiler_module, "link"),
    ("walk tables", walk_tables.WalkTables, "__init__"),
    ("whole compile", GrammarCompiler, "compile_json_schema"),
]


def timed(spent: dict, row: str, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[row] += time.perf_counter() - t
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=1)
    args = ap.parse_args()
    if not DATA.exists():
        sys.exit(f"{DATA} is absent: this benchmark needs ../shared/data/schemastore beside the clone")
    _, info, lltok = next(tokenizers())
    docs = [json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))[::3]]
    import llguidance

    def llguidance_compiles(schema) -> bool:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        return not llguidance.LLMatcher.validate_grammar_with_warnings(grammar)[0] and \
            not llguidance.LLMatcher(lltok, grammar).is_error()

    common = [d for d in docs if llguidance_compiles(d["schema"])]
    known = documents()
    spent: dict[str, float] = defaultdict(float)
    for row, owner, name in PHASES:
        setattr(owner, name, timed(spent, row, getattr(owner, name)))
    rows = []
    for _ in range(args.passes):
        dfa.clear_cache()
        validation._metaschema_error.cache_clear()
        compiler = GrammarCompiler(info)
        for d in common:
            spent.clear()
            try:
                compiler.compile_json_schema(d["schema"], documents=known)
            except GrammarError:
                pass
            rows.append(dict(spent))
    total = np.array([r["whole compile"] for r in rows])
    order = np.argsort(total)
    band = order[int(len(order) * 0.35):int(len(order) * 0.65)]
    print(f"{len(common)} schemas x {args.passes} cold pass(es); whole-compile p50 {np.median(total) * 1e3:.2f} ms; "
          f"medians over the {len(band)} compiles between its 35th and 65th percentile:")
    for row, _, _ in PHASES:
        print(f"  {row:<45} {np.median([rows[i].get(row, 0.0) for i in band]) * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
