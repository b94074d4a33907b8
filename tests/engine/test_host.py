"""engine/host.py: the cores an engine's threads use, from the affinity mask and the cgroup's CPU quota
(v2's cpu.max, v1's cfs quota), as a container's `--cpus` sets them."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentkv.engine.host import cgroup_quota, usable_cores


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_in_the_process_own_cgroup(tmp_path):
    write(tmp_path / "proc", "0::/docker/abc\n")
    write(tmp_path / "cg" / "docker" / "abc" / "cpu.max", "150000 100000\n")
    write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc") == 1.5
    write(tmp_path / "cg" / "docker" / "abc" / "cpu.max", "max 100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc") is None


def test_cgroup_v1_quota_and_none(tmp_path):
    write(tmp_path / "proc", "4:cpu,cpuacct:/kube/pod\n0::/\n")
    write(tmp_path / "cg" / "cpu" / "kube" / "pod" / "cpu.cfs_quota_us", "300000\n")
    write(tmp_path / "cg" / "cpu" / "kube" / "pod" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc") == 3.0
    write(tmp_path / "cg" / "cpu" / "kube" / "pod" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc") is None
    assert cgroup_quota(tmp_path / "none", tmp_path / "missing") is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's affinity mask")
def test_usable_cores_is_the_smaller_of_affinity_and_quota(tmp_path):
    mask = len(os.sched_getaffinity(0))
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "50000 100000\n")  # half a CPU: one thread
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 1
    write(tmp_path / "cg" / "cpu.max", f"{100000 * (mask + 4)} 100000\n")
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == mask


def test_an_engine_runs_its_passes_on_the_usable_cores(tiny_dir, monkeypatch):
    """The forward thread's torch threads (the C kernels take their count) at most the usable cores."""
    import torch

    import agentkv as ak
    from agentkv.engine import core

    def in_new_thread(fn, *args):
        with ThreadPoolExecutor(1) as t:
            return t.submit(fn, *args).result()

    default = in_new_thread(torch.get_num_threads)  # (what new threads take: setting a thread's count sets it)
    monkeypatch.setattr(core, "usable_cores", lambda: 1)
    try:
        with ak.Engine(str(tiny_dir), num_slots=512) as engine:
            worker = engine._core.passes._worker
            threads = worker.submit(torch.get_num_threads).result() if worker else engine._core.call(
                torch.get_num_threads).result()
            assert threads == 1
            assert engine.generate("hello", max_tokens=3, temperature=0).completions[0].token_ids
    finally:  # the other tests' engines take the machine's count again
        in_new_thread(torch.set_num_threads, default)
