"""The engine reads nothing back from the device but the sampled tokens: one read per pass.

On a GPU every host read of a device tensor (`.tolist()`, `.item()`, `int(t)`, `.cpu()`, ...) waits
for the pass in flight, which defeats overlap scheduling. On the CPU there is no device, so the
tensors that would live on it (the slot table, the KV pool, and everything computed from them: the
logits, the sampler's work) are tagged with a tensor subclass that records each host read with
where it happened. The engine may read one packed tensor per pass, in `sampler.read_host`.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import agentkv as ak
from tests.engine.test_overlap import assert_same, run
from tests.test_structured import TOOL_CALL

READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu,
         torch.Tensor.__array__, torch.Tensor.__format__}
ALLOWED = ("read_host", "agentkv/engine/sampler.py")


def _to_host(func, args, kwargs) -> bool:
    if func is not torch.Tensor.to:
        return False
    targets = list(args[1:]) + [kwargs.get("device")]
    return any(isinstance(t, (str, torch.device)) and torch.device(t).type == "cpu" for t in targets)


class OnDevice(torch.Tensor):
    """A tensor that would live on the accelerator: host reads of it are recorded."""

    reads: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or _to_host(func, args, kwargs):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith(("torch/_tensor.py", "torch/overrides.py")):
                frame = frame.f_back  # torch's own Python wrappers (e.g. Tensor.__format__)
            where = (frame.f_code.co_name, frame.f_code.co_filename, frame.f_lineno) if frame else ("?", "?", 0)
            with cls.lock:
                cls.reads.append(where)
        return super().__torch_function__(func, types, args, kwargs)


def tag_device_tensors(engine: ak.Engine) -> None:
    """On the engine thread, between steps: the KV pool becomes OnDevice, and the slot table a copy
    apart from its host copy, as on a GPU (so every write must reach it through the passes)."""
    def tag() -> None:
        core = engine._core
        core.req_pool.table = core.req_pool.host.clone().as_subclass(OnDevice)
        core.pool.kv_caches = [(k.as_subclass(OnDevice), v.as_subclass(OnDevice)) for k, v in core.pool.kv_caches]

    engine._core.call(tag).result()


def run_workload(engine: ak.Engine) -> list:
    outputs = run(engine) + run(engine)  # the second time with the system prompt cached
    # a scoring request (choices read the logprob of each choice's tokens) and a required tool call
    outputs.append(engine.score("Pick one:", ["red", "green", "blue"]))
    outputs.append(engine.generate("Call it:", json_schema=TOOL_CALL, max_tokens=120, temperature=0.0).text)
    return outputs


def test_the_tagging_sees_reads():
    """The instrument itself: each kind of read is recorded, device-side work is not."""
    OnDevice.reads.clear()
    t = torch.arange(6.0).as_subclass(OnDevice)
    u = (t * 2).softmax(-1)[1:]
    assert not OnDevice.reads
    u.tolist(), int(t[0]), float(u[0]), bool(t[1] > 0), u.to("cpu"), list(range(10))[t[3].long()]
    assert len(OnDevice.reads) == 6
    OnDevice.reads.clear()


@pytest.mark.parametrize("options", [
    {"overlap_schedule": False, "num_slots": 4096},
    {"overlap_schedule": True, "num_slots": 4096},
    {"overlap_schedule": True, "num_slots": 300, "max_running_requests": 8},  # retractions and evictions
], ids=["sync", "overlap", "overlap-pressure"])
def test_one_host_read_per_pass(tiny_dir, options):
    options = {"attention_backend": "torch", "native_kernels": False, **options}
    with ak.Engine(str(tiny_dir), **options) as engine:
        expected = run_workload(engine)
    with ak.Engine(str(tiny_dir), **options) as engine:
        tag_device_tensors(engine)
        passes = engine.stats()["forward_passes"]
        OnDevice.reads.clear()
        outputs = run_workload(engine)
        reads = list(OnDevice.reads)
        passes = engine.stats()["forward_passes"] - passes
        st = engine.stats()
        assert st["free_slots"] + st["cached_tokens"] == st["total_slots"], "a pass leaked slots"
    # the same outputs: the device's copy of the slot table got every write the host made
    assert_same(outputs[:-2], expected[:-2])
    assert outputs[-1] == expected[-1]
    for ours, ref in zip(outputs[-2], expected[-2], strict=True):
        assert ours == pytest.approx(ref, abs=1e-4)
    stray = sorted({(name, file.rsplit("site-packages/", 1)[-1], line) for name, file, line in reads
                    if not (name == ALLOWED[0] and file.endswith(ALLOWED[1]))})
    assert not stray, f"host reads of device tensors outside sampler.read_host: {stray}"
    assert 0 < len(reads) <= passes, f"{len(reads)} reads in {passes} passes"
