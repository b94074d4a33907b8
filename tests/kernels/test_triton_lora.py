"""The GPU's LoRA kernels (kernels/triton_lora.py) and slots (engine/lora/slots.py) against torch, in interpreter
mode on CPU (TRITON_INTERPRET=1, set in conftest.py), or compiled on a GPU: rows of several adapters and none,
ranks that are not powers of two, fp32 and bf16, and a pass's adapters through the slots (written over, grown)
giving the C path's numbers."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU", allow_module_level=True)

from agentkv.engine.lora.apply import LoraBatch  # noqa: E402
from agentkv.engine.lora.files import load_adapter  # noqa: E402
from agentkv.engine.lora.slots import LoraSlots  # noqa: E402
from agentkv.engine.model_config import ModelConfig  # noqa: E402
from agentkv.kernels.triton_lora import lora_update  # noqa: E402
from tests.lora_helpers import ATTENTION, MLP, make_adapter  # noqa: E402  (peft imported when called)
from tests.tiny import make_tiny_model  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,rank,k,n", [(1, 8, 64, 96), (7, 12, 100, 200), (33, 48, 96, 160)])
def test_the_update_is_torchs(dtype, rows, rank, k, n):
    g = torch.Generator().manual_seed(rows)
    slots = 3
    a = torch.randn(slots, rank, k, generator=g).to(dtype)
    b = torch.randn(slots, rank, n, generator=g).to(dtype)
    x = torch.randn(rows, k, generator=g).to(dtype)
    y = torch.randn(rows, n, generator=g).to(dtype)
    which = torch.randint(-1, slots, (rows,), generator=g)
    want = y.float().clone()
    for m in range(rows):
        if which[m] >= 0:
            want[m] += (x[m].float() @ a[which[m]].float().t()) @ b[which[m]].float()
    got = y.to(DEVICE).clone()
    lora_update(x.to(DEVICE), got, which.to(DEVICE), a.to(DEVICE), b.to(DEVICE))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.cpu().float(), want.to(dtype).float(), rtol=tol, atol=tol * want.abs().max())


def test_a_pass_through_the_slots_is_the_c_paths(tmp_path):
    pytest.importorskip("peft")  # (the adapters are made with it; a device image may lack it)
    base = make_tiny_model(tmp_path / "llama", "llama", hidden=96, heads=6, kv_heads=2, intermediate=200)
    cfg = ModelConfig.from_hf(json.loads((base / "config.json").read_text()))
    adapters = [load_adapter(f"a{i}", make_adapter(base, tmp_path / f"a{i}", r=r, seed=i, targets=t), cfg)
                for i, (r, t) in enumerate(((4, ATTENTION + MLP), (16, ATTENTION), (8, MLP), (6, ATTENTION)))]
    slots = LoraSlots(cfg, 2, DEVICE, torch.float32)
    g = torch.Generator().manual_seed(0)
    for batch in ([0, 1], [2, 3, 0], [1], [3, 2]):  # more adapters than slots, ranks growing: slots written over
        picked = [adapters[i] for i in batch]
        rows = torch.randint(-1, len(picked), (9,), generator=g)
        for target, (k, n) in {"qkv": (96, 160), "o": (96, 96), "gate_up": (96, 400), "down": (200, 96)}.items():
            x, y = torch.randn(9, k, generator=g), torch.randn(9, n, generator=g)
            want = y.clone()
            LoraBatch(picked, rows).add(1, target, x, want)  # torch's gather per adapter
            got = y.to(DEVICE).clone()
            LoraBatch(picked, rows.to(DEVICE), slots=slots).add(1, target, x.to(DEVICE), got)
            assert torch.allclose(got.cpu(), want, rtol=1e-4, atol=1e-4), (batch, target)
    assert slots.capacity == 3 and slots.rank == 48  # (a pass of three; q, k and v of rank 16 stacked)
