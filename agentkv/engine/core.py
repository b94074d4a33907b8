"""The engine loop: one background thread that owns the model, the KV memory and the scheduler.

Callers (sync, async, the server, agents) never touch that state: they post commands to the inbox
and get results through callbacks. Each step reads: schedule, run, postprocess.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from agentkv.engine.disk import DiskTier
from agentkv.engine.host import usable_cores
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.null_cache import PrefixCache
from agentkv.engine.passes import Pass, PassRunner
from agentkv.engine.request import Request
from agentkv.engine.runner import ModelRunner
from agentkv.engine.scheduler import Scheduler
from agentkv.engine.trace import phase
from agentkv.errors import EngineClosedError, EngineError, RequestError


@dataclass
class Components:
    """Everything the engine thread owns, built on that thread."""

    scheduler: Scheduler
    runner: ModelRunner
    tokenizer: Any
    pool: KVPool
    req_pool: ReqToTokenPool
    tree: PrefixCache
    model_config: Any
    context_length: int
    overlap: bool = False  # overlap scheduling: the host prepares the next pass while one runs
    tier: DiskTier | None = None  # the KV disk tier under the tree (engine/disk/)


class EngineCore:
    def __init__(self, build: Callable[[], Components], build_on_worker: bool = False):
        """Start the engine thread, build the components on it, and return once they are ready
        (re-raising whatever the build raised, e.g. ModelLoadError). `build_on_worker` (overlap on
        CPU): build on the forward worker instead, the thread that will compute (see `_host_only`)."""
        self._inbox: list[Callable[[], None]] = []
        self._cv = threading.Condition()
        self._closed = False
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(build, ready, build_on_worker), name="agentkv-engine",
                                        daemon=True)
        self._thread.start()
        self.parts: Components = ready.result()

    def _run(self, build: Callable[[], Components], ready: Future, build_on_worker: bool) -> None:
        worker = ThreadPoolExecutor(1, thread_name_prefix="agentkv-forward") if build_on_worker else None
        try:
            if worker is None:
                _usable_threads()
            else:
                worker.submit(_usable_threads).result()
            p = build() if worker is None else worker.submit(build).result()
        except BaseException as e:
            if worker is not None:
                worker.shutdown()
            ready.set_exception(e)
            return
        if worker is not None:
            _host_only(worker)
        self.scheduler, self.runner, self.tokenizer = p.scheduler, p.runner, p.tokenizer
        self.pool, self.req_pool, self.tree = p.pool, p.req_pool, p.tree
        self.passes = PassRunner(p.runner, p.tokenizer, p.model_config.vocab_size, p.overlap, worker)
        if p.scheduler.drafter is not None:  # (without overlap: the pass's seconds are the step's)
            self.passes.observe = p.scheduler.drafter.costs.observe
        self._in_flight: Pass | None = None  # launched, its tokens not yet taken (overlap)
        ready.set_result(p)
        self._loop()

    # ---- called from any thread ------------------------------------------------------------------

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the engine thread between steps; its result or exception lands in the future."""
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # delivered to the caller, never kills the loop
                fut.set_exception(e)

        self._post(run)
        return fut

    def submit(self, reqs: list[Request]) -> None:
        def add() -> None:
            for r in reqs:
                try:
                    r.start_grammar(self.tokenizer)
                except Exception as e:
                    r.error = EngineError(f"starting the request's grammar failed: {type(e).__name__}: {e}")
                    r.finish_reason = "error"
                if r.finished:  # failed, or the grammar forced the whole output: no pass needed
                    self._notify(r)
                else:
                    self.scheduler.add(r)

        self._post(add)

    def abort(self, reqs: list[Request]) -> None:
        def drop() -> None:
            for r in reqs:
                if not r.finished:
                    self.scheduler.abort(r)
                    self._notify(r)

        self._post(drop)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _post(self, fn: Callable[[], None]) -> None:
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine is closed; create a new Engine")
            self._inbox.append(fn)
            self._cv.notify()

    # ---- the engine thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while (not self._inbox and not self.scheduler.has_work() and self._in_flight is None
                       and not self._closed):
                    left = self.tree.leases.seconds_left()  # a pin's lease may run out while idle
                    if left == 0.0 or not self._cv.wait(timeout=left):  # (False: it timed out)
                        break
                if self._closed:
                    break
                commands, self._inbox = self._inbox, []
            for command in commands:
                command()
            self.tree.expire_pins()
            if self.scheduler.has_work() or self._in_flight is not None:
                try:
                    self.step()
                except Exception as e:  # a scheduler bug: fail what is in flight rather than hang callers
                    traceback.print_exc()
                    self._fail_all(EngineError(f"engine step failed: {type(e).__name__}: {e}"))
        self._fail_all(EngineClosedError("the engine was closed before this request finished"))
        self.passes.close()

    def step(self) -> None:
        """Schedule a pass and launch it; process the pass before it (overlap) or this one."""
        with phase("schedule"):
            batch = self.scheduler.schedule()
        prev = self._in_flight
        if batch is None and prev is None:
            self._fail_unservable()
            return
        with phase("launch"):
            launched = self.passes.launch(batch) if batch is not None else None
        self._in_flight = None
        if prev is not None:  # its tokens are taken while `launched` runs on the worker
            self._finish(prev, launched)
        if launched is not None:
            with phase("plan"):
                self.passes.plan(launched)
            if self.passes.overlap:
                self._in_flight = launched
            else:
                self._finish(launched, None)

    def _finish(self, p: Pass, after: Pass | None) -> None:
        # requests that finished before this pass was processed have been told already
        reqs = [r for r in p.batch.reqs if not r.finished]
        try:
            with phase("collect"):
                result = self.passes.collect(p)
            for (r, _), lp in zip(p.batch.score_positions, result.scores):
                r.token_scores.append(lp)
            with phase("process"):
                self.scheduler.process(p.batch, result.tokens, self.tokenizer, result.logprobs,
                                       after.batch if after is not None else None, result.made)
        except Exception as e:
            # A failed pass must not take the engine down: fail its requests, free their memory.
            err = EngineError(f"forward pass failed: {type(e).__name__}: {e}")
            err.__cause__ = e
            traceback.print_exc()
            self.scheduler.fail(p.batch, err)
        for r in reqs:
            self._notify(r)

    def _fail_unservable(self) -> None:
        """Nothing fits even though nothing runs: the head request can never be admitted."""
        s = self.scheduler
        if s.waiting and not s.running:
            r = s.waiting[0]
            pinned = self.tree.pinned_size
            r.error = RequestError(
                f"request needs {r.seq_len + 1} tokens of KV but only {self.pool.capacity - pinned} can be free "
                f"({pinned} are pinned); unpin prefixes or give the engine more num_slots"
            )
            s.abort(r, "error")
            self._notify(r)

    def _notify(self, r: Request) -> None:
        if r.on_update is not None:
            try:
                r.on_update(r)
            except Exception:  # a broken callback (e.g. a closed event loop) must not stop the engine
                traceback.print_exc()

    def _fail_all(self, err: BaseException) -> None:
        commands, self._inbox = self._inbox, []
        for command in commands:  # commands posted before close: let them add or answer first
            command()
        s = self.scheduler
        if self._in_flight is not None:  # let the worker finish it: its rows are reused only after
            p, self._in_flight = self._in_flight, None
            self.passes.drain(p)
            s.fail(p.batch, err)
        for b in list(s.flight.batches):  # scheduled by a step that failed before launching it
            s.fail(b, err)
        for r in list(s.waiting) + list(s.running):
            r.error = err
            s.abort(r, "error")
            self._notify(r)


def _usable_threads() -> None:
    """The calling thread's torch (and kernels') threads at most the cores this process may use: its
    affinity and its cgroup's CPU quota (engine/host.py), which torch's default ignores."""
    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)


def _host_only(worker: ThreadPoolExecutor) -> None:
    """Make the calling thread (the engine thread, with overlap on CPU) run its torch ops on one
    thread, and leave the worker's and new threads' setting as it was.

    Each thread that runs a multi-threaded torch op keeps its own OpenMP pool, and with two pools on
    the cores the worker's forward pass took 55 ms instead of 28 (batch-1 decode, 2 cores); the
    engine thread's own torch work (slot lists, small index tensors) needs no pool.
    """
    threads = worker.submit(torch.get_num_threads).result()
    torch.get_num_threads()  # settles this thread's own setting first, so that the next line stays its own
    torch.set_num_threads(1)
    worker.submit(torch.set_num_threads, threads).result()  # also the default that new threads take
