"""GGUF file -> an HF-style directory (config.json, model.safetensors, tokenizer files), cached.

Matrices in Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS, F16 or BF16 are kept as the file holds
them (quant.safetensors: uint8 rows, their types in its metadata), for the CPU's quantized kernels; the
loader decides how each runs (engine/gguf_transcode.py). Every other tensor (the other K-quants and IQ
types, F32, the vectors, whatever the `gguf` package implements) is dequantized to fp32. That and the tokenizer build
take seconds to tens of seconds; the result is written once under the cache directory and every later
start loads it like any HF checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from agentkv.engine import gguf_families, gguf_names, gguf_tokenizer, model_config, rope_config
from agentkv.engine.gguf_families import gguf_family_fields
from agentkv.engine.gguf_names import KEPT_ENDS, hf_name
from agentkv.engine.gguf_tokenizer import tokenizer_files_from_gguf
from agentkv.engine.model_config import ModelConfig, RopeScaling
from agentkv.engine.rope_config import half_split_order, rotated_rows_in_half_split
from agentkv.env import cache_root
from agentkv.errors import ModelLoadError

# quantizations whose matrices are kept as they are (the CPU kernels multiply them in their blocks:
# kernels/cpu_quant.py's QUANT_TYPES); every other tensor is dequantized to fp32 here
KEPT_QUANTS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16", "BF16",
               "MXFP4")
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                      "qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe",  # (Mixtral is "llama" with experts)
                      "gemma2": "gemma2", "gemma3": "gemma3", "smollm3": "smollm3", "granite": "granite",
                      "granitemoe": "granitemoe", "glm4": "glm4", "glm4moe": "glm4_moe", "lfm2": "lfm2",
                      "gpt-oss": "gpt_oss", "deepseek2": "deepseek_v3", "gemma4": "gemma4"}
# llama.cpp's converter permutes these architectures' q/k rows for its adjacent-pair rotation (their
# checkpoints rotate halves); the conversion puts them back
PERMUTED_QK = ("llama", "smollm3", "granite", "granitemoe")


# the modules whose code decides what a conversion writes: their sources name the cached directory, so a
# change to any of them converts a file again (a version number to bump by hand was once forgotten, and a
# stale directory kept serving the old end tokens)
CONVERTER_MODULES = (sys.modules[__name__], gguf_families, gguf_names, gguf_tokenizer, model_config, rope_config)


@functools.cache
def conversion_version() -> str:
    from importlib.metadata import version

    h = hashlib.sha256(f"gguf {version('gguf')}".encode())  # (its dequantization, too, makes the directory)
    for module in CONVERTER_MODULES:
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:16]


def converted_dir(gguf_path: Path) -> Path:
    """The cached HF-style directory for `gguf_path`, converting it on first use."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{conversion_version()}"
    out = cache_root() / "gguf" / (gguf_path.stem + "-" + hashlib.sha256(key.encode()).hexdigest()[:16])
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        _convert(gguf_path, tmp)
        (tmp / SOURCE).write_text(str(gguf_path.resolve()))
        try:
            os.replace(tmp, out)
        except OSError:  # another process converted it first
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_older(out, gguf_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


SOURCE = "source.txt"  # a converted directory's GGUF file (its resolved path)


def _remove_older(out: Path, gguf_path: Path) -> None:
    """The directories earlier conversions of the same file left (an older converter's, or the file's before it
    changed): a conversion holds the file's bytes again, so each would be a copy left on the disk."""
    source = str(gguf_path.resolve())
    for d in out.parent.glob(f"{gguf_path.stem}-*"):
        try:
            if d != out and (d / SOURCE).read_text() == source:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:  # (a directory another process is writing or removing)
            continue


def _convert(path: Path, out: Path) -> None:
    import gguf
    from safetensors.numpy import save_file

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the gguf package raises bare ValueErrors/struct errors on bad files
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    meta = {k: _field_value(f) for k, f in reader.fields.items()}
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path.name}: GGUF architecture {arch!r} is not supported; agentkv implements {sorted(GGUF_ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    # LongRoPE's per-frequency factors (Phi-3 128k, Phi-4-mini) and Gemma 4's full layers' (which pairs rotate)
    # are tensors in a GGUF, not metadata
    factors = {t.name: tuple(float(v) for v in np.asarray(t.data, dtype=np.float32).ravel())
               for t in reader.tensors if t.name.startswith("rope_factors_") or t.name == "rope_freqs.weight"}
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    config = _model_config(meta, arch, names, rope_factors=factors, shapes=shapes)

    tensors: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = {}
    kinds: dict[str, str] = {}
    dequantized: set[str] = set()
    for t in reader.tensors:
        ours = hf_name(t.name, arch)
        if ours is None or t.name.startswith("blk.") and int(t.name.split(".")[1]) >= config.num_layers:
            continue  # e.g. rope_freqs: recomputed from the config; GLM-4.5's multi-token-prediction layers
        kind = t.tensor_type.name
        if kind in KEPT_QUANTS and ours.endswith(KEPT_ENDS):
            # uint8 [(experts,) out, blocks' bytes]: one output's row of blocks a row (F16's values as bytes)
            raw = np.asarray(t.data).view(np.uint8)
            raw = _rows_for_half_split(raw, t.name, arch, config)
            kept[ours], kinds[ours] = np.ascontiguousarray(raw), kind
            continue
        if t.tensor_type.name not in ("F32", "F16", "BF16") and len(t.shape) > 1 and not t.name.endswith(
                ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")):  # (routers run in fp32 by design: no notice)
            dequantized.add(t.tensor_type.name)
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        except NotImplementedError:
            raise ModelLoadError(
                f"{path.name}: tensor {t.name} uses quantization {t.tensor_type.name}, which the installed gguf "
                f"package cannot dequantize; upgrade `gguf` or use a Q4_0/Q4_1/Q8_0/K-quant/F16/BF16/F32 file"
            ) from None
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if arch in ("gemma2", "gemma3") and t.name.endswith("norm.weight"):
            w = w - np.float32(1.0)  # llama.cpp's converter stores their norms with the 1 added; the loader adds it
            # (Gemma 4's norms scale by their weight alone: stored as they are)
        w = _rows_for_half_split(w, t.name, arch, config)
        tensors[ours] = np.ascontiguousarray(w)
    save_file(tensors, str(out / "model.safetensors"))
    if kept:
        save_file(kept, str(out / "quant.safetensors"), metadata={"types": json.dumps(kinds)})
    # the quantizations whose matrices were dequantized (no kernel keeps them): the loader says so
    (out / "dequantized.json").write_text(json.dumps(sorted(dequantized)))
    (out / "config.json").write_text(json.dumps(config.to_hf(), indent=1))

    tokenizer_files_from_gguf(meta, path, out)


def _rows_for_half_split(w: np.ndarray, name: str, arch: str, config: ModelConfig) -> np.ndarray:
    """q and k rows (and biases) in the order the half-split rotation reads: llama.cpp's permutation
    undone, or GLM-4's and DeepSeek-V3's adjacent pairs reordered (as the loader does for their
    checkpoints). Rows move whole, so quantized rows are reordered as they are."""
    if arch == "deepseek2" and name.endswith(("attn_q.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight")):
        q = ".attn_kv_a_mqa." not in name  # (q's heads, or the latent then the shared rotated key part)
        kept = config.qk_nope_head_dim if q else config.kv_lora_rank
        return w[rotated_rows_in_half_split(config.num_heads if q else 1, kept, config.head_dim)]
    if not name.endswith(("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias")):
        return w
    heads = config.num_heads if ".attn_q." in name else config.num_kv_heads
    if arch in PERMUTED_QK and name.endswith(".weight"):
        return _unpermute_qk(w, heads)
    if arch == "glm4":
        order = half_split_order(config.head_dim, config.rotary_dim or config.head_dim)
        return w.reshape(heads, config.head_dim, *w.shape[1:])[:, order].reshape(w.shape)
    return w


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _model_config(meta: dict[str, Any], arch: str, names: set[str], rope_factors: dict | None = None,
                  shapes: dict[str, tuple[int, ...]] | None = None) -> ModelConfig:
    def get(key: str, default: Any = None) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return v

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    scaling = RopeScaling()
    st = meta.get(f"{arch}.rope.scaling.type")
    if st and st != "none":
        if st not in ("linear", "yarn"):
            raise ModelLoadError(f"GGUF rope scaling {st!r} is not supported; agentkv implements linear and yarn")
        scaling = RopeScaling(
            rope_type=st,
            factor=float(get("rope.scaling.factor", 1.0)),
            original_max_position_embeddings=meta.get(f"{arch}.rope.scaling.original_context_length"),
        )
    rope_factors = rope_factors or {}
    if "rope_factors_short.weight" in rope_factors and "rope_factors_long.weight" in rope_factors:
        original = int(get("rope.scaling.original_context_length"))
        attn = meta.get(f"{arch}.rope.scaling.attn_factor")
        scaling = RopeScaling(rope_type="longrope", factor=int(get("context_length")) / original,
                              original_max_position_embeddings=original,
                              short_factor=rope_factors["rope_factors_short.weight"],
                              long_factor=rope_factors["rope_factors_long.weight"],
                              attention_factor=None if attn is None else float(attn))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    rotated = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    family = GGUF_ARCHITECTURES[arch]
    experts = int(meta.get(f"{arch}.expert_count") or 0)
    if experts and family == "llama":
        family = "mixtral"  # llama.cpp writes Mixtral as a llama with experts
    moe = {}
    if experts:
        moe = dict(
            num_experts=experts,
            experts_per_token=int(get("expert_used_count")),
            moe_intermediate_size=int(meta.get(f"{arch}.expert_feed_forward_length") or get("feed_forward_length")),
            # llama.cpp renormalizes the chosen experts' weights for Qwen3-MoE and Mixtral, not Qwen2-MoE
            norm_topk_prob=family != "qwen2_moe",
            shared_expert_intermediate_size=int(meta.get(f"{arch}.expert_shared_feed_forward_length") or 0),
            shared_expert_gated=family == "qwen2_moe",
        )
    window = int(meta.get(f"{arch}.attention.sliding_window") or 0)
    layers = int(get("block_count"))
    fields = dict(
        family=family,
        vocab_size=int(vocab),
        hidden_size=hidden,
        # (per layer where layers differ: Gemma 4's shared layers' twice as wide)
        intermediate_size=int(ff[0] if isinstance(ff := get("feed_forward_length"), (list, tuple)) else ff),
        num_layers=layers,
        num_heads=heads,
        # (per layer where layers differ: LFM2's 0 for its convolution layers)
        num_kv_heads=max(kv) if isinstance(kv := get("attention.head_count_kv", heads), (list, tuple)) else int(kv),
        head_dim=head_dim,
        rotary_dim=rotated if rotated < head_dim else 0,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=family in ("qwen2", "qwen2_moe"),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        rope_scaling=scaling,
        layer_windows=(window,) * layers if window and family in ("phi3", "mixtral") else (),
        **moe,
    )
    fields.update(gguf_family_fields(meta, arch, family, names, fields, shapes or {}, rope_factors))
    return ModelConfig(**fields)


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # an unusual field type must not stop the load; we read only known keys
        return None
