"""The cores this process may use: its CPU affinity, and the CPU quota of its cgroup (a container's
`--cpus`), which OpenMP's default ignores. A pool of more threads than the quota allows runs them in
turn, each barrier of a step waiting for a thread the scheduler has parked (ggml and the Go runtime
read the quota for the same reason)."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def usable_cores(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The CPUs in this process's affinity mask, at most its cgroup's quota (rounded up), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not Linux)
        cores = os.cpu_count() or 1
    quota = cgroup_quota(root, proc_cgroup)
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def cgroup_quota(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup allows (cgroup v2's cpu.max, v1's cpu.cfs_quota_us over its
    period), or None where it sets none or none is readable."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    v2 = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
    v1 = next((line.split(":", 2)[2] for line in lines if "cpu" in line.split(":", 2)[1].split(",")), "/")
    for folder in (root / v2.lstrip("/"), root):
        try:
            limit, period = (folder / "cpu.max").read_text().split()[:2]
            return None if limit == "max" else int(limit) / int(period)
        except (OSError, ValueError):
            pass
    for folder in (root / "cpu" / v1.lstrip("/"), root / "cpu", root / "cpu,cpuacct"):
        try:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
            return None if quota <= 0 or period <= 0 else quota / period
        except (OSError, ValueError):
            pass
    return None
