"""The fused Triton ops (kernels/triton_fused.py) against the model's torch ops, which give HF's values: in the
interpreter on CPU (TRITON_INTERPRET=1, conftest.py), compiled on a GPU. fp32 within float rounding; bf16
equal but for a rare last-bit difference (a row's sum of squares in another order, sigmoid's exp)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU", allow_module_level=True)

from agentkv.engine.model import RMSNorm  # noqa: E402
from agentkv.engine.model_config import ModelConfig  # noqa: E402
from agentkv.engine.rope import RotaryEmbedding  # noqa: E402
from agentkv.kernels import triton_fused  # noqa: E402

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
DTYPES = [torch.float32, torch.bfloat16]


def close(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor | None = None) -> None:
    """fp32: float rounding. bf16: within three units in the last place (2^-7 relative) of `scale` (the
    terms a value sums: rope's two products can cancel) or of the larger of the value and 1% of the tensor's
    largest (a GELU or SiLU tail rounds to 0 or to a tiny value); the interpreter's casts to bf16 truncate
    where a GPU's round to nearest. Compiled, at most 1% of the values may differ at all."""
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return
    if scale is None:
        scale = want.float().abs().clamp(min=0.01 * want.float().abs().max().item())
    gap = (got.float() - want.float()).abs()
    assert (gap <= 3 * 2**-7 * scale).all(), (gap / scale).max().item()
    if DEV != "cpu":
        assert (got != want).float().mean().item() <= 0.01


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 576), (3, 4, 24)], ids=["rows", "heads"])
def test_rms_norm(dtype, shape):
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(shape[-1], 1e-6)
    norm.weight.data = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)
    # (a q slice of a fused projection: rows of heads inside wider token rows)
    wide = (torch.randn(shape[0], 3 * shape[-1] * (shape[1] if len(shape) == 3 else 1), generator=g) * 3).to(dtype)
    x = wide[:, : shape[-1] * (shape[1] if len(shape) == 3 else 1)].view(shape)
    norm.to(DEV)
    x = x.to(DEV)
    close(triton_fused.rms_norm(x, norm.weight, 1e-6), norm(x))


@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_glu(dtype, gelu):
    g = torch.Generator().manual_seed(2)
    width = 1536 + 40  # more than one block of columns, the last one partial
    gate_up = (torch.randn(4, 2 * width, generator=g) * 2).to(dtype).to(DEV)
    gate, up = gate_up.split(width, dim=-1)
    want = (torch.nn.functional.gelu(gate, approximate="tanh") if gelu else torch.nn.functional.silu(gate)) * up
    close(triton_fused.glu(gate_up, gelu), want)


@pytest.mark.parametrize("partial", [False, True], ids=["", "partial-rotary"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(dtype, partial):
    cfg = ModelConfig.from_hf({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
        "vocab_size": 100, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "partial_rotary_factor": 0.5 if partial else 1.0})
    rope = RotaryEmbedding(cfg, 64).to(DEV)
    g = torch.Generator().manual_seed(3)
    positions = torch.tensor([0, 5, 17, 63, 2]).to(DEV)
    qkv = (torch.randn(5, 9 * 24, generator=g) * 2).to(dtype).to(DEV)
    qk = qkv[:, : 6 * 24].view(5, 6, 24)  # q and k heads of a fused projection, v's columns after them
    tables = rope.tables(positions, dtype)
    tables.rotation = None  # (the CPU's rotation matrices for small passes: the element-wise form is the GPU's)
    if partial:
        assert tables.rot == 12
    half, rot = tables.rot // 2, tables.rot
    partner = torch.cat([qk[..., half:rot], qk[..., :half], qk[..., rot:]], dim=-1)  # rotate_half's, unsigned
    terms = qk.float().abs() * tables.cos.float().abs() + partner.float().abs() * tables.sin.float().abs()
    close(triton_fused.rope(qk, tables.cos, tables.sin, tables.rot), RotaryEmbedding.apply_one(tables, qk),
          terms.clamp(min=1e-3) if dtype == torch.bfloat16 else None)


def test_takes():
    x = torch.zeros(4, 8, device=DEV)
    assert triton_fused.takes(x) and triton_fused.takes(x.view(4, 2, 4))
    assert not triton_fused.takes(x.t()) and not triton_fused.takes(x[:0])
    assert not triton_fused.takes(torch.zeros(2, triton_fused.MAX_ROW + 1, device=DEV))


def test_engine_on_fused_ops_equals_torch_ops(tmp_path, monkeypatch):
    """fused_ops=True: a Qwen3 model's norms (q/k norms included), SiLU and rotation go through the kernels
    (counted), and its greedy tokens and logprobs are the torch ops' (fp32: interpreted on CPU, compiled on a
    GPU)."""
    import agentkv as ak
    from tests.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "m", "qwen3", layers=2)
    calls = {"rms_norm": 0, "glu": 0, "rope": 0}
    for name in calls:
        def counted(*args, _f=getattr(triton_fused, name), _n=name, **kw):
            calls[_n] += 1
            return _f(*args, **kw)
        monkeypatch.setattr(triton_fused, name, counted)
    params = ak.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    outs = {}
    for fused in (False, True):
        with ak.Engine(str(path), device=DEV, dtype="float32", native_kernels=False, attention_backend="torch",
                       fused_ops=fused) as engine:
            outs[fused] = engine.generate(["fused ops", "a longer prompt for the check"], params)
    # per forward: 2 layers x (2 norms + q and k norms), the final norm; a SiLU and a rotation a layer
    assert calls["rms_norm"] >= 9 and calls["glu"] >= 2 and calls["rope"] >= 4, calls
    for a, b in zip(outs[False], outs[True]):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert abs(x.logprob - y.logprob) < 1e-4


def test_fused_ops_refused_where_they_cannot_run(monkeypatch):
    from agentkv.errors import RequestError
    from agentkv.kernels.triton_backend import fused_ops_for

    assert fused_ops_for(False, "cpu") is None
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not torch.cuda.is_available():
        with pytest.raises(RequestError, match="fused_ops=True, but the fused Triton ops cannot run"):
            fused_ops_for(True, "cpu")
