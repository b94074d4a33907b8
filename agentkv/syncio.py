"""Async code from synchronous callers: the sync forms of `Agent.run` / `stream` and `ak.stream`, and
the objects `Agent.run` / `Agent.stream` return, which also serve the sync callers of the API before
0.2 (with a DeprecationWarning)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import warnings
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its result, also where an event loop is already running (a notebook):
    there, on a worker thread with a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def iterate_sync(agen: AsyncIterator[T]) -> Iterator[T]:
    """Iterate an async generator from synchronous code, on an event loop of its own; closing the
    iterator early closes the generator (which aborts its requests)."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


class Awaitable:
    """What `Agent.run` returns: awaited, the run; used synchronously (the API before 0.2, where `run`
    was the sync form), it runs now with a DeprecationWarning naming `instead`."""

    def __init__(self, make, instead: str):
        self._make, self._instead, self._result = make, instead, None

    def __await__(self):
        return self._make().__await__()

    def _sync(self):
        if self._result is None:
            warnings.warn(f"using Agent.run's result without await is deprecated: use {self._instead}(...)",
                          DeprecationWarning, stacklevel=3)
            self._result = run_sync(self._make())
        return self._result

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sync(), name)


class EventStream:
    """What `Agent.stream` returns: an async iterator of events; a plain `for` (the API before 0.2)
    iterates synchronously with a DeprecationWarning."""

    def __init__(self, make):
        self._make = make

    def __aiter__(self):
        return self._make().__aiter__()

    def __iter__(self):
        warnings.warn("iterating Agent.stream synchronously is deprecated: use Agent.stream_sync(...)",
                      DeprecationWarning, stacklevel=2)
        return iterate_sync(self._make())
