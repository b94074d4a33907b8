"""Shared pieces of the benchmarks: the HF peer, timing, tables, busy processes beside a run.

The peer (HF transformers) runs in a worker process that this benchmark run starts and drives,
alternating with our engine so both see the same machine. It is not in our process because two
long-lived torch compute threads in one process interfere: measured here on 2 cores, our engine
thread ran 25-50% slower once another thread had run OpenMP kernels, whichever side that was.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

_HERE = str(Path(__file__).resolve().parent)
_hf_model = None  # lives in the peer process


def _init_peer() -> None:
    sys.path.insert(0, _HERE)


class Peer:
    """A worker process holding HF transformers' load of the embedded model."""

    def __init__(self, dtype: str = "float32"):
        import multiprocessing as mp

        self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_init_peer)
        self.call(_load, dtype)

    def call(self, fn, *args):
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown()


def _load(dtype: str) -> None:
    global _hf_model
    import transformers

    from agentkv.engine.loader import embedded_model_path

    path = embedded_model_path()
    _hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)).eval()


def hf_generate(prompts: list[list[int]], new_tokens: int, pad_id: int) -> tuple[float, list[list[int]]]:
    """HF `generate` on a left-padded batch, greedy, exactly `new_tokens` each; (seconds, outputs)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    start = time.perf_counter()
    with torch.no_grad():
        out = _hf_model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=pad_id)
    elapsed = time.perf_counter() - start
    return elapsed, out[:, width:].tolist()


def table(rows: list[list], headers: list[str]) -> str:
    cells = [[str(h) for h in headers]] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@contextlib.contextmanager
def busy_processes(n: int):
    """`n` processes spinning (`python -c "while 1: pass"`) for the block's length: a machine busy with
    other work (a test run, a build, another model), which both sides of a comparison share."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
