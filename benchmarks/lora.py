"""Many LoRA adapters on one engine against the base model alone, on the embedded SmolLM2-135M (Q4_1).

Adapters: random PEFT adapters of rank `--rank` on every linear of every layer (q, k, v, o, gate, up, down),
in `--dtype` (bf16, as adapters trained in bf16 are saved, or fp32), written to a temporary folder as PEFT
saves them (adapter_config.json + adapter_model.safetensors); the engine keeps the file's dtype.

1. Agent sessions at batch 16: `--sessions` sessions of engine_agents.py's agent (an ~800-token system prompt
   with tools, its own task, then follow-ups), `--turns` turns of `--new-tokens` greedy tokens, each turn's
   requests submitted together, on the base model or spread over `--adapters` adapters (session i on adapter
   i mod N: each pass mixes them). Two workloads: one system prompt for every session (the base's sessions
   share its KV; the adapters' cannot: each adapter holds its own copy, and each decode step's attention reads
   them all), and a system prompt per adapter, as per-product fine-tunes have (session i on prompt i mod N,
   the same length; the base serving the same sessions holds as many copies). Each adapter run is compared
   with the base on the same prompts. "warm": each model's system prompts prefilled first (a server's steady
   state); "cold": from an empty cache. Runs alternate, best of `--repeats`.
2. Batch-1 decode: a short prompt, `--decode-tokens` greedy tokens, with an adapter and without, alternating,
   best of `--decode-repeats`.

Prints tokens/s, the ratios, each adapter's memory, and how many decode passes went through the native step.

    python benchmarks/lora.py [--adapters 8] [--sessions 16] [--turns 3] [--new-tokens 48] [--rank 16]
                              [--decode-tokens 256] [--repeats 3] [--decode-repeats 7] [--skip-sessions]
                              [--dtype bfloat16|float32] [--kv-dtype bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table
from engine_agents import FOLLOW_UPS, TASKS, system_prompt

import agentkv as ak
from agentkv.engine.model_config import ModelConfig

MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_random_adapter(cfg: ModelConfig, out: Path, rank: int, seed: int, dtype: torch.dtype) -> Path:
    """A PEFT adapter folder for a model of `cfg`: A ~ N(0, 1/in), B small (the outputs stay near the base's)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {"q_proj": (cfg.hidden_size, q), "k_proj": (cfg.hidden_size, kv), "v_proj": (cfg.hidden_size, kv),
              "o_proj": (q, cfg.hidden_size), "gate_proj": (cfg.hidden_size, cfg.intermediate_size),
              "up_proj": (cfg.hidden_size, cfg.intermediate_size), "down_proj": (cfg.intermediate_size,
                                                                                cfg.hidden_size)}
    tensors = {}
    for layer in range(cfg.num_layers):
        for block, modules in MODULES.items():
            for m in modules:
                k, n = shapes[m]
                key = f"base_model.model.model.layers.{layer}.{block}.{m}"
                tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, k, generator=g) / k**0.5).to(dtype)
                tensors[f"{key}.lora_B.weight"] = (torch.randn(n, rank, generator=g) * 0.01).to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": [m for ms in MODULES.values() for m in ms]}))
    return out


def system(variant: int | None) -> str:
    """The agents' system prompt; `variant`: one of the control's (another first token, the same length)."""
    return system_prompt() if variant is None else f"Team {chr(65 + variant)}. " + system_prompt()[8:]


def sessions(engine: ak.Engine, adapters: list[str | None], turns: int, new_tokens: int,
             variants: list[int | None]) -> tuple[float, int]:
    """Each session on its adapter (None: the base) and system prompt, every turn's requests at once; wall
    time, tokens made."""
    convs = [[{"role": "system", "content": system(v)}, {"role": "user", "content": TASKS[i % len(TASKS)]}]
             for i, v in enumerate(variants)]

    async def turn(t: int) -> int:
        outs = await asyncio.gather(*(
            engine.agenerate(engine.render(c), max_tokens=new_tokens, temperature=0.0, ignore_eos=True, adapter=a)
            for c, a in zip(convs, adapters)))
        for c, o in zip(convs, outs):
            c.append({"role": "assistant", "content": o.text})
            c.append({"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]})
        return sum(len(o.token_ids) for o in outs)

    start, made = time.perf_counter(), 0
    for t in range(turns):
        made += asyncio.run(turn(t))
    return time.perf_counter() - start, made


def decode(engine: ak.Engine, adapter: str | None, n: int) -> float:
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    engine.generate(prompt, max_tokens=1, adapter=adapter)  # its prompt cached: the time is the decodes'
    start = time.perf_counter()
    out = engine.generate(prompt, max_tokens=n, temperature=0.0, ignore_eos=True, adapter=adapter)
    return len(out.token_ids) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--decode-repeats", type=int, default=7, help="batch-1 decode runs of each, alternating")
    ap.add_argument("--skip-sessions", action="store_true", help="the batch-1 decode rows only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--kv-dtype", choices=["bfloat16", "float32"], default=None,
                    help="the KV pool's dtype (default: the engine's, fp32 on CPU)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    options = {"kv_dtype": args.kv_dtype} if args.kv_dtype else {}
    with tempfile.TemporaryDirectory() as tmp, ak.Engine(max_loras=args.adapters, **options) as engine:
        names = [f"lora{i}" for i in range(args.adapters)]
        for i, name in enumerate(names):
            engine.load_lora(name, write_random_adapter(engine.model_config, Path(tmp) / name, args.rank, i, dtype))
        infos = engine.loras()
        engine.generate("warm up", max_tokens=2)
        n = args.sessions
        own = [i % args.adapters for i in range(n)]
        mixed = [names[i % len(names)] for i in range(n)]
        runs = {"1 system prompt, base": ([None] * n, [None] * n),  # label: (adapters, prompts), its base
                f"1 system prompt, {args.adapters} adapters": (mixed, [None] * n),
                f"{args.adapters} system prompts, base": ([None] * n, own),
                f"{args.adapters} system prompts, {args.adapters} adapters": (mixed, own)}
        base_of = {label: label.split(",")[0] + ", base" for label in runs}
        step = engine._core.runner.native_step
        rows, best = [], {}
        for kind in ("cold", "warm") if not args.skip_sessions else ():
            for _ in range(args.repeats):
                for label, (who, variants) in runs.items():
                    engine.flush_cache()
                    if kind == "warm":
                        for a, v in set(zip(who, variants)):
                            engine.prefill(engine.render([{"role": "system", "content": system(v)}],
                                                         add_generation_prompt=False), adapter=a)
                    calls = step.calls if step is not None else 0
                    wall, made = sessions(engine, who, args.turns, args.new_tokens, variants)
                    native = (step.calls - calls) if step is not None else 0
                    key = (kind, label)
                    if key not in best or made / wall > best[key][0]:
                        best[key] = (made / wall, wall, made, native)
            for label in runs:
                tps, wall, made, native = best[(kind, label)]
                rows.append([f"{n} sessions, {kind}, {label}", wall, made, tps, native,
                             tps / best[(kind, base_of[label])][0]])
        decodes = {"base": [], "lora": []}
        for _ in range(args.decode_repeats):
            decodes["base"].append(decode(engine, None, args.decode_tokens))
            decodes["lora"].append(decode(engine, names[0], args.decode_tokens))
        base_tps = max(decodes["base"])
        rows.append(["batch-1 decode, base", "", args.decode_tokens, base_tps, "", 1.0])
        rows.append(["batch-1 decode, adapter", "", args.decode_tokens, max(decodes["lora"]), "",
                     max(decodes["lora"]) / base_tps])
    print(f"SmolLM2-135M-Instruct Q4_1 (embedded), {torch.get_num_threads()} threads; adapters of rank {args.rank} "
          f"on q/k/v/o/gate/up/down of all {engine.model_config.num_layers} layers, A and B in {args.dtype}; "
          f"KV in {args.kv_dtype or 'float32'}; "
          f"{args.turns} turns x {args.new_tokens} greedy tokens a session; best of {args.repeats}")
    print(table(rows, ["run", "wall s", "tokens", "tok/s", "native passes", "vs base"]))
    print("memory per adapter: " + ", ".join(f"{i.name} {i.nbytes / 2**20:.2f} MiB" for i in infos[:1])
          + f" (each of the {len(infos)} the same shape); the model's weights "
          f"{engine._core.runner.model.weight_bytes() / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
