"""Frozen configuration for each layer of the engine, passed down explicitly.

`CacheConfig`, `SchedulerConfig` and `EngineConfig` describe how the engine serves a model; the
network itself is `ModelConfig` (engine/model_config.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from agentkv.errors import RequestError


@dataclass(frozen=True)
class CacheConfig:
    """KV memory: how many token slots, how much of them pins may hold, and the disk tier under them."""

    num_slots: int | None = None  # None: sized from `memory_fraction` of the memory there is
    # the share of memory the KV pool may take, SGLang's mem-fraction: on a GPU of its total memory
    # less what the weights and everything else already hold; on the CPU of the RAM available after
    # loading (pages no request touched cost nothing). None: 0.85 on a GPU, 0.2 on the CPU
    memory_fraction: float | None = None
    max_running_requests: int = 64
    pin_budget_fraction: float = 0.5
    enable_radix_cache: bool = True
    # a disk tier under the radix tree (engine/disk/): KV evicted from the pool or pinned is kept in files
    # under kv_dir within kv_disk_bytes, read back instead of recomputed, and found again after a restart
    kv_dir: str | None = None
    kv_disk_bytes: int = 10 * 2**30
    kv_block_tokens: int = 16  # tokens a disk block holds (a prefix is read back in whole blocks)
    # at close (Engine.close, `agentkv serve` stopped by SIGTERM / SIGINT) the pool's prefixes are written to
    # the tier, the most recently used first, for at most this long; 0 writes only what was queued
    kv_flush_timeout: float = 5.0
    # at start, the tier's most recently used prefixes are read back into at most this share of the pool,
    # in the background (a restarted server's first request finds its system prompt resident)
    kv_warm_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.kv_dir is not None and not self.enable_radix_cache:
            raise RequestError("kv_dir keeps the radix cache's KV on disk; leave enable_radix_cache on or kv_dir unset")
        if self.kv_disk_bytes < 0:
            raise RequestError(f"kv_disk_bytes must be at least 0, got {self.kv_disk_bytes}")
        if not self.kv_flush_timeout >= 0:
            raise RequestError(f"kv_flush_timeout must be at least 0 seconds, got {self.kv_flush_timeout}")
        if not 0.0 <= self.kv_warm_fraction <= 1.0:
            raise RequestError(f"kv_warm_fraction must be in [0, 1], got {self.kv_warm_fraction}")
        if self.kv_block_tokens < 1:
            raise RequestError(f"kv_block_tokens must be at least 1, got {self.kv_block_tokens}")
        if not 0.0 <= self.pin_budget_fraction <= 1.0:
            raise RequestError(f"pin_budget_fraction must be in [0, 1], got {self.pin_budget_fraction}")
        if self.num_slots is not None and self.num_slots < 16:
            raise RequestError(f"num_slots must be at least 16, got {self.num_slots}")
        if self.memory_fraction is not None and not 0.0 < self.memory_fraction < 1.0:
            raise RequestError(f"memory_fraction must be in (0, 1), got {self.memory_fraction}")


@dataclass(frozen=True)
class SchedulerConfig:
    """How each step's batch is built."""

    max_step_tokens: int = 2048  # chunked prefill: at most this many new tokens per forward pass
    lpm_max_queue: int = 128  # longest-prefix-match ordering up to this many waiting requests, FCFS past it
    dedup_min_tokens: int = 32  # in-batch prefix dedup: defer requests sharing this many uncached tokens
    new_token_ratio: float = 0.4  # share of max_tokens reserved for running requests at admission
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    max_tokens_clip: int = 4096  # reservations count at most this many future tokens per request
    # speculative decoding (engine/speculative.py): "ngram" drafts from the request's own tokens, None off
    speculative: str | None = None
    speculative_tokens: int = 8  # the longest draft a request gets

    def __post_init__(self) -> None:
        if self.speculative not in (None, "ngram"):
            raise RequestError(f"speculative={self.speculative!r} is not one of None, 'ngram'")
        if self.speculative_tokens < 1:
            raise RequestError(f"speculative_tokens must be at least 1, got {self.speculative_tokens}")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # "torch", "cpu", "triton", "flashinfer", or "auto": triton on a CUDA GPU, cpu (agentkv's C kernel)
    # on CPU where the native kernels are on, torch elsewhere
    attention_backend: str = "auto"
    # agentkv's C kernels on CPU: linears, attention, norms, activation, rotation (kernels/cpu_native.py);
    # None: on where they build (float32, bfloat16), True: required, False: torch ops only
    native_kernels: bool | None = None
    # prepare the next pass while one runs (a forward worker thread); None: on for CUDA devices, where
    # the host work hides behind the GPU's, off on CPU, where the two compete for the same cores
    overlap_schedule: bool | None = None
    # replay decode passes from CUDA graphs captured at bucketed batch sizes (1, 2, 4, 8, 16, 32, ...,
    # cuda_graph_max_batch); None: on for CUDA devices when the attention backend can be captured (triton)
    cuda_graphs: bool | None = None
    cuda_graph_max_batch: int = 64
    # decode passes as one native call (engine/native_step.py): None: on where the model qualifies (a
    # dense Llama-family GGUF kept in quantized tiles on CPU), True: required, False: off
    native_step: bool | None = None
    # a GGUF's quantized matrices kept in their blocks and multiplied there (CPU, native
    # kernels); False dequantizes them at load as other quantizations are
    quantized_weights: bool = True
    # the norms, the gated MLP's activation and the rotation as fused Triton kernels on a CUDA GPU
    # (kernels/triton_fused.py: one kernel each where torch's eager ops take five or six; on CPU only
    # interpreted, for the tests); off until a GPU run has checked them compiled
    fused_ops: bool = False
    # "auto": the checkpoint's weights; "dummy": random weights drawn on the device from config.json alone
    # (engine/dummy_weights.py), for measuring a full-size model whose checkpoint is not at hand
    load_format: str = "auto"
    # the KV pool's dtype ("float32", "bfloat16", "float16"); None: the model's dtype. bfloat16 under float32
    # activations on CPU halves the pool's memory and what each step's attention reads (docs/cpu.md)
    kv_dtype: str | None = None
    tensor_parallel: int = 1  # ranks that each hold 1/N of every layer (worker processes; gloo on CPU, NCCL on CUDA)
    # the tool-call format (agentkv/chat/formats: "hermes", "llama3_json", "mistral", "mistral_args", "pythonic",
    # "qwen3_xml", "glm"); None: detected from the chat template and special tokens
    tool_format: str | None = None
    # a Jinja chat template (its text, or the path of a .jinja file) used instead of the model's own (a
    # GGUF may carry none); None: the model's
    chat_template: str | None = None
    # LoRA adapters loaded at start, {name: a PEFT adapter folder or a GGUF LoRA file} (engine/lora/), held as
    # (name, path) pairs; more at run time with Engine.load_lora. max_loras: the most loaded at once
    lora: Any = ()
    max_loras: int = 8
    # the exact path's precision for a prompt's rows over a GGUF's tiled weights on CPU: "float32" (exact, the
    # default), or "bfloat16" (an opt-in where the CPU has AVX512_BF16: x and the weights rounded to bf16, fp32
    # sums, twice the products an instruction; docs/cpu.md)
    prompt_precision: str = "float32"

    def __post_init__(self) -> None:
        lora = self.lora.items() if isinstance(self.lora, dict) else self.lora or ()
        try:
            pairs = tuple((str(n), str(p)) for n, p in lora)
        except (TypeError, ValueError):
            raise RequestError(f"lora={self.lora!r} is invalid: give {{name: adapter folder or .gguf file}}") from None
        object.__setattr__(self, "lora", pairs)
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise RequestError(f"max_loras must be an integer of at least 1, got {self.max_loras!r}")
        if len(pairs) > self.max_loras:
            raise RequestError(f"{len(pairs)} LoRA adapters given but max_loras is {self.max_loras}; raise max_loras")
        if pairs and self.tensor_parallel > 1:
            raise RequestError("LoRA adapters do not work with tensor_parallel > 1 yet; use one rank")
        if self.prompt_precision not in ("float32", "bfloat16"):
            raise RequestError(f"prompt_precision={self.prompt_precision!r} is not one of 'float32', 'bfloat16'")
        if self.prompt_precision == "bfloat16" and self.tensor_parallel > 1:
            raise RequestError("prompt_precision='bfloat16' is not taken with tensor_parallel > 1 yet; leave it unset")
        if self.tensor_parallel < 1:
            raise RequestError(f"tensor_parallel must be at least 1, got {self.tensor_parallel}")
        if self.cuda_graphs and self.tensor_parallel > 1:
            raise RequestError("cuda_graphs are not supported with tensor_parallel > 1 yet; leave cuda_graphs unset")
        if self.cuda_graphs and not self.device.startswith("cuda"):
            raise RequestError(f"cuda_graphs=True needs a CUDA device, not {self.device!r}; leave cuda_graphs unset")
        if self.kv_dtype not in (None, "float32", "bfloat16", "float16"):
            raise RequestError(f"kv_dtype={self.kv_dtype!r} is not one of 'float32', 'bfloat16', 'float16' (or None: "
                               "the model's dtype)")
        if self.cache.kv_dir is not None and self.tensor_parallel > 1:
            raise RequestError("kv_dir does not work with tensor_parallel > 1 yet (each rank holds a share of the "
                               "KV); leave kv_dir unset or use one rank")
        if self.cuda_graph_max_batch < 1:
            raise RequestError(f"cuda_graph_max_batch must be at least 1, got {self.cuda_graph_max_batch}")
        if self.load_format not in ("auto", "dummy"):
            raise RequestError(f"load_format={self.load_format!r} is not one of 'auto', 'dummy'")
        if self.load_format == "dummy" and (self.tensor_parallel > 1 or self.cache.kv_dir is not None):
            # (a disk tier would file random weights' KV under the checkpoint's fingerprint)
            raise RequestError("load_format='dummy' (random weights) runs on one rank and without kv_dir; "
                               "leave tensor_parallel and kv_dir unset")
    context_length: int | None = None  # None: the model's max_position_embeddings
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 0


def resolve_device(device: str, dtype: str) -> tuple[str, str]:
    """`device="auto"`: CUDA where torch sees a GPU, else the CPU; `dtype="auto"`: bfloat16 on CUDA,
    float32 on the CPU (where fp32 is what every CPU runs at full speed)."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise RequestError(f"dtype={dtype!r} is not one of 'auto', 'float32', 'bfloat16', 'float16'")
    return device, dtype


def build_config(model: str | None, device: str, dtype: str, overrides: dict[str, Any]) -> EngineConfig:
    """Sort keyword overrides into the engine, cache and scheduler configs by field name."""
    groups = {
        "engine": {f.name for f in dataclasses.fields(EngineConfig)}
        - {"cache", "scheduler", "model", "device", "dtype"},
        "cache": {f.name for f in dataclasses.fields(CacheConfig)},
        "scheduler": {f.name for f in dataclasses.fields(SchedulerConfig)},
    }
    unknown = set(overrides) - set().union(*groups.values())
    if unknown:
        raise RequestError(
            f"unknown Engine option(s) {sorted(unknown)}; known: {sorted(set().union(*groups.values()))}")
    pick = lambda g: {k: v for k, v in overrides.items() if k in groups[g]}
    return EngineConfig(
        model=model, device=device, dtype=dtype,
        cache=CacheConfig(**pick("cache")), scheduler=SchedulerConfig(**pick("scheduler")), **pick("engine"),
    )
