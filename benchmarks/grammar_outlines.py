"""outlines-core beside agentkv on SchemaStore (benchmarks/grammar.py's `outlines-core` engine): in a
worker process, since its index build cannot be interrupted in-process. The worker compiles a schema,
judges its instances (agentkv's text of each, else the plain compact dump) and times the masks along
one accepted instance."""

from __future__ import annotations

import json
import time

import numpy as np

_OC_VOCAB = None


def _oc_init(vocab: list, eos: int) -> None:
    global _OC_VOCAB
    from outlines_core import Vocabulary

    groups: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab):
        if b is not None and i != eos:
            groups.setdefault(b, []).append(i)
    _OC_VOCAB = Vocabulary(eos, groups)


def _oc_schema(schema, cases: list[tuple[bool, list[int] | None, list[int]]], n_words: int, max_walk: int) -> dict:
    """Compile, judge each (valid, tokens of agentkv's text or None, tokens of the plain dump), walk one."""
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    t = time.perf_counter()
    try:
        index = Index(build_regex_from_schema(json.dumps(schema)), _OC_VOCAB)
    except Exception:  # noqa: BLE001 - any refusal counts as "does not compile"
        return {"compiled": False}
    out = {"compiled": True, "compile_s": time.perf_counter() - t, "bad": 0, "rejected": 0, "mask_s": []}

    def accepts(toks):
        g = Guide(index)
        try:
            for tok in toks:
                g.advance(tok)
        except Exception:  # noqa: BLE001 - a refused token
            return False
        return g.is_finished() or _OC_VOCAB.get_eos_token_id() in g.get_tokens()

    bitmask = np.zeros(n_words, dtype=np.int32)
    walked = False
    for valid, ours, plain in cases:
        ok = next((toks for toks in (ours, plain) if toks is not None and accepts(toks)), None)
        if (ok is not None) != valid:
            out["rejected" if ok is None else "bad"] += 1
        if ok is not None and not walked:
            walked = True
            g = Guide(index)
            for tok in ok[:max_walk]:
                t = time.perf_counter()
                g.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)
                out["mask_s"].append(time.perf_counter() - t)
                g.advance(tok)
    return out


def run_outlines(info, docs, st, timeout_s: float, cases_of, max_walk: int) -> None:
    """Each schema compiled and judged in the worker within `timeout_s` (compile + checks; past it the
    worker is killed and the schema counts as not compiled). `cases_of(doc)`: its instances as
    _oc_schema takes them; `max_walk`: the most tokens of the walk whose masks are timed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_oc_init, initargs=(info.vocab, info.eos_ids[0]))
    for doc in docs:
        fut = pool.submit(_oc_schema, doc["schema"], cases_of(doc), info.words, max_walk)
        try:
            r = fut.result(timeout=timeout_s)
        except FutureTimeout:
            for p in pool._processes.values():  # the build cannot be cancelled: end the worker
                p.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_oc_init,
                                       initargs=(info.vocab, info.eos_ids[0]))
            continue
        if not r["compiled"]:
            continue
        st.compiled += 1
        st.compile_s.append(r["compile_s"])
        st.compile_by[id(doc)] = r["compile_s"]
        st.bad += r["bad"]
        st.rejected += r["rejected"]
        st.mask_s.extend(r["mask_s"])
    pool.shutdown()
