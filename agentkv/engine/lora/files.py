"""LoRA adapters read from their files: PEFT's folder (adapter_config.json + adapter_model.safetensors, or
.bin) and llama.cpp's GGUF adapters (`general.type = adapter`), checked against the model they go on.

What the engine cannot apply exactly is refused with a message saying what to change, never dropped:
`modules_to_save` (whole trained copies of a layer), DoRA, trained biases, embedding or lm_head targets,
the experts of a mixture-of-experts layer, a module of another shape than the base model's.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import torch

from agentkv.engine.lora.adapter import MAX_RANK, MODULES, LoraAdapter, Piece, column_offset, input_size
from agentkv.engine.model_config import ModelConfig
from agentkv.engine.rope import halves_from_pairs
from agentkv.errors import AdapterError

# PEFT's tensor names: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an adapter's own name
# before .weight where it was saved with one)
_PEFT_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")
# llama.cpp's: blk.3.attn_q.weight.lora_a
_GGUF_KEY = re.compile(r"blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")
_GGUF_MODULES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_qkv": "qkv_proj",
                 "attn_output": "o_proj", "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


def load_adapter(name: str, path: str | Path, cfg: ModelConfig) -> LoraAdapter:
    """The adapter at `path` (a PEFT folder or a GGUF LoRA file) for a model of `cfg`."""
    if cfg.kv_lora_rank or cfg.conv_layers or cfg.family == "gemma4":  # (their linears are not the targets served)
        raise AdapterError(f"LoRA adapter {name!r}: adapters on a {cfg.family} model (latent attention, short "
                           f"convolutions, or Gemma 4's layers of several widths) are not served; merge the adapter "
                           f"into the model instead")
    path = Path(path).expanduser()
    if path.is_dir():
        return _peft(name, path, cfg)
    if path.is_file() and path.suffix == ".gguf":
        return _gguf(name, path, cfg)
    raise AdapterError(
        f"LoRA adapter {name!r}: {path} is neither a PEFT adapter folder (adapter_config.json and "
        f"adapter_model.safetensors) nor a .gguf LoRA file; give the folder PEFT's save_pretrained wrote")


def _peft(name: str, path: Path, cfg: ModelConfig) -> LoraAdapter:
    conf_path = path / "adapter_config.json"
    if not conf_path.is_file():
        raise AdapterError(f"LoRA adapter {name!r}: {path} has no adapter_config.json; give the folder PEFT's "
                           f"save_pretrained wrote")
    try:
        conf = json.loads(conf_path.read_text())
    except json.JSONDecodeError as e:
        raise AdapterError(f"LoRA adapter {name!r}: {conf_path} is not JSON ({e})") from None
    if str(conf.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"LoRA adapter {name!r}: peft_type {conf.get('peft_type')!r} is not LoRA; agentkv serves "
                           f"LoRA adapters only")
    refused = {
        "modules_to_save": "whole trained copies of modules (modules_to_save) are not served; train without them "
                           "or merge the adapter into the model",
        "use_dora": "DoRA adapters are not served; use a plain LoRA adapter or merge it into the model",
        "lora_bias": "trained LoRA biases are not served; train with lora_bias=False",
        "layer_replication": "layer_replication is not served",
        "fan_in_fan_out": "fan_in_fan_out (GPT-2's Conv1D layout) is not served on these model families",
    }
    for key, why in refused.items():
        if conf.get(key):
            raise AdapterError(f"LoRA adapter {name!r}: {why} ({key} = {conf[key]!r} in {conf_path})")
    if conf.get("bias", "none") != "none":
        raise AdapterError(f"LoRA adapter {name!r}: trained biases (bias = {conf['bias']!r}) are not served; "
                           f"train with bias='none'")
    tensors = _read_peft_tensors(name, path)
    alpha, rslora = float(conf.get("lora_alpha", conf.get("r", 8))), bool(conf.get("use_rslora"))
    alpha_pattern = conf.get("alpha_pattern") or {}
    modules: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _PEFT_KEY.search(key)
        if m is None or m.group(2) not in MODULES:
            raise AdapterError(f"LoRA adapter {name!r}: tensor {key} is not an update of a layer's attention or MLP "
                               f"linear (q/k/v/o, gate/up/down); embedding, lm_head and expert targets are not served")
        modules.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = t
    scales = {}
    for (layer, module), ab in modules.items():
        rank = ab["A"].shape[0] if "A" in ab else 0
        block = "mlp" if MODULES[module][0] in ("gate_up", "down") else "self_attn"
        full = f"model.layers.{layer}.{block}.{module}"  # (the name PEFT's alpha_pattern is matched against)
        a = next((float(v) for p, v in alpha_pattern.items() if re.match(rf"(.*\.)?{p}$", full)), alpha)
        scales[(layer, module)] = a / math.sqrt(rank) if rslora else a / max(rank, 1)
    return _build(name, str(path), cfg, modules, scales, alpha)


def _read_peft_tensors(name: str, path: Path) -> dict[str, torch.Tensor]:
    st, pt = path / "adapter_model.safetensors", path / "adapter_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file

            return load_file(str(st))
        if pt.is_file():
            return torch.load(str(pt), map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise their own kinds on damaged files
        raise AdapterError(f"LoRA adapter {name!r}: its weights could not be read ({type(e).__name__}: {e}); "
                           f"save the adapter again") from None
    raise AdapterError(f"LoRA adapter {name!r}: {path} has no adapter_model.safetensors (or .bin)")


def _gguf(name: str, path: Path, cfg: ModelConfig) -> LoraAdapter:
    import gguf

    from agentkv.engine.gguf_convert import _field_value, _unpermute_qk

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the gguf package raises bare ValueErrors/struct errors on bad files
        raise AdapterError(f"LoRA adapter {name!r}: {path} is not a readable GGUF file ({type(e).__name__}: {e})") \
            from None
    meta = {k: _field_value(f) for k, f in reader.fields.items()}
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise AdapterError(f"LoRA adapter {name!r}: {path.name} is not a GGUF LoRA adapter (general.type = "
                           f"{meta.get('general.type')!r}, adapter.type = {meta.get('adapter.type')!r}); make one with "
                           f"llama.cpp's convert_lora_to_gguf.py")
    arch = meta.get("general.architecture")
    alpha = float(meta.get("adapter.lora.alpha", 0.0))
    modules: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for t in reader.tensors:
        m = _GGUF_KEY.match(t.name)
        if m is None or m.group(2) not in _GGUF_MODULES:
            raise AdapterError(f"LoRA adapter {name!r}: tensor {t.name} is not an update of a layer's attention or "
                               f"MLP linear; embedding, output and expert targets are not served")
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        module = _GGUF_MODULES[m.group(2)]
        if m.group(3) == "b" and arch == "llama" and module in ("q_proj", "k_proj"):
            # llama.cpp's converter permuted B's rows as it permutes q and k; the base loaded here is HF's order
            w = _unpermute_qk(w, cfg.num_heads if module == "q_proj" else cfg.num_kv_heads)
        modules.setdefault((int(m.group(1)), module), {})[m.group(3).upper()] = torch.from_numpy(np.array(w))
    # llama.cpp scales by alpha / rank (an alpha of 0: no scaling)
    scales = {k: (alpha / ab["A"].shape[0] if alpha and "A" in ab else 1.0) for k, ab in modules.items()}
    return _build(name, str(path), cfg, modules, scales, alpha)


def _build(name: str, source: str, cfg: ModelConfig, modules: dict[tuple[int, str], dict[str, torch.Tensor]],
           scales: dict[tuple[int, str], float], alpha: float) -> LoraAdapter:
    """Pieces from each (layer, module)'s A [rank, in] and B [out, rank], checked against `cfg`."""
    if not modules:
        raise AdapterError(f"LoRA adapter {name!r} ({source}) holds no LoRA tensors")
    layers: list[dict[str, list[Piece]]] = [{} for _ in range(cfg.num_layers)]
    rank = 0
    for (layer, module), ab in sorted(modules.items()):
        where = f"LoRA adapter {name!r}: layer {layer}'s {module}"
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{where} has lora_{'A' if 'A' not in ab else 'B'} missing; save the adapter again")
        if layer >= cfg.num_layers:
            raise AdapterError(f"{where}: the model has {cfg.num_layers} layers; this adapter is for another model")
        target, part = MODULES[module]
        if target in ("gate_up", "down") and cfg.is_moe_layer(layer):
            raise AdapterError(f"{where}: layer {layer}'s MLP is a mixture of experts, whose updates are not served; "
                               f"target attention modules only on this model")
        # kept in bf16 where the file holds both so (exact), else fp32
        dtype = torch.bfloat16 if ab["A"].dtype == ab["B"].dtype == torch.bfloat16 else torch.float32
        a, b = ab["A"].to(dtype), ab["B"].to(dtype)
        n0, n = column_offset(cfg, target, part)
        k = input_size(cfg, target)
        if a.dim() != 2 or b.dim() != 2 or a.shape != (a.shape[0], k) or b.shape != (n, a.shape[0]):
            raise AdapterError(f"{where} has A {tuple(a.shape)} and B {tuple(b.shape)}, where this model needs "
                               f"A [rank, {k}] and B [{n}, rank]; this adapter is for another model")
        if cfg.rope_interleaved and module in ("q_proj", "k_proj"):  # as the loader reorders the base's rows
            b = halves_from_pairs(b, cfg.num_heads if module == "q_proj" else cfg.num_kv_heads, cfg)
        if a.shape[0] > MAX_RANK:
            raise AdapterError(f"{where} has rank {a.shape[0]}; ranks up to {MAX_RANK} are served")
        rank = max(rank, a.shape[0])
        layers[layer].setdefault(target, []).append(Piece(a.contiguous(), b.t().contiguous(), n0,
                                                          float(scales[(layer, module)])))
    for layer in layers:
        for pieces in layer.values():
            pieces.sort(key=lambda p: p.n0)
    return LoraAdapter(name, source, layers, rank, alpha)
