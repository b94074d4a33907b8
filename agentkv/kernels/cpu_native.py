"""agentkv's CPU kernels (`csrc/*.c`): compiled on first use with the machine's C compiler, loaded with ctypes.

On CPU a small model's decode step is made of about 2,000 small torch ops, and past the linears their
per-op cost is most of the step: an RMSNorm is 8 ops in bf16, attention a gather of each request's
K/V into a padded copy and then SDPA. These kernels do each element-wise step of a layer in one call,
attention straight from the paged pool (`cpu_backend.py`), and the linears on weights packed for them
(`csrc/cpu_linear.c`, which streams each weight while it computes; oneDNN's kernels wait on memory).

The library is built with `-O3 -march=native` (the CPU it runs on; AGENTKV_CPU_ARCH names another)
and OpenMP linked against the runtime torch has loaded, so both share one thread pool (two pools on
the same cores slow each other). It is cached in `$AGENTKV_CACHE_DIR/kernels/` (default
`~/.cache/agentkv`) under a key of the sources, the compiler and the CPU: the first `Engine()` on a
machine compiles them (about 4 s here), later ones load the file. Without a C compiler, or with
`AGENTKV_NATIVE_KERNELS=0`, `load()` returns None and the engine runs its torch ops.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import logging
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from agentkv import native_build
from agentkv.env import cpu_arch, native_kernels_allowed
from agentkv.errors import EngineError, RequestError
from agentkv.kernels.cpu_quant import _DTYPES, QuantKernels

log = logging.getLogger(__name__)

_CSRC = Path(__file__).resolve().parent / "csrc"
_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {  # name: (argument types, result type)
    "agentkv_attention": ([_INT, _INT, _P, _I64, _P, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _P, _I64, _I64, _P,
                           _I64, _INT, _INT, _INT, _F, _P, _I64, _F, _P, _INT, _INT], _INT),
    "agentkv_rms_norm": ([_INT, _P, _I64, _I64, _P, _I64, _I64, _F, _P, _INT, _INT], None),
    "agentkv_glu_mul": ([_INT, _INT, _F, _F, _P, _I64, _I64, _I64, _P, _INT, _INT], None),
    "agentkv_moe_route": ([_P, _I64, _I64, _I64, _INT, _F, _P, _P], None),
    "agentkv_moe_route_groups": ([_P, _P, _I64, _I64, _I64, _I64, _I64, _INT, _F, _P, _P], _INT),
    "agentkv_rope": ([_INT, _P, _I64, _I64, _I64, _I64, _I64, _P, _P, _P, _INT, _INT], None),
    "agentkv_linear": ([_INT, _P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _INT], None),
    "agentkv_linear_available": ([_INT], _INT),
    "agentkv_qlinear": ([_INT, _INT, _P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _INT, _INT], _INT),
    "agentkv_qlinear_fast": ([], _INT),
    "agentkv_qdequant": ([_INT, _INT, _P, _I64, _I64, _P, _I64, _P, _I64, _INT], _INT),
    "agentkv_qtile_pack": ([_INT, _P, _I64, _I64, _P, _INT], _INT),
    "agentkv_qtile_fast": ([], _INT),
    "agentkv_qtile_block_bytes": ([_INT], _I64),
    "agentkv_qtile_linear": ([_INT, _INT, _P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _INT, _INT], _INT),
    "agentkv_qtile_grouped": ([_INT, _INT, _I64, _P, _P, _I64, _I64, _P, _I64, _P, _P, _I64, _INT, _INT], _INT),
    "agentkv_qtile_dequant": ([_INT, _INT, _P, _I64, _I64, _P, _I64, _P, _I64, _INT], _INT),
    "agentkv_qtile_exact": ([_INT, _INT, _P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _INT, _INT], _INT),
    "agentkv_qtile_exact_bf16": ([], _INT),
    "agentkv_qtile_logits": ([_INT, _P, _I64, _I64, _I64, _P, _I64, _INT, _P, _I64, _INT, _INT], _INT),
    "agentkv_decode_step": ([_P, _I64, _P, _P, _P, _P, _I64, _I64, _P, _P, _I64, _P, _P, _INT, _INT, _P], _INT),
    "agentkv_qtile_rescore": ([_INT, _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _P, _INT], _INT),
    "agentkv_fma_peak": ([_INT, _I64, _P], ctypes.c_double),
    "agentkv_pool_threads": ([_INT], _INT),
    "agentkv_pool_test_job": ([_INT, _INT, _INT], _INT),
    "agentkv_pool_reset": ([], None),
    "agentkv_mask_logits": ([_P, _I64, _I64, _I64, _P, _I64, _I64, _P, _P, _P, _INT], None),
    "agentkv_lora_apply": ([_P, _I64, _I64, _I64, _P, _I64, _I64, _P, _P, _I64, _I64, _INT, _INT, _INT], _INT),
    "agentkv_attention_heads_per_task": ([_INT], _INT),
    "agentkv_attention_max_queries": ([], _INT),
    "agentkv_attention_max_head_dim": ([], _INT),
}


@dataclass(frozen=True)
class PackedLinear:
    """A weight packed by `NativeKernels.pack_linear`."""

    data: torch.Tensor  # bf16 [out/16, in/2, 16, 2], fp32 [out/16, in, 16]
    in_features: int
    out_features: int


class NativeKernels(QuantKernels):
    """The loaded library. Each method takes CPU tensors of one dtype (float32 or bfloat16) whose
    innermost dimension is contiguous; `handles` says whether a tensor qualifies. `generic=True`
    runs the plain-C bodies where the CPU has AVX-512 bodies too (the tests check both)."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        for name, (args, result) in _SIGNATURES.items():
            fn = getattr(lib, name, None)  # agentkv_linear is built only where the CPU has AVX-512
            if fn is not None:
                fn.argtypes, fn.restype = args, result
        self.max_queries = lib.agentkv_attention_max_queries()  # query vectors per attention task
        self.max_head_dim = lib.agentkv_attention_max_head_dim()
        # the dtypes csrc/cpu_linear.c multiplies on this CPU: float32 with AVX-512, bfloat16 with AVX512_BF16
        self.linear_dtypes = {dt for dt, bf in _DTYPES.items() if lib.agentkv_linear_available(bf)}
        self.qlinear_fast = bool(lib.agentkv_qlinear_fast())  # int8 dot products (AVX2) for quantized weights
        # the tiled kernels' SIMD bodies (AVX-512 VNNI, or AVX2): where they are, every kept GGUF type is repacked
        # in tiles at load
        self.qtile_fast = bool(lib.agentkv_qtile_fast())
        # csrc/cpu_tgemm.c's bf16 body for a prompt's exact rows (AVX512_BF16): an opt-in, with_exact_bf16
        self.exact_bf16_available = bool(lib.agentkv_qtile_exact_bf16())

    def with_exact_bf16(self) -> NativeKernels:
        """These kernels with a prompt's exact rows through the bf16 body (an engine's own copy: the library
        is shared by every engine of the process)."""
        if not self.exact_bf16_available:
            raise RequestError("prompt_precision='bfloat16' needs a CPU with AVX512_BF16 (its bf16 body); leave "
                               "prompt_precision unset (float32)")
        view = copy.copy(self)
        view.exact_bf16 = True
        return view

    @staticmethod
    def handles(t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.dtype in _DTYPES

    def heads_per_task(self, group: int) -> int:
        """Of the `group` query heads sharing a KV head, how many one attention task takes."""
        return self._lib.agentkv_attention_heads_per_task(group)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, generic: bool = False) -> torch.Tensor:
        """RMSNorm over the last dim of x [T, n] or [T, heads, n] (heads contiguous); a new tensor."""
        n = x.shape[-1]
        heads = x.shape[1] if x.dim() == 3 else 1
        assert x.stride(-1) == 1 and (heads == 1 or x.stride(1) == n) and weight.dtype == x.dtype
        out = torch.empty(x.shape, dtype=x.dtype)
        self._lib.agentkv_rms_norm(_DTYPES[x.dtype], x.data_ptr(), x.stride(0), heads, weight.data_ptr(),
                                   x.shape[0], n, eps, out.data_ptr(), torch.get_num_threads(), generic)
        return out

    def glu_mul(self, gate_up: torch.Tensor, gelu: bool = False, generic: bool = False,
                clamp: tuple[float, float] | None = None) -> torch.Tensor:
        """silu(gate) * up, or (`gelu`) GELU's tanh form, or (`clamp`: limit, alpha) gpt-oss's clamped SwiGLU,
        for gate_up [T, 2n] holding the two halves side by side: [T, n]."""
        rows, n = gate_up.shape[0], gate_up.shape[1] // 2
        assert gate_up.stride(-1) == 1
        out = torch.empty(rows, n, dtype=gate_up.dtype)
        limit, alpha = clamp or (0.0, 1.0)
        self._lib.agentkv_glu_mul(_DTYPES[gate_up.dtype], int(gelu), limit, alpha, gate_up.data_ptr(),
                                  gate_up.stride(0), rows, n, out.data_ptr(), torch.get_num_threads(), generic)
        return out

    def moe_route(self, logits: torch.Tensor, k: int, norm: bool, scaling: float = 1.0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's k experts [T, k] (int64, descending) and weights [T, k] (fp32) from router logits [T, E]
        (fp32): their softmax over all, or (`norm`) over the k alone, times `scaling` (csrc/cpu_moe.c; the
        native step routes with the same body)."""
        logits = logits.float().contiguous()
        T, E = logits.shape
        idx = torch.empty(T, k, dtype=torch.int64)
        w = torch.empty(T, k, dtype=torch.float32)
        self._lib.agentkv_moe_route(logits.data_ptr(), T, E, k, int(norm), scaling, idx.data_ptr(), w.data_ptr())
        return idx, w

    def moe_route_groups(self, logits: torch.Tensor, bias: torch.Tensor, k: int, groups: int, chosen: int,
                         norm: bool, scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V3's routing (GLM-4.5's): sigmoid scores, experts chosen by score + `bias` among the
        `chosen` best of `groups` groups (a group's worth: its two best), weighed by their scores
        (renormalized where `norm`), times `scaling`: experts [T, k] and weights [T, k] (csrc/cpu_moe.c)."""
        logits, bias = logits.float().contiguous(), bias.float().contiguous()
        T, E = logits.shape
        idx = torch.empty(T, k, dtype=torch.int64)
        w = torch.empty(T, k, dtype=torch.float32)
        if self._lib.agentkv_moe_route_groups(logits.data_ptr(), bias.data_ptr(), T, E, k, groups, chosen, int(norm),
                                              scaling, idx.data_ptr(), w.data_ptr()):
            raise ValueError(f"{groups} expert groups (of which {chosen} chosen) do not divide {E} experts in groups "
                             "of two or more, or are over 256")
        return idx, w

    def rope_(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              generic: bool = False, rot: int | None = None) -> torch.Tensor:
        """Rotates the first `rot` dims (all: None) of each head of x [T, heads, D] in place (heads
        contiguous) by the fp32 tables cos/sin [P, D] at `positions` [T] (int64); returns x."""
        T, heads, D = x.shape
        rot = D if rot is None else rot
        assert x.stride(2) == 1 and x.stride(1) == D and positions.dtype == torch.int64 and rot % 2 == 0 and rot <= D
        assert cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
        self._lib.agentkv_rope(_DTYPES[x.dtype], x.data_ptr(), x.stride(0), T, heads, D, rot, positions.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), torch.get_num_threads(), generic)
        return x

    def pack_linear(self, weight: torch.Tensor) -> PackedLinear:
        """W [in, out] in the layout of csrc/cpu_linear.c, out padded to 16 columns with zeros: bf16
        [out/16][in/2][16][2] (`in` even), fp32 [out/16][in][16]. For dtypes in `linear_dtypes`."""
        k, n = weight.shape
        assert weight.dtype in self.linear_dtypes and (weight.dtype != torch.bfloat16 or k % 2 == 0)
        blocks = -(-n // 16)
        padded = torch.zeros(k, blocks * 16, dtype=weight.dtype)
        padded[:, :n] = weight
        if weight.dtype == torch.bfloat16:
            data = padded.view(k // 2, 2, blocks, 16).permute(2, 0, 3, 1)
        else:
            data = padded.view(k, blocks, 16).permute(1, 0, 2)
        return PackedLinear(data.contiguous(), k, n)

    def linear(self, x: torch.Tensor, w: PackedLinear, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] @ W (+ bias [out]) (+ residual [M, out]) -> [M, out], all of W's dtype."""
        dt = w.data.dtype
        assert x.dtype == dt and x.stride(-1) == 1 and x.shape[1] == w.in_features
        out = torch.empty(x.shape[0], w.out_features, dtype=dt)
        r_ld = 0
        if residual is not None:
            assert residual.dtype == dt and residual.stride(-1) == 1
            r_ld = residual.stride(0)
        self._lib.agentkv_linear(
            _DTYPES[dt], x.data_ptr(), x.stride(0), x.shape[0], w.in_features, w.data.data_ptr(), w.out_features,
            None if bias is None else bias.data_ptr(), None if residual is None else residual.data_ptr(), r_ld,
            out.data_ptr(), w.out_features, torch.get_num_threads(),
        )
        return out

    def lora_apply(self, x: torch.Tensor, y: torch.Tensor, row_adapter: torch.Tensor, adapters, layer: int,
                   target: int, generic: bool = False) -> None:
        """In place: y [M, N] += each row's LoRA update of linear `target` (csrc/cpu_lora.h's order) of
        `layer`, from x [M, K] (fp32): row m's adapter is adapters[row_adapter[m]] (a ctypes array of
        csrc/cpu_lora.h's LoraAdapter; a negative index: none)."""
        assert x.dtype == y.dtype == torch.float32 and x.stride(-1) == 1 and y.stride(-1) == 1
        assert row_adapter.dtype == torch.int64 and row_adapter.is_contiguous() and len(row_adapter) == x.shape[0]
        bad = self._lib.agentkv_lora_apply(x.data_ptr(), x.stride(0), x.shape[1], x.shape[0], y.data_ptr(),
                                           y.stride(0), y.shape[1], row_adapter.data_ptr(), ctypes.addressof(adapters),
                                           len(adapters), layer, target, torch.get_num_threads(), generic)
        if bad:
            raise EngineError("a LoRA update's adapter index, rank or columns are out of range (an engine bug)")

    def fma_peak(self, threads: int | None = None) -> float:
        """The cores' fp32 fused multiply-add FLOPs a second (csrc/cpu_peak.c: independent chains of
        FMAs on registers, `threads` of them, torch's count by default), the best of 10 runs of ~50 ms
        (on a shared host a run can lose a core for a while): the bound a product's FLOPs a second is
        read against."""
        threads = threads or torch.get_num_threads()
        sink = (ctypes.c_float * 1)()
        self._lib.agentkv_fma_peak(threads, 1000, sink)
        best = 0.0
        for _ in range(10):
            start = time.perf_counter()
            flops = self._lib.agentkv_fma_peak(threads, 8_000_000, sink)
            best = max(best, flops / (time.perf_counter() - start))
        return best

    def mask_logits(self, logits: torch.Tensor, bitmask: torch.Tensor,
                    k: int, generic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """In place: fp32 `logits` [n, V] get -inf where the grammar's `bitmask` [n, ceil(V / 32)] (int32)
        disallows the token. Returns alive [n] bool (the row allows a token), and the k best allowed
        tokens' ids [n, k] int64 and logits [n, k], by logit descending, ties to the lower id (-1 and -inf
        where fewer are allowed above -inf): token_mask.apply_token_bitmask and a topk, in one C call."""
        n, V = logits.shape
        assert logits.dtype == torch.float32 and logits.stride(1) == 1 and bitmask.dtype == torch.int32
        bitmask = bitmask.contiguous()
        assert bitmask.shape[0] == n and bitmask.shape[1] * 32 >= V
        ids, vals = torch.empty(n, k, dtype=torch.int64), torch.empty(n, k)
        alive = torch.empty(n, dtype=torch.bool)
        self._lib.agentkv_mask_logits(logits.data_ptr(), logits.stride(0), n, V, bitmask.data_ptr(), bitmask.shape[1],
                                      k, ids.data_ptr(), vals.data_ptr(), alive.data_ptr(), generic)
        return alive, ids, vals

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, out_loc: torch.Tensor, table: torch.Tensor, tiles: torch.Tensor,
                  scale: float, out: torch.Tensor, generic: bool = False, window: int = 0,
                  softcap: float = 0.0, sinks: torch.Tensor | None = None) -> None:
        """Writes k, v [T, KVH, D] to the caches at `out_loc` [T], then fills out [T, H, D] at the
        tokens of `tiles` [n, 5] (first token, tokens, table row, keys of the first token, 1 for a
        prompt's tokens): see
        csrc/cpu_attention_tasks.c. `generic` runs the plain-C path on CPUs with AVX-512 too (tests);
        `window` > 0 is sliding-window attention; `softcap` > 0 caps the scores (Gemma 2); `sinks` [H]
        fp32: each head's learned logit in its softmax's sum (gpt-oss)."""
        T, H, D = q.shape
        kvh = k.shape[1]
        for t in (q, k, v):
            assert t.stride(2) == 1 and t.stride(1) == D and t.dtype == q.dtype
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and out.is_contiguous()
        assert k_cache.dtype == v_cache.dtype and k_cache.dtype in _DTYPES  # (16-bit KV under fp32 activations too)
        assert table.dtype == out_loc.dtype == tiles.dtype == torch.int64 and tiles.is_contiguous()
        assert tiles.dim() == 2 and tiles.shape[1] == 5
        assert table.is_contiguous() and out_loc.is_contiguous() and k_cache.shape == v_cache.shape
        assert sinks is None or (sinks.dtype == torch.float32 and sinks.is_contiguous() and sinks.shape == (H,))
        bad = self._lib.agentkv_attention(
            _DTYPES[q.dtype], _DTYPES[k_cache.dtype], q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0),
            v.data_ptr(), v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], out_loc.data_ptr(),
            T, table.data_ptr(), table.shape[0], table.shape[1], tiles.data_ptr(), tiles.shape[0], H, kvh, D, scale,
            out.data_ptr(), window, softcap, None if sinks is None else sinks.data_ptr(), torch.get_num_threads(),
            generic,
        )
        if bad:  # the kernel checks every index before it writes or reads through one
            if bad == 4:
                raise EngineError("native attention ran out of memory for its parts' results")
            what = {1: "a new token's slot", 2: "a tile", 3: "a slot in the table"}[bad]
            raise EngineError(f"native attention refused the pass: {what} is out of bounds (an engine bug; "
                              "attention_backend='torch' serves meanwhile)")


def for_engine(option: bool | None, device: str, dtype: str) -> NativeKernels | None:
    """The kernels an engine uses: `option` None takes them where they apply (CPU, float32 or
    bfloat16) and build; True requires them; False turns them off."""
    if option is False:
        return None
    applies = torch.device(device).type == "cpu" and dtype in ("float32", "bfloat16")
    kernels = load() if applies else None
    if option and kernels is None:
        why = unavailable_reason() if applies else f"they run on CPU in float32 or bfloat16, not {device} {dtype}"
        raise RequestError(f"native_kernels=True, but agentkv's native CPU kernels are unavailable: {why}; "
                           "leave native_kernels unset to use torch ops where they are")
    return kernels


def load() -> NativeKernels | None:
    """The kernels, built or taken from the cache; None when they are turned off or cannot be built
    (`unavailable_reason()` says why)."""
    return _load()[0]


def unavailable_reason() -> str:
    return _load()[1]


@functools.cache
def _load() -> tuple[NativeKernels | None, str]:
    if not native_kernels_allowed():
        return None, "AGENTKV_NATIVE_KERNELS=0 turned the native CPU kernels off"
    try:
        return NativeKernels(ctypes.CDLL(str(_library()))), ""
    except (OSError, RuntimeError) as e:
        log.warning("agentkv: native CPU kernels unavailable, using torch ops (%s)", e)
        return None, str(e)


def _library() -> Path:
    omp = _loaded_openmp()
    # OpenMP from the runtime this process already holds (torch's), found by path and linked by it
    link = ([str(omp), f"-Wl,-rpath,{omp.parent}"] if omp is not None else []) + ["-pthread"]  # (csrc/cpu_pool.c)
    openmp = ["-fopenmp"] if omp is not None else []
    # a call of a function with no prototype would pass its float arguments as doubles
    strict = ["-Werror=implicit-function-declaration"]
    return native_build.build("kernels", "agentkv-cpu", sorted(_CSRC.glob("*.c")),
                              flags=[*strict, *openmp, f"-march={_march()}"], fallback_flags=[*strict, *openmp],
                              link=link, key=[_cpu_signature()])


def _march() -> str:
    """The CPU the kernels are built for: this one, or AGENTKV_CPU_ARCH (e.g. "haswell": the AVX2
    bodies, which the tests check on any x86 host)."""
    return cpu_arch()


def _loaded_openmp() -> Path | None:
    """The OpenMP runtime mapped into this process (torch's libgomp or libiomp5), Linux only."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"(/\S*/lib(?:gomp|iomp5|omp)[^/\s]*\.so[^/\s]*)$", maps, re.M)
    return Path(found.group(1)) if found else None


def _cpu_signature() -> bytes:
    """What -march=native compiles for: the CPU's feature flags where Linux lists them."""
    try:
        flags = re.search(r"^(flags|Features)\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
        if flags:
            return flags.group(2).encode()
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}".encode()
