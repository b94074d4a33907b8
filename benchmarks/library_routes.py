"""The library routes for the CPU decode step (issue 53's point 0), against agentkv's own, in one run:
batch-1 greedy decode of the embedded SmolLM2-135M-Instruct Q4_1 GGUF, each route in a process of its
own, called in turn, best of `--repeats`.

    agentkv          the engine (tiles, one native call a step), tok/s of `Engine.generate` after the
                     prompt is cached: sampling and the scheduler's work included
    torch-int4       the step as one torch module in bf16 (static KV, SDPA), its linears torch's weight-only
                     int4 kernel (`_weight_int4pack_mm_for_cpu`, groups of 32: the file's Q4_1 blocks
                     requantized by their range), the vocabulary weight-only int8 (per row), eager
    torch-int8       the same, every linear `_weight_int8pack_mm` (int8 per row)
    torch-*-compiled the same module compiled by torch.compile with the C++ wrapper (SGLang's and vLLM's
                     CPU pattern)
    ggml             ggml itself (ggml-python, where AGENTKV_GGML_PYTHON names a folder holding it) as the
                     executor of the step: the file's own Q4_1 / Q8_0 tensors, llama.cpp's graph for a
                     Llama layer, one graph per step computed by ggml's CPU threads (benchmarks/ggml_step.py)
    llama.cpp        llama-cpp-python on the same file, where installed (llama_cpp_peer.py)

Each route's greedy tokens are compared with the engine's exact path (`quantized_weights=False`) for
the first tokens: a route that computes another model is not a route. Weight bytes a token are what
each route's step reads of weights.

    python benchmarks/library_routes.py [--new-tokens 64] [--repeats 3] [--routes agentkv,torch-int4,...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import llama_cpp_peer  # noqa: E402
from common import table  # noqa: E402

PROMPT = "Write a short story about a robot learning to paint."
CONTEXT = 256  # the torch routes' static KV length (the prompt and the decoded tokens fit)
CHECKED = 16  # tokens of each route compared with the exact path's greedy tokens

_route = None  # the route of this process: a callable (prompt ids, new tokens) -> (tokens, seconds)


def _prompt_ids() -> list[int]:
    import agentkv as ak
    from agentkv.engine.loader import embedded_model_path

    engine = ak.Engine(str(embedded_model_path()), num_slots=1024, quantized_weights=False)
    ids = engine.tokenizer.encode(engine.render([{"role": "user", "content": PROMPT}]))
    exact = engine.generate([ids], max_tokens=CHECKED, temperature=0.0, ignore_eos=True)[0].token_ids
    return ids, list(exact)


def _start(name: str) -> int:
    """Builds route `name` in this process; returns the weight bytes its step reads."""
    global _route
    if name == "agentkv":
        _route, nbytes = _engine_route()
    elif name.startswith("torch-"):
        _route, nbytes = _torch_route(name.removeprefix("torch-"))
    elif name == "ggml":
        sys.path.insert(0, os.environ["AGENTKV_GGML_PYTHON"])
        import ggml_step

        from agentkv.engine.loader import embedded_model_path

        _route, nbytes = ggml_step.route(embedded_model_path(), CONTEXT, torch.get_num_threads())
    else:
        raise ValueError(f"no route {name!r}")
    return nbytes


def _run(ids: list[int], new_tokens: int) -> tuple[list[int], float]:
    return _route(ids, new_tokens)


def _engine_route():
    import agentkv as ak
    from agentkv.engine.loader import embedded_model_path

    engine = ak.Engine(str(embedded_model_path()), num_slots=1024)

    def run(ids, new_tokens):
        engine.generate([ids], max_tokens=1, temperature=0.0)  # the prompt cached, as the other routes' is
        start = time.perf_counter()
        out = engine.generate([ids], max_tokens=new_tokens, temperature=0.0, ignore_eos=True)[0]
        return list(out.token_ids), time.perf_counter() - start

    return run, engine.stats()["weight_bytes"]


# --- torch's weight-only kernels under torch.compile ---------------------------------------------------


def _int4(w: torch.Tensor):
    """w [in, out] fp32 -> torch's int4 tile layout, groups of 32 along `in` by their range."""
    wt = w.t().contiguous()  # [out, in]
    g = wt.view(wt.shape[0], -1, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).view_as(wt)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    zero = lo + 8 * scale  # torch's groups dequantize as (q - 8) * scale + zero
    sz = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], -1).contiguous()  # [in / 32, out, 2]
    return packed, sz.to(torch.bfloat16), packed.numel() + sz.numel() * 2


def _int8(w: torch.Tensor):
    wt = w.t().contiguous()
    scale = (wt.abs().amax(-1) / 127).clamp(min=1e-12)
    q = (wt / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scale.to(torch.bfloat16), wt.numel() + scale.numel() * 2


class _Linear(torch.nn.Module):
    def __init__(self, w: torch.Tensor, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "int4":
            packed, sz, self.nbytes = _int4(w)
            self.register_buffer("packed", packed)
            self.register_buffer("sz", sz)
        else:
            q, scale, self.nbytes = _int8(w)
            self.register_buffer("q", q)
            self.register_buffer("scale", scale)

    def forward(self, x):
        if self.kind == "int4":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, 32, self.sz)
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scale)


_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class _Step(torch.nn.Module):
    """One decode step of a Llama-family model over a static KV cache (HF's rotate-half rotation), in
    bf16: torch's weight-only kernels are fast for bf16 activations only (fp32 ones take a reference
    path: 0.3 GB/s for int4 here)."""

    def __init__(self, sd: dict, cfg, kind: str):
        super().__init__()
        self.cfg = cfg
        sd = {k: v.to(torch.bfloat16) if v.dim() == 1 or k == "embed_tokens.weight" else v for k, v in sd.items()}
        self.embed = sd["embed_tokens.weight"]
        self.norms = [(sd[f"layers.{i}.input_layernorm.weight"], sd[f"layers.{i}.post_attention_layernorm.weight"])
                      for i in range(cfg.num_layers)]
        self.lins = torch.nn.ModuleList(
            torch.nn.ModuleList(_Linear(sd[f"layers.{i}.{n}.weight"], kind) for n in _LINEARS)
            for i in range(cfg.num_layers))
        self.final_norm = sd["norm.weight"]
        self.head = _Linear(self.embed.t().float(), "int8")  # the vocabulary: Q8_0 in the file, int8 here
        shape = (cfg.num_layers, 1, cfg.num_kv_heads, CONTEXT, cfg.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=torch.bfloat16))
        self.register_buffer("v", torch.zeros(shape, dtype=torch.bfloat16))
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        ang = torch.outer(torch.arange(CONTEXT).float(), inv)
        self.cos, self.sin = (torch.cat([f(ang)] * 2, -1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
        self.nbytes = sum(lin.nbytes for layer in self.lins for lin in layer) + self.head.nbytes

    def _norm(self, x, w):
        f = x.float()
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).to(x.dtype) * w

    def _rot(self, x, pos):
        half = x.shape[-1] // 2
        turned = torch.cat([-x[..., half:], x[..., :half]], -1)
        at = pos.view(1)
        return x * self.cos.index_select(0, at) + turned * self.sin.index_select(0, at)

    def forward(self, token: torch.Tensor, pos: torch.Tensor):
        c = self.cfg
        h = self.embed[token]  # [1, hidden]
        mask = (torch.arange(CONTEXT) <= pos).view(1, 1, 1, CONTEXT)
        for i in range(c.num_layers):
            qkv_l, o_l, gu_l, down_l = self.lins[i]
            qkv = qkv_l(self._norm(h, self.norms[i][0]))
            kv = c.num_kv_heads * c.head_dim
            q, k, v = qkv.split([c.num_heads * c.head_dim, kv, kv], -1)
            q = self._rot(q.view(1, c.num_heads, 1, c.head_dim), pos)
            k = self._rot(k.view(1, c.num_kv_heads, 1, c.head_dim), pos)
            self.k[i].index_copy_(2, pos.view(1), k)
            self.v[i].index_copy_(2, pos.view(1), v.view(1, c.num_kv_heads, 1, c.head_dim))
            att = torch.nn.functional.scaled_dot_product_attention(
                q, self.k[i], self.v[i], attn_mask=mask, enable_gqa=True)
            h = h + o_l(att.reshape(1, -1))
            gate, up = gu_l(self._norm(h, self.norms[i][1])).chunk(2, -1)
            h = h + down_l(torch.nn.functional.silu(gate) * up)
        return self.head(self._norm(h, self.final_norm))


def _torch_route(name: str):
    import torch._inductor.config as inductor

    from agentkv.engine.loader import embedded_model_path, load_model

    kind, _, how = name.partition("-")
    loaded = load_model(embedded_model_path(), quantized=False)
    step = _Step(loaded.model.state_dict(), loaded.config, kind)
    compiled = step
    if how == "compiled":
        inductor.cpp_wrapper = True
        compiled = torch.compile(step, fullgraph=True, dynamic=False)

    @torch.inference_mode()
    def run(ids, new_tokens):
        for p, t in enumerate(ids[:-1]):  # the prompt, one token a step (not timed)
            compiled(torch.tensor([t]), torch.tensor(p))
        tok, out = ids[-1], []
        start = time.perf_counter()
        for p in range(len(ids) - 1, len(ids) - 1 + new_tokens):
            tok = int(compiled(torch.tensor([tok]), torch.tensor(p)).argmax())
            out.append(tok)
        return out, time.perf_counter() - start

    return run, step.nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--routes", default="agentkv,torch-int4,torch-int8,torch-int4-compiled,torch-int8-compiled,ggml")
    args = ap.parse_args()
    names = args.routes.split(",")
    if "ggml" in names and not os.environ.get("AGENTKV_GGML_PYTHON"):
        print("ggml: AGENTKV_GGML_PYTHON names no folder holding ggml-python; skipped")
        names.remove("ggml")
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        ids, exact = pool.submit(_prompt_ids).result()
    pools = {n: ProcessPoolExecutor(1, mp_context=spawn) for n in names}
    nbytes, setup = {}, {}
    for n, p in pools.items():
        started = time.perf_counter()
        nbytes[n] = p.submit(_start, n).result()
        p.submit(_run, ids, 4).result()  # warm up (torch.compile compiles here)
        setup[n] = time.perf_counter() - started
    best = {n: 0.0 for n in names}
    agree = {}
    for _ in range(args.repeats):
        for n, p in pools.items():
            tokens, seconds = p.submit(_run, ids, args.new_tokens).result()
            best[n] = max(best[n], len(tokens) / seconds)
            agree[n] = _leading_same(tokens, exact)
    peer = llama_cpp_peer.call(llama_cpp_peer.decode_rate, str(_model_path()), args.new_tokens, args.repeats,
                               torch.get_num_threads())
    rows = [[n, f"{best[n]:.1f}", f"{best[n] / best['agentkv']:.2f}" if "agentkv" in best else "-",
             f"{nbytes[n] / 2**20:.1f}", f"{nbytes[n] * best[n] / 1e9:.1f}", f"{agree[n]}/{CHECKED}",
             f"{setup[n]:.1f}"] for n in names]
    if peer is not None:
        rows.append(["llama.cpp", f"{peer:.1f}", f"{peer / best['agentkv']:.2f}" if "agentkv" in best else "-",
                     "-", "-", "-", "-"])
    print(f"batch-1 greedy decode, {args.new_tokens} tokens after a {len(ids)}-token prompt, best of {args.repeats}, "
          f"{torch.get_num_threads()} threads")
    print(table(rows, ["route", "tok/s", "x agentkv", "weight MiB", "GB/s", "same tokens", "setup s"]))
    for p in pools.values():
        p.shutdown()


def _leading_same(tokens: list[int], exact: list[int]) -> int:
    """How many of the first tokens equal the exact path's before the first that differs."""
    same = 0
    for a, b in zip(tokens, exact):
        if a != b:
            break
        same += 1
    return same


def _model_path():
    from agentkv.engine.loader import embedded_model_path

    return embedded_model_path()


if __name__ == "__main__":
    main()
