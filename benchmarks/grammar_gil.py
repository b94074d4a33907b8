"""benchmarks/grammar.py's second table: a torch matmul loop on one thread, alone and while another
thread computes masks from emptied caches. The token walk runs in C without the GIL, so the matmul
should barely slow down (issue 36: at most 15%)."""

from __future__ import annotations

import time

from agentkv.grammar import GrammarCompiler, GrammarError, Matcher, TokenizerInfo


def gil_row(info: TokenizerInfo, docs, known: dict, text_of, max_tokens: int, seconds: float = 3.0) -> list:
    """A torch matmul loop on one thread, alone and while another thread computes masks (every cache
    emptied first, so each is a first computation): how much the matmul slows down. The masks are of
    every configuration along each schema's first valid instance (`text_of(grammar, value)`: its
    text; its first `max_tokens` tokens), compiled beforehand with `known` documents."""
    import threading

    import torch

    compiler = GrammarCompiler(info)
    work = []  # (grammar, configurations along an instance)
    for doc in docs:
        try:
            g = compiler.compile_json_schema(doc["schema"], documents=known)
        except GrammarError:
            continue
        for case in doc["tests"]:
            text = text_of(g, case["data"]) if case["valid"] else None
            if text:
                m, cfgs = Matcher(g), []
                for tok in info.encode_bytes(text.encode())[:max_tokens]:
                    cfgs.append(m._cfg)
                    if not m.accept_token(tok):
                        break
                work.append((g, cfgs))
                break
    torch.set_num_threads(1)
    a = torch.randn(384, 384)

    def matmuls(stop: threading.Event) -> float:
        n, t = 0, time.perf_counter()
        while not stop.is_set() and time.perf_counter() - t < seconds:
            a @ a
            n += 1
        return n / (time.perf_counter() - t)

    alone = matmuls(threading.Event())
    masks = [0]

    def compute(stop: threading.Event) -> None:
        while not stop.is_set():
            for g, cfgs in work:
                g._masks.clear()
                g._state_tokens.clear()
                g.walk_tables.clear()
                for cid in cfgs:
                    if stop.is_set():
                        return
                    g.mask(cid)
                    masks[0] += 1

    stop = threading.Event()
    worker = threading.Thread(target=compute, args=(stop,))
    worker.start()
    beside = matmuls(threading.Event())
    stop.set()
    worker.join()
    return [f"{alone:.0f}/s", f"{beside:.0f}/s", f"{100 * (1 - beside / alone):.1f}%", f"{masks[0] / seconds:.0f}/s"]
