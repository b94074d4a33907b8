"""llama.cpp as a peer (through llama-cpp-python, where it is installed): each call runs in a spawned
process of its own (in ours its OpenMP runtime and torch's crash each other), on the given file, with
as many threads as ours.

    decode_rate      batch-1 decode after a one-token prompt, tok/s (best of `repeats`)
    batched_rate     `batch` sequences decoded together through one llama_batch a step (greedy, the
                     argmax of each row's logits in numpy), tok/s in all
    prompt_rate      a prompt of `tokens` tokens evaluated from an empty context, tok/s
    extend_rate      `new` tokens evaluated after `prefix` already in the context (llama-cpp-python's
                     prefix reuse: the cached prompt is not evaluated again), tok/s
    agents_wall      a replay of an agent workload's prompts, one after another in one context: each
                     prompt evaluated past the prefix it shares with the one before (llama-cpp-python's
                     own prefix reuse, as llama-server's one slot keeps it), then `new_tokens` decoded

llama-cpp-python 0.3.36 as pip builds it on this project's machines (-march=native, so with ggml's AMX
backend, which also serves batch-1 decode) crashes (SIGSEGV in ggml_backend_amx_mul_mat) on any
evaluation of more than one token. The functions that need one (batched_rate, prompt_rate,
agents_wall) then run on a second build named by AGENTKV_LLAMA_CPP_MULTI (a folder holding its
`llama_cpp` package, e.g. made with `pip install --target DIR` and CMAKE_ARGS="-DGGML_NATIVE=OFF
-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON ... -DGGML_AMX_INT8=OFF": no AMX backend, slower at batch 1),
or return None when their process dies.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

MULTI_TOKEN = (os.environ.get("AGENTKV_LLAMA_CPP_MULTI") or "").strip()


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None or bool(MULTI_TOKEN)


def call(fn, *args):
    """fn(*args) in a spawned process (on the AGENTKV_LLAMA_CPP_MULTI build for the functions that
    evaluate several tokens at once, where it is named); None when llama-cpp-python is missing or the
    process dies."""
    build = MULTI_TOKEN if fn is not decode_rate else ""
    if not build and importlib.util.find_spec("llama_cpp") is None:
        return None
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_use_build,
                             initargs=(build,)) as pool:
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            return None


def _use_build(folder: str) -> None:
    if folder:
        sys.path.insert(0, folder)


def build_of(fn) -> str:
    """Which llama-cpp-python `fn` runs on: the default one, or the AGENTKV_LLAMA_CPP_MULTI folder."""
    return MULTI_TOKEN if fn is not decode_rate and MULTI_TOKEN else "the installed llama-cpp-python"


def _load(path: str, threads: int, n_ctx: int = 2048):
    from llama_cpp import Llama

    return Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)


def decode_rate(path: str, new_tokens: int, repeats: int, threads: int) -> float:
    llm = _load(path, threads, 512)
    ban_eos = {llm.token_eos(): -1e9}
    llm.create_completion("Hello", max_tokens=8, temperature=0.0, logit_bias=ban_eos)  # warm up
    best = 0.0
    for _ in range(repeats):
        llm.reset()
        start = time.perf_counter()
        out = llm.create_completion("Hello", max_tokens=new_tokens, temperature=0.0, logit_bias=ban_eos)
        best = max(best, out["usage"]["completion_tokens"] / (time.perf_counter() - start))
    return best


def batched_rate(path: str, batch: int, new_tokens: int, repeats: int, threads: int) -> float:
    import llama_cpp as L
    import numpy as np

    llm = _load(path, threads, 64)
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_seq_max = batch * (new_tokens + 8), 512, batch
    params.n_threads = params.n_threads_batch = threads
    ctx = L.llama_init_from_model(llm._model.model, params)
    vocab = llm.n_vocab()
    eos = llm.token_eos()
    first = llm.tokenize(b"Hello")[-1]
    lots = L.llama_batch_init(batch, 0, batch)

    def step(tokens: list[int], pos: int) -> list[int]:
        lots.n_tokens = batch
        for s, tok in enumerate(tokens):
            lots.token[s], lots.pos[s], lots.n_seq_id[s], lots.logits[s] = tok, pos, 1, True
            lots.seq_id[s][0] = s
        if L.llama_decode(ctx, lots) != 0:
            raise RuntimeError("llama_decode failed")
        nxt = []
        for s in range(batch):
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, s), shape=(vocab,))
            row[eos] = -np.inf
            nxt.append(int(row.argmax()))
        return nxt

    def run(n: int) -> float:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        tokens = [first] * batch
        start = time.perf_counter()
        for pos in range(n):
            tokens = step(tokens, pos)
        return batch * n / (time.perf_counter() - start)

    run(4)  # warm up
    best = max(run(new_tokens) for _ in range(repeats))
    L.llama_batch_free(lots)
    L.llama_free(ctx)
    return best


def prompt_rate(path: str, tokens: list[int], repeats: int, threads: int) -> float:
    llm = _load(path, threads, max(512, len(tokens) + 8))
    best = 0.0
    for _ in range(repeats + 1):  # (the first one warms up)
        llm.reset()
        start = time.perf_counter()
        llm.eval(tokens)
        best = max(best, len(tokens) / (time.perf_counter() - start))
    return best


def extend_rate(path: str, prefix: list[int], new: list[int], repeats: int, threads: int) -> float:
    llm = _load(path, threads, max(512, len(prefix) + len(new) + 8))
    best = 0.0
    for _ in range(repeats + 1):  # (the first one warms up)
        llm.reset()
        llm.eval(prefix)
        start = time.perf_counter()
        llm.eval(new)
        best = max(best, len(new) / (time.perf_counter() - start))
    return best


def agents_wall(path: str, prompts_per_turn: list[list[list[int]]], new_tokens: int, threads: int) -> float:
    llm = _load(path, threads, 4096)
    ban_eos = {llm.token_eos(): -1e9}
    llm.create_completion("Hello", max_tokens=2, temperature=0.0, logit_bias=ban_eos)  # warm up
    start = time.perf_counter()
    for prompts in prompts_per_turn:
        for p in prompts:
            llm.create_completion(p, max_tokens=new_tokens, temperature=0.0, logit_bias=ban_eos)
    return time.perf_counter() - start
