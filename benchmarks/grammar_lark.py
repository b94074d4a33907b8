"""Lark grammars: how long agentkv takes to read and compile them, beside llguidance.

The grammars are what agentkv builds itself (each tool-call format's grammar for 2 and 8 tools, a
reasoning model's reply under a schema) and two written by hand (an arithmetic grammar with %ignore
and left recursion, JSON with imports). For each: the text read into rules (`lark_rules`: the
parser and the lowering to expressions), the whole compilation with a fresh compiler and an empty
automata cache, and llguidance's `grammar_from_lark` + `LLMatcher` where it reads the grammar
(`%pyjson` is ours only). Medians over repeats, in milliseconds, at the embedded 49k vocabulary.

    python benchmarks/grammar_lark.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from agentkv.chat.calls import FunctionSpec
from agentkv.chat.formats import FORMATS
from agentkv.chat.reasoning import ReasoningFormat, reply_grammar
from agentkv.engine.loader import resolve_model_dir
from agentkv.engine.tokenizer import Tokenizer
from agentkv.grammar.automata import dfa
from agentkv.grammar.compiler import GrammarCompiler
from agentkv.grammar.lark.lower import lark_rules
from agentkv.grammar.tokens.vocab import TokenizerInfo

CALC = r"""
?start: sum
sum: sum ("+" | "-") product | product
product: product ("*" | "/") atom | atom
atom: NUMBER | "-" atom | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""

JSON = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: string ":" value
string: ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""


def tools(n: int) -> list[FunctionSpec]:
    return [FunctionSpec(f"tool_{i}", {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["C", "F"]}, "note": {"type": ["string", "null"]}}, "required": ["city", "days"]})
        for i in range(n)]


def grammars() -> list[tuple[str, str]]:
    out = [("calc", CALC), ("json", JSON)]
    for fmt in FORMATS.values():
        for n in (2, 8):
            out.append((f"{fmt.name} {n} tools", fmt().grammar(tools(n), "auto", None, True)))
    answer = f"answer: %json {json.dumps(tools(1)[0].parameters)}\n"
    out.append(("reasoning, a schema", reply_grammar(answer, ReasoningFormat(), "may")))
    return out


def median_ms(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    d = resolve_model_dir(None)
    info = TokenizerInfo.from_huggingface(Tokenizer(d))
    lltok = None
    try:
        import llguidance
        import llguidance.hf
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
        lltok = llguidance.hf.from_tokenizer(hf, eos_token=sorted(info.eos_ids)[0])
    except ImportError:
        pass

    def compile_fresh(text):
        dfa.clear_cache()
        GrammarCompiler(info).compile_lark(text)

    def llg(text):
        g = llguidance.LLMatcher.grammar_from_lark(text)
        m = llguidance.LLMatcher(lltok, g)
        if m.is_error():
            raise ValueError(m.get_error())

    print(f"{'grammar':24} {'chars':>6} {'read ms':>8} {'compile ms':>11} {'llguidance ms':>14}")
    for name, text in grammars():
        read = median_ms(lambda: lark_rules(text, lambda schema, rule, python: {rule: None}), args.repeats)
        full = median_ms(lambda: compile_fresh(text), args.repeats)
        peer = "-"
        if lltok is not None and "%pyjson" not in text:
            try:
                peer = f"{median_ms(lambda: llg(text), args.repeats):.2f}"
            except ValueError as e:
                peer = f"refused ({str(e)[:30]})"
        print(f"{name:24} {len(text):6} {read:8.2f} {full:11.2f} {peer:>14}")


if __name__ == "__main__":
    main()
