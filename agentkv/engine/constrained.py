"""Grammar-constrained decoding in the engine: compile a request's grammar, build the batch's token
bitmask while the forward pass runs, and turn finished text into the caller's object.

Compilation runs on the caller's thread (a bad schema raises `GrammarError` before anything is
queued); matchers live on the engine thread; masks are filled on one worker thread during the
forward pass, when no other code touches the matchers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from agentkv.engine.request import Request
from agentkv.engine.sampling_params import SamplingParams
from agentkv.errors import GrammarError, RequestError
from agentkv.grammar import CompiledGrammar, GrammarCompiler, Matcher, TokenizerInfo
from agentkv.grammar.schema.numbers import NUMBER_DIGITS
from agentkv.grammar.schema.parse import value_parser

# A request that names no JSON style: the model picks compact or spaced at the first separator (a chat
# turn's tool calls take its template's style first: chat/turn.py).
DEFAULT_JSON_STYLE = "model"


class GrammarSupport:
    """One engine's grammar compiler, built on first use from the engine's tokenizer."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        # One compiler per number bound and JSON style requests ask for (SamplingParams.number_digits, None
        # under strict; json_style), all over one TokenizerInfo; a compiler given with `use` serves every
        # request as it is.
        self._compilers: dict[tuple[int | None, str], GrammarCompiler] = {}
        self._given: GrammarCompiler | None = None
        self._lock = threading.Lock()

    @property
    def compiler(self) -> GrammarCompiler:
        """The compiler of requests with the default number bound and JSON style."""
        return self.compiler_for(NUMBER_DIGITS, DEFAULT_JSON_STYLE)

    def compiler_for(self, number_digits: int | None, json_style: str) -> GrammarCompiler:
        with self._lock:
            if self._given is not None:
                return self._given
            c = self._compilers.get((number_digits, json_style))
            if c is None:
                info = next((c.info for c in self._compilers.values()), None)
                info = info or TokenizerInfo.from_huggingface(self._tokenizer)
                c = self._compilers[number_digits, json_style] = GrammarCompiler(
                    info, number_digits=number_digits, json_style=json_style)
            return c

    def cache_info(self) -> dict[str, int]:
        """The compilers' caches (GrammarCompiler.cache_info) summed, or nothing before the first grammar."""
        with self._lock:
            compilers = [self._given] if self._given is not None else list(self._compilers.values())
        out: dict[str, int] = {}
        for c in compilers:
            for k, v in c.cache_info().items():
                out[k] = out.get(k, 0) + v
        return out

    def stats(self) -> dict[str, int]:
        """The engine's stats() of its grammars: how many are cached, their bytes, what was evicted."""
        g = self.cache_info()
        return dict(
            grammars_cached=g.get("grammars", 0),
            grammar_cache_bytes=sum(g.get(k, 0) for k in ("table_bytes", "mask_bytes", "walk_bytes", "dfa_bytes")),
            grammar_cache_evictions=sum(g.get(k, 0) for k in (
                "grammars_evicted", "grammars_renewed", "mask_evictions", "walk_evictions", "dfa_evictions")),
        )

    def use(self, compiler: GrammarCompiler) -> None:
        vocab = self._tokenizer.backend.get_vocab_size(with_added_tokens=True)
        if not isinstance(compiler, GrammarCompiler) or compiler.info.vocab_size != vocab:
            raise RequestError(f"this engine needs a GrammarCompiler for its own tokenizer ({vocab} tokens); "
                               "build one with GrammarCompiler(TokenizerInfo.from_huggingface(engine.tokenizer))")
        with self._lock:
            self._given = compiler

    def compile(self, params: SamplingParams) -> CompiledGrammar | None:
        """The request's grammar (cached by source), or None for free text. Raises GrammarError, also
        for a strict request whose grammar relaxed a keyword."""
        if not params.structured:
            return None
        digits = None if params.strict else params.number_digits
        style = params.json_style or DEFAULT_JSON_STYLE
        compiler = self.compiler_for(digits, style)
        if params.json_schema is not None:  # (the request's bound and style, also on a compiler given with `use`)
            grammar = compiler.compile_json_schema(params.json_schema, close_objects=params.close_objects,
                                                   number_digits=digits, json_style=style)
        elif params.regex is not None:
            grammar = compiler.compile_regex(params.regex)
        elif params.grammar is not None:
            grammar = compiler.compile_lark(params.grammar)
        else:
            return None
        if params.strict and grammar.relaxed:
            first = grammar.relaxed[0]
            more = f" (and {len(grammar.relaxed) - 1} more)" if len(grammar.relaxed) > 1 else ""
            where = f"{first.part}: " if first.part else ""
            raise GrammarError(f"strict: {where}the grammar cannot enforce `{first.keyword}` exactly ({first.reason})"
                               f"{more}; "
                               "change the schema, or drop strict to have it validated after generation",
                               first.pointer)
        return grammar


def check_budget(grammar: CompiledGrammar, max_new: int, context_bound: bool) -> None:
    """Budget closing: the grammar's shortest output must fit the tokens the request may make, or it
    is refused before anything is queued (a RequestError naming the least max_tokens that fits)."""
    m = Matcher(grammar)
    toks = m.completion_tokens()
    if toks is None or len(toks) <= max_new:
        return
    text = m.completion_bytes().decode("utf-8", "replace")
    shown = text if len(text) <= 80 else text[:77] + "..."
    where = f"the context leaves {max_new} tokens for the output" if context_bound else f"max_tokens={max_new}"
    raise RequestError(f"{where}, but the shortest output this grammar accepts is {len(toks)} tokens ({shown!r}); "
                       f"raise max_tokens to at least {len(toks)} (or set budget_closing=False to have it cut)")


def output_parser(params: SamplingParams) -> Callable[[str], Any] | None:
    """text -> the caller's object for a structured request (grammar/schema/parse.py: a Pydantic
    instance, a value of another Python type, or a dict checked against the whole schema), the text
    for a regex or grammar, None for free text."""
    if params.json_schema is None:
        return (lambda text: text) if params.structured else None
    return value_parser(params.json_schema)


class MaskWorker:
    """Fills the token bitmask of a batch's sampling rows on a worker thread."""

    def __init__(self, vocab_size: int):
        self.words = (vocab_size + 31) // 32
        self._pool: ThreadPoolExecutor | None = None

    def start(self, reqs: Sequence[Request], drafts: Sequence[list[int]] | None = None) -> Future | None:
        """Begin filling masks for the requests of `reqs` that have a grammar; the future gives
        (their row indices, bitmask [len(rows), words]). None when no request has one.

        `drafts` (speculation): per request, the draft its pass checks; such a request has a row
        for its current state and one after each draft token (the matcher walks the draft and
        rolls back), and row indices count those rows. A row whose next token the grammar forces
        (speculative.Draft.forced) allows that token only."""
        drafts = drafts or [[] for _ in reqs]
        rows, jobs, at = [], [], 0
        for r, d in zip(reqs, drafts):
            if r.matcher is not None:
                rows += range(at, at + 1 + len(d))
                jobs.append((r.matcher, d))
            at += 1 + len(d)
        if not rows:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentkv-masks")
        return self._pool.submit(self._fill, rows, jobs)

    def _fill(self, rows: list[int], jobs: list) -> tuple[list[int], torch.Tensor]:
        bitmask = np.empty((len(rows), self.words), dtype=np.int32)
        k = 0
        for m, draft in jobs:
            m.fill_next_token_bitmask(bitmask, k)
            m.drop_split_prefixes(bitmask, k)  # (the tokens the tokenizer would not end there)
            k += 1
            forced = getattr(draft, "forced", ())
            for j, token in enumerate(draft):  # (the scheduler checked that the grammar takes the whole draft)
                m.accept_token(token)
                if j + 1 in forced:  # the grammar's forced token: its row may make nothing else
                    bitmask[k] = 0
                    bitmask[k].view(np.uint32)[draft[j + 1] >> 5] = np.uint32(1 << (draft[j + 1] & 31))
                else:
                    m.fill_next_token_bitmask(bitmask, k)
                    m.drop_split_prefixes(bitmask, k)
                k += 1
            if draft:
                m.rollback(len(draft))
        return rows, torch.from_numpy(bitmask)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
