"""load_format="dummy": random weights drawn from config.json alone (the GPU benchmarks' full-size models).

Every parameter is drawn or set as the model's constructor means it (none left as uninitialized memory), the
draw is seeded (two engines agree token for token, as the benchmarks' eager-against-graphs rows need), a deep
stack stays finite, and the options that would misuse random weights are refused."""

from __future__ import annotations

import math

import pytest
import torch

import agentkv as ak
from agentkv.engine.dummy_weights import CONSTANTS
from agentkv.engine.linear import Linear
from agentkv.engine.loader import load_model
from agentkv.engine.model import RMSNorm
from agentkv.errors import RequestError
from agentkv.testing import write_tiny_model
from tests.tiny_families import make_family_model

GREEDY = ak.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True)


def _check_drawn(net: torch.nn.Module) -> None:
    """Each matrix ~ N(0, 1/fan_in); norms and the constructors' constants as constructed."""
    for module in net.modules():
        for name, p in module.named_parameters(recurse=False):
            where = f"{type(module).__name__}.{name} {tuple(p.shape)}"
            assert torch.isfinite(p).all(), where
            if isinstance(module, RMSNorm):
                assert torch.equal(p, torch.ones_like(p)), where
            elif name in CONSTANTS:
                assert torch.equal(p, torch.full_like(p, 1.0 if name in ("expert_scale", "layer_scalar") else 0.0))
            elif p.dim() >= 2:
                fan_in = p.shape[0] if isinstance(module, Linear) else p.shape[-1]
                assert p.std().item() == pytest.approx(fan_in**-0.5, rel=0.25), where
            else:
                assert 0.01 < p.std().item() < 0.04, where


@pytest.mark.parametrize("family", ["qwen3", "mixtral", "gemma3_text"])
def test_every_parameter_drawn(tmp_path, family):
    path = write_tiny_model(tmp_path / family, family, layers=3, weights=False)
    _check_drawn(load_model(path, load_format="dummy").model)


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3", "lfm2", "gemma4_text", "glm4_moe"])
def test_every_parameter_drawn_new_families(tmp_path, family):
    _check_drawn(load_model(make_family_model(tmp_path / family, family), load_format="dummy").model)


def test_a_full_shape_config_alone_decodes_the_same_twice(tmp_path):
    """A config naming a vocabulary larger than its tokenizer's (as the 8B shapes do), with no weights written:
    both engines draw the same weights, and a 24-layer stack's logits stay finite."""
    path = write_tiny_model(tmp_path / "deep", "qwen3", hidden=128, layers=24, heads=4, kv_heads=2,
                            intermediate=256, tie=False, weights=False, config={"vocab_size": 1000})
    assert not list(path.glob("*.safetensors"))
    runs = []
    for _ in range(2):
        engine = ak.Engine(str(path), load_format="dummy")
        try:
            out = engine.generate([[5, 6, 7, 8, 9], [40, 41]], GREEDY)
        finally:
            engine.close()
        runs.append([o.token_ids for o in out])
        assert all(len(o.token_ids) == 8 and all(math.isfinite(lp.logprob) for lp in o.logprobs) for o in out)
        assert len({t for o in out for t in o.token_ids}) > 2  # not a constant model
    assert runs[0] == runs[1]


def test_refusals(tmp_path):
    path = write_tiny_model(tmp_path / "m", weights=False)
    with pytest.raises(RequestError, match="load_format='bogus' is not one of"):
        ak.Engine(str(path), load_format="bogus")
    with pytest.raises(RequestError, match="without kv_dir"):
        ak.Engine(str(path), load_format="dummy", kv_dir=str(tmp_path / "kv"))
    with pytest.raises(RequestError, match="one rank"):
        ak.Engine(str(path), load_format="dummy", tensor_parallel=2)
