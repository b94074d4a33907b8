"""The GPU run in its `--smoke` mode on CPU (benchmarks/gpu.sh and each script it runs), so a lent GPU's minutes
are never lost to a script that does not run, and the bounds the rows are read against."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _gpu_models():
    """benchmarks/gpu_models.py as a module (benchmarks/ is not put on sys.path: its agents.py would shadow
    the openai-agents package for the rest of the run)."""
    spec = importlib.util.spec_from_file_location("agentkv_bench_gpu_models", BENCH / "gpu_models.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """`bash benchmarks/gpu.sh --smoke`: every step in its smoke mode, the kernels interpreted; its $OUT."""
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("gpu-smoke")
    done = subprocess.run(["bash", str(BENCH / "gpu.sh"), "--smoke"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OUT": str(out), "PYTHON": sys.executable}, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_gpu_sh_runs_every_step(smoke_run):
    summary = (smoke_run / "summary.md").read_text()
    for step in ("kernel-tests", "kernels", "sweep", "profile", "engine"):
        assert f"- {step}: rc=0," in summary, summary
    # (a device call brings back 8 files at most)
    assert sorted(f.name for f in smoke_run.iterdir()) == ["engine.md", "kernels.md", "profile.md", "run.log",
                                                           "summary.md", "sweep.md"]


def test_gpu_engine_smoke(smoke_run):
    text = (smoke_run / "engine.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("tiny (smoke)")]
    assert [r.split()[2] for r in rows] == ["decode", "decode", "prefill", "agent", "greedy"], text
    assert "Error" not in text, text
    assert "4/4 sequences the same" in text


def test_gpu_profile_smoke(smoke_run):
    text = (smoke_run / "profile.md").read_text()
    assert text.count("wall time a step") == 2, text
    for name in ("schedule", "launch", "plan", "forward", "sample", "collect", "process"):
        assert f" {name} " in text, (name, text)


def test_gpu_kernels_sweep_smoke(smoke_run):
    text = (smoke_run / "sweep.md").read_text()
    assert text.count("decode b2 ctx40") == 4 and text.count("best") == 1, text


def test_gpu_kernels_smoke(smoke_run):
    text = (smoke_run / "kernels.md").read_text()
    assert "decode b2 ctx40" in text and "extend 2x8 after 16" in text, text
    assert "RequestError: the flashinfer backend needs a CUDA GPU" in text  # (and the other columns timed)


def test_bounds_of_the_8b_shape():
    """Llama-3-8B: 7.0 B linear weights; a batch-1 step reads them, the vocabulary projection and one
    sequence's KV (131,072 bytes a token in bf16); 8k tokens of prefill are 2 FLOPs a weight a token plus the
    causal attention's 2 T^2 d a head and layer."""
    models = _gpu_models()
    published_peaks = models.published_peaks
    s = models.SHAPES["llama3-8b"]
    assert s.linear_params() == 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)
    assert s.kv_bytes_per_token() == 131072
    step = s.decode_step_bytes(1, 1000)
    assert step == 2 * (s.linear_params() + 128256 * 4096) + 2 * 4096 + 1000 * 131072
    flops = s.prefill_flops(8192)
    assert flops == pytest.approx(2 * s.linear_params() * 8192 + 2 * 128256 * 4096 + 2 * 32 * 32 * 128 * 8192**2)
    # a prompt after a cached prefix: each new token attends to the prefix and the new tokens before it
    assert s.prefill_flops(1, cached=100) == pytest.approx(
        2 * s.linear_params() + 2 * 128256 * 4096 + 4 * 32 * 32 * 128 * 100.5)
    assert published_peaks("NVIDIA H100 80GB HBM3") == (3350.0, 989.0)
    assert published_peaks("NVIDIA H200") == (4800.0, 989.0)
    assert published_peaks("NVIDIA H100 PCIe") == (2000.0, 756.0)
    assert published_peaks("Some other GPU") is None
