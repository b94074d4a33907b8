"""Tensor parallelism over `torch.distributed` (gloo on CPU, NCCL on CUDA): `Engine(tensor_parallel=N)`.

Each rank holds 1/N of every layer: its share of the attention heads (q, k and v columns of the fused
qkv projection, and the matching rows of o_proj, input-major) and of the MLP (gate and up columns,
down_proj rows). o_proj and down_proj outputs are partial sums, all-reduced across ranks; the
embedding, norms and vocabulary projection are replicated. Each rank's KV pool holds its own KV
heads, at the same slot indices: rank 0 runs the engine (scheduler, radix tree, sampling) and
broadcasts every pass's inputs, with the slot-table rows the pass reads, to ranks 1..N-1, which are
worker processes that only run the model.

Every rank loads the whole checkpoint and keeps its shard (simple, and the memory peak is one full
copy per process). A failure on one rank in the middle of a pass leaves the others waiting in a
collective: the engine must then be closed (its worker processes are terminated).
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing as mp
import os
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from agentkv.engine.loader import DTYPES, load_model
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.runner import ModelRunner
from agentkv.errors import ModelLoadError, RequestError
from agentkv.kernels import cpu_native, get_backend

STARTUP_TIMEOUT_S = 600


def worker_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


def compact_inputs(inputs: Any, host_table: torch.Tensor) -> Any:
    """The pass's inputs with only the slot-table rows it reads, from rank 0's host copy of the table
    (ReqToTokenPool.host: nothing is read back from the device)."""
    meta = inputs.meta
    width = max(meta.seq_lens, default=1)
    table = host_table[meta.req_rows, :width]
    small = dataclasses.replace(meta, req_to_token=table, req_rows=torch.arange(len(meta.seq_lens)),
                                host_table=None, host_rows=None)
    # the other ranks' logits are not used: select none
    return dataclasses.replace(inputs, meta=small, select=[], placeholder_at=[], placeholder_rows=[],
                               table_writes=None)


class TensorParallel:
    """Rank 0's side: starts the worker processes, sends them each pass, stops them."""

    def __init__(self, world: int, model: str | None, dtype: str, device: str, num_slots: int, backend: str,
                 native: bool = False, kv_dtype: str | None = None):
        """`backend`: rank 0's attention backend by name; `native`: whether it runs the C kernels;
        `kv_dtype`: the pools' dtype (None: `dtype`)."""
        if dist.is_initialized():
            raise RequestError("a tensor-parallel engine is already running in this process; close it first")
        self.world = world
        ctx = mp.get_context("spawn")
        fd, self._rendezvous = tempfile.mkstemp(prefix="agentkv-tp-")
        os.close(fd)
        os.unlink(self._rendezvous)  # torch creates it
        self._procs, pipes = [], []
        for rank in range(1, world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, name=f"agentkv-tp{rank}", daemon=True,
                            args=(rank, world, self._rendezvous, model, dtype, device, num_slots, backend, native,
                                  kv_dtype or dtype, child))
            p.start()
            self._procs.append(p)
            pipes.append(parent)
        try:
            for rank, (p, pipe) in enumerate(zip(self._procs, pipes), 1):  # each loads its shard, then joins
                _wait_ready(rank, p, pipe)
            dist.init_process_group(_dist_backend(device), init_method=f"file://{self._rendezvous}", rank=0,
                                    world_size=world, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
        except BaseException:
            self.close(notify=False)
            raise

    def send(self, inputs: Any, ids: torch.Tensor, host_table: torch.Tensor) -> None:
        # (the ids' copy to the host is this pass's one read besides its sampled tokens: the ranks'
        # broadcast goes through the host)
        dist.broadcast_object_list([(compact_inputs(inputs, host_table), ids.cpu())], src=0)

    def close(self, notify: bool = True) -> None:
        if notify and dist.is_initialized():
            try:
                dist.broadcast_object_list([None], src=0)
            except Exception:  # a dead worker: terminated below
                traceback.print_exc()
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        if dist.is_initialized():
            dist.destroy_process_group()
        if os.path.exists(self._rendezvous):
            os.unlink(self._rendezvous)


def _wait_ready(rank: int, proc, pipe) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not pipe.poll(0.2):
        if not proc.is_alive():
            raise ModelLoadError(
                f"tensor-parallel rank {rank} exited (code {proc.exitcode}) before loading its shard. Worker "
                "processes are spawned and import your script again: create the Engine under "
                "`if __name__ == '__main__':`")
        if time.monotonic() > deadline:
            raise ModelLoadError(f"tensor-parallel rank {rank} did not load its shard within {STARTUP_TIMEOUT_S} s")
    status = pipe.recv()
    if status != "ready":
        raise ModelLoadError(f"tensor-parallel rank {rank} failed to load its shard: {status}")


def _dist_backend(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def _worker_main(rank: int, world: int, rendezvous: str, model: str | None, dtype: str, device: str,
                 num_slots: int, backend_name: str, native: bool, kv_dtype: str, pipe) -> None:
    """A rank > 0: load the shard, then run every pass rank 0 broadcasts until it sends None."""
    try:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
        device = worker_device(device, rank)
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        kernels = cpu_native.load() if native else None
        loaded = load_model(model, dtype=dtype, device=device, shard=(rank, world), native=kernels)
        pool = KVPool(loaded.config, num_slots, DTYPES[kv_dtype], device)  # the shard's config: its KV heads
        runner = ModelRunner(loaded.model, pool, ReqToTokenPool(1, 1, device), get_backend(backend_name), device)
    except BaseException as e:
        pipe.send(f"{type(e).__name__}: {e}")
        return
    pipe.send("ready")
    dist.init_process_group(_dist_backend(device), init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            break
        inputs, ids = box[0]
        inputs.meta.req_to_token = inputs.meta.req_to_token.to(device)
        runner.forward_ids(runner.upload(inputs), ids.to(device))
    dist.destroy_process_group()
