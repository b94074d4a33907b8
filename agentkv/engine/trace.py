"""Timed phases of a step (benchmarks/gpu_profile.py: where the host's time goes, beside the device's kernels).

A torch profiler records the CPU ops of the thread that started it only, and a step's work is on two
(the engine thread, and with overlap the forward worker), so the phases are timed here: inside
`recording()`, every `phase(name)` any thread enters is kept as a Span. Outside it, `phase` is a shared
no-op context (a global read): a `record_function` would cost about 8 us a call on these CPUs, and a step
makes eight."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

_NOTHING = contextlib.nullcontext()
_spans: list[Span] | None = None  # where phases are kept, while recording


@dataclass(frozen=True)
class Span:
    name: str
    thread: str
    start_ns: int  # time.perf_counter_ns()
    end_ns: int


class _Timed:
    __slots__ = ("name", "start")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        self.start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        spans = _spans
        if spans is not None:  # (list.append is atomic: threads share it safely)
            spans.append(Span(self.name, threading.current_thread().name, self.start, time.perf_counter_ns()))


def phase(name: str):
    """A context timing `name` while `recording()` is on; a shared no-op otherwise."""
    return _NOTHING if _spans is None else _Timed(name)


@contextlib.contextmanager
def recording() -> Iterator[list[Span]]:
    """The spans of every phase entered, on any thread, while inside (one recording at a time)."""
    global _spans
    if _spans is not None:
        raise RuntimeError("a phase recording is already on")
    _spans = spans = []
    try:
        yield spans
    finally:
        _spans = None
