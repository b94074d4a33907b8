"""A layer's MLP: the gated `MLP` (SwiGLU, or Gemma's GeGLU), and `MoE`, a routed mixture of such
MLPs with the routers of the families agentkv runs (softmax top-k; Gemma 4's with a scale per expert;
DeepSeek-V3's and GLM-4.5's sigmoid scores chosen within groups) and an optional shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from agentkv.engine.linear import Linear
from agentkv.engine.lora.apply import LoraBatch
from agentkv.engine.model_config import ModelConfig
from agentkv.kernels.cpu_native import NativeKernels

__all__ = ["MLP", "MoE", "gated"]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, width: int | None = None, layer_id: int | None = None):
        super().__init__()
        self.layer_id = layer_id  # None: an expert (LoRA adapters do not target experts)
        self.intermediate = width or cfg.intermediate_size
        self.gelu = cfg.hidden_act == "gelu_tanh"  # GeGLU (Gemma) instead of SwiGLU
        # gpt-oss's: gate clamped above, up on both sides, gate * sigmoid(alpha * gate) * (up + 1)
        self.clamped = (cfg.swiglu_limit, cfg.swiglu_alpha) if cfg.hidden_act == "swiglu_clamped" else None
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.intermediate, bias=cfg.mlp_bias)
        self.down_proj = Linear(self.intermediate, cfg.hidden_size, bias=cfg.mlp_bias)
        self.native: NativeKernels | None = None  # set by CausalLM.finalize
        self.fused = None  # kernels/triton_fused.py on a GPU (fused_ops), set by CausalLM.finalize

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                exact_rows: torch.Tensor | None = None, lora: LoraBatch | None = None) -> torch.Tensor:
        """residual + mlp(x) (mlp(x) where residual is None); `lora`: the pass's adapters' updates."""
        gate_up = self.gate_up_proj(x, exact_rows=exact_rows)
        if lora is not None:
            lora.add(self.layer_id, "gate_up", x, gate_up)
        act = self.activate(gate_up)
        out = self.down_proj(act, residual, exact_rows)
        if lora is not None:
            lora.add(self.layer_id, "down", act, out)
        return out

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The gate's activation times up: what the down projection reads."""
        return gated(gate_up, self.gelu, self.native, self.fused, self.clamped)


def gated(gate_up: torch.Tensor, gelu: bool, native: NativeKernels | None, fused,
          clamped: tuple[float, float] | None = None) -> torch.Tensor:
    """act(gate) * up of gate_up [T, 2n] (the halves side by side): silu, GELU's tanh form (`gelu`) or gpt-oss's
    clamped SwiGLU (`clamped`: limit, alpha), on the native step's own body where `native` takes it, or one
    fused kernel on a GPU."""
    handled = native is not None and native.handles(gate_up)
    if clamped is not None and handled and gate_up.dtype == torch.float32:
        return native.glu_mul(gate_up, clamp=clamped)
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    if clamped is not None:
        limit, alpha = clamped
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        return gate * torch.sigmoid(gate * alpha) * (up + 1)
    if handled:
        return native.glu_mul(gate_up, gelu)
    if fused is not None and fused.takes(gate_up):  # one kernel, rounds as below
        return fused.glu(gate_up, gelu)
    return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up


class MoE(nn.Module):
    """A routed mixture of experts: each token goes to the `experts_per_token` experts its router
    chooses, and its output is their weighted sum, plus a shared expert where the family has one
    (Qwen2-MoE's gated by a sigmoid).

    The experts run grouped: the step's (token, expert) pairs are sorted by expert and each expert
    that has tokens runs once on all of them (one gate_up and one down matmul per expert with work),
    then its rows are added back where they came from. Each expert is an `MLP` of `Linear`s, so its
    weights are packed for the CPU kernels like any other linear."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.experts_per_token, cfg.norm_topk_prob
        self.router = Linear(cfg.hidden_size, cfg.num_experts, bias=cfg.router_bias)
        self.sigmoid_groups = cfg.router == "sigmoid_groups"
        if self.sigmoid_groups:  # (added to the scores to choose, not to weigh: DeepSeek-V3's load balancing)
            self.score_bias = nn.Parameter(torch.zeros(cfg.num_experts))
        # (Gemma 4: each chosen expert's weight times its own scale, after the renormalization)
        self.expert_scale = nn.Parameter(torch.ones(cfg.num_experts)) if cfg.router == "gemma4" else None
        self.groups, self.groups_chosen = cfg.expert_groups, cfg.expert_groups_chosen
        self.scaling = cfg.routed_scaling_factor
        self.experts = nn.ModuleList(MLP(cfg, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))
        shared = cfg.shared_expert_intermediate_size
        self.shared = MLP(cfg, shared) if shared else None
        self.shared_gate = Linear(cfg.hidden_size, 1) if shared and cfg.shared_expert_gated else None
        self.all_reduce = False  # tensor parallelism: each rank's experts hold a slice of their width
        self.native: NativeKernels | None = None  # set by CausalLM.finalize: the routing in C

    @staticmethod
    def _grouped(experts: list[MLP], exact_rows: torch.Tensor | None) -> bool:
        """Whether the experts' products go as grouped native calls: tiled weights of one part each (the
        same type: one file's experts), no row of a prompt's (those are computed exactly, row by row)."""
        if exact_rows is not None and bool(exact_rows.any()):
            return False
        lin = experts[0].gate_up_proj
        return lin.native is not None and all(
            p.quantized is not None and p.quantized.tiled and not p.quantized.parts and not p.all_reduce
            and p.quantized.qtype == q.quantized.qtype
            for e in experts for p, q in ((e.gate_up_proj, lin), (e.down_proj, experts[0].down_proj)))

    @staticmethod
    def _grouped_experts(experts: list[MLP], xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each expert over its rows, its gate_up products one native call, the down products another."""
        native = experts[0].gate_up_proj.native
        gate_ups = native.qlinear_grouped(xs, [e.gate_up_proj.quantized for e in experts],
                                          [e.gate_up_proj.bias for e in experts])
        acts = [e.activate(gu) for e, gu in zip(experts, gate_ups)]
        return native.qlinear_grouped(acts, [e.down_proj.quantized for e in experts],
                                      [e.down_proj.bias for e in experts])

    def route(self, x: torch.Tensor, exact_rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's chosen experts [T, k] and their weights [T, k] (fp32)."""
        logits = self.router(x, exact_rows=exact_rows).float()
        if self.native is not None:
            # the native step's routing (csrc/cpu_moe.c), so both choose the same experts with the same weights
            chosen, weights = (self.native.moe_route_groups(logits, self.score_bias, self.top_k, self.groups,
                                                            self.groups_chosen, self.norm_topk_prob, self.scaling)
                               if self.sigmoid_groups else
                               self.native.moe_route(logits, self.top_k, self.norm_topk_prob, self.scaling))
        else:
            chosen, weights = self._route_torch(logits)
        if self.expert_scale is not None:  # (Gemma 4's: after the renormalization; its routed scaling is 1)
            weights = weights * self.expert_scale.float()[chosen]
        return chosen, weights

    def _route_torch(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """route's choice and weights in torch's ops (no native kernels: a GPU, no compiler)."""
        if not self.sigmoid_groups:
            weights, chosen = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        else:  # sigmoid scores; the experts of the best groups (a group's score: its two best) compete
            scores = logits.sigmoid()
            choice = scores + self.score_bias.float()
            if self.groups > 1:
                grouped = choice.view(choice.shape[0], self.groups, -1)
                best = grouped.topk(2, dim=-1).values.sum(dim=-1).topk(self.groups_chosen, dim=-1).indices
                keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
                choice = grouped.masked_fill(~keep[..., None], float("-inf")).view_as(choice)
            chosen = choice.topk(self.top_k, dim=-1).indices
            weights = scores.gather(1, chosen)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if self.sigmoid_groups else 0.0))
        return chosen, weights * self.scaling if self.scaling != 1.0 else weights

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, exact_rows: torch.Tensor | None = None,
                route_input: torch.Tensor | None = None) -> torch.Tensor:
        """residual + moe(x) (moe(x) where residual is None); the router reads `route_input` where given
        (Gemma 4's: the residual normed on its own), else x."""
        chosen, weights = self.route(x if route_input is None else route_input, exact_rows)
        weights = weights.to(x.dtype).flatten()
        pairs = chosen.flatten()
        order = pairs.argsort(stable=True)  # the (token, expert) pairs grouped by expert
        counts = torch.bincount(pairs, minlength=len(self.experts)).tolist()  # one read of the routing per layer
        out = torch.zeros_like(x)  # the experts summed first, then the residual, as HF rounds in bf16
        chosen_experts, picks, start = [], [], 0
        for expert, n in zip(self.experts, counts):
            if n:
                chosen_experts.append(expert)
                picks.append(order[start : start + n])
                start += n
        row_sets = [picked // self.top_k for picked in picks]
        if self._grouped(chosen_experts, exact_rows):  # the chosen experts' products as one native call each
            ys = self._grouped_experts(chosen_experts, [x[rows] for rows in row_sets])
        else:
            ys = [expert(x[rows], None, None if exact_rows is None else exact_rows[rows])
                  for expert, rows in zip(chosen_experts, row_sets)]
        for y, rows, picked in zip(ys, row_sets, picks):
            # (index_put_, not index_add_: the latter's threaded scatter waits ~0.1 ms for cores the native
            # kernels' pool holds, a decode's whole MoE cost again; a token's rows are unique)
            out.index_put_((rows,), y * weights[picked, None], accumulate=True)
        if self.shared is not None:
            shared = self.shared(x, None, exact_rows)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x, exact_rows=exact_rows)) * shared
            out += shared
        if self.all_reduce:  # the experts' partial sums, once for the block (routing is the same on every rank)
            torch.distributed.all_reduce(out)
        return out if residual is None else residual + out
