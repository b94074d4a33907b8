"""Random weights for a model's config, made on its device (`load_format="dummy"`, vLLM's name for it).

A full-size model's speed does not depend on its weights' values, and its checkpoint does not travel to a
lent GPU (16 GB for an 8B model): the benchmarks build the model from config.json alone, drawing every
matrix on the device, which takes seconds where writing and reading a random checkpoint takes minutes.

The values keep a deep stack's activations in range, so greedy decoding is deterministic and comparable
between runs (graphs against eager): every matrix ~ N(0, 1/fan_in), biases ~ N(0, 0.02^2), and what the
model's constructor set to a constant (norm weights at one, attention sinks and router score biases at
zero, per-expert and per-layer scales at one) left as it is. The draw is seeded, so two engines built
from one config hold the same weights.
"""

from __future__ import annotations

import torch

from agentkv.engine.linear import Linear
from agentkv.engine.model import CausalLM, RMSNorm
from agentkv.engine.model_config import ModelConfig

# parameters a constructor sets to a constant that the model is meant to start from
CONSTANTS = ("sinks", "score_bias", "expert_scale", "layer_scalar")


def random_model(cfg: ModelConfig, max_positions: int, device: str, seed: int = 0) -> CausalLM:
    """A CausalLM of `cfg` built on `device` in fp32, its weights drawn there (cast it after)."""
    with torch.device(device):
        net = CausalLM(cfg, max_positions)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, RMSNorm):
                continue
            for name, param in module.named_parameters(recurse=False):
                if name in CONSTANTS:
                    continue
                if param.dim() == 1:
                    param.normal_(0.0, 0.02, generator=gen)
                    continue
                # our Linear keeps its weight input-major [in, out]; every other table is [..., in]
                fan_in = param.shape[0] if isinstance(module, Linear) else param.shape[-1]
                param.normal_(0.0, fan_in**-0.5, generator=gen)
    return net
