"""The linear layers: weights stored input-major ([in, out]), packed for the CPU kernels that run them.

A plain matmul on input-major weights streams them with every core at batch 1, where MKL's gemv on
HF's [out, in] uses one. In fp32 on CPU they are then packed for oneDNN, which is faster again for the
2-16 row matmuls of batched decode; with agentkv's C kernels (kernels/cpu_native.py) they are packed
for csrc/cpu_linear.c instead, or kept in a GGUF's quantized blocks (csrc/cpu_quant.c).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from agentkv.kernels.cpu_native import NativeKernels, PackedLinear
from agentkv.kernels.cpu_quant import ROW_MAJOR_TYPES, TILED_TYPES, QuantWeight


def _can_pack(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


def _pack(weight_out_in: torch.Tensor) -> torch.Tensor:
    # oneDNN's blocked layout, tuned for up to 16 rows (decode batches); any row count works
    return torch.ops.mkldnn._reorder_linear_weight(weight_out_in.contiguous(), 16)


def _native_linear(native: NativeKernels | None, weight: torch.Tensor) -> bool:
    """Whether `weight` [in, out] goes to agentkv's linear kernel (see Linear)."""
    return (native is not None and weight.dtype in native.linear_dtypes and weight.device.type == "cpu"
            and (weight.dtype != torch.bfloat16 or weight.shape[0] % 2 == 0))


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: take no extra copies
        return 0


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   add: torch.Tensor | None) -> torch.Tensor:
    if add is not None:  # the residual added in the same kernel
        return torch.ops.mkldnn._linear_pointwise.binary(x.contiguous(), add, packed, bias, "add")
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class Linear(nn.Module):
    """y = x @ weight (+ bias) (+ residual), weight [in_features, out_features].

    The residual (`forward(x, residual)`) is added in the matmul's own kernel: one op less per
    layer and linear, which is what a small model's decode step is made of on CPU.

    `pack()` (after loading, fp32 on CPU) moves the weight into oneDNN's blocked layout. Measured
    here for [T, 576] x [576, 3072]: 0.30 / 0.44 / 0.68 ms at T = 1 / 5 / 16 packed, against
    0.34 / 0.89 / 1.02 ms for a plain matmul (10% slower than plain for 300-row prefill chunks);
    the 30 layers' linears at 16 rows 36.7-38.2 ms packed against 47.7-48.3 plain.

    A single row (batch-1 decode) only streams the weight, and there oneDNN reads it at about the
    speed of one core: the 30 layers' linears take 24.9-25.0 ms packed against 18.1-18.2 ms for a
    plain `x @ weight` (MKL's gemv on the input-major weight, both cores). `pack(keep_plain=True)`
    keeps the plain weight for that case, a second copy of it.

    With agentkv's C kernels (`pack(native=...)`, fp32 on AVX-512, bf16 on AVX512_BF16) the weight is
    packed for csrc/cpu_linear.c instead, its only copy, which streams it at decode's 1-16 rows while
    it computes. Measured on AMD Zen 4 with weights out of cache as in a step (`benchmarks/cpu_kernels.py`),
    the 30 layers' linears at 1 / 16 rows: bf16 5.5 / 10.8 ms against 10.4 / 14.9 for oneDNN packed;
    fp32 9.1 / 20.2 ms against 17.3 / 24.3 (25.0 for the plain gemv at one row). At 550 rows
    (prefill) both within 4% of oneDNN (bf16 287 against 276 ms, fp32 568 against 548).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None = None
        self.native: NativeKernels | None = None  # with native_weight: the C kernel
        self.native_weight: PackedLinear | None = None
        self.quantized: QuantWeight | None = None  # a GGUF's quantized blocks (kernels/cpu_quant.py)
        self.all_reduce = False  # tensor parallelism: a row-parallel shard whose outputs are partial sums

    def set_quantized(self, weight: QuantWeight) -> None:
        """Keep the weight in its quantized blocks (its only copy); `pack(native=...)` must follow."""
        self.weight, self.quantized = None, weight

    def pack(self, keep_plain: bool = False, native: NativeKernels | None = None) -> None:
        if self.quantized is not None:
            assert native is not None, "quantized weights are kept only where the native kernels run"
            self.native = native
            self.quantized = tiled(native, self.quantized)
        elif self.native_weight is None and _native_linear(native, self.weight):
            self.native, self.native_weight = native, native.pack_linear(self.weight.data)
            self.weight = None
        elif self.packed is None and self.native_weight is None and _can_pack(self.weight):
            self.packed = _pack(self.weight.data.t())
            # bf16: oneDNN's packed kernel reads the weight at full speed at one row too (the 30
            # layers' linears 10.8 ms against 16.0 for F.linear), so no plain copy is worth keeping
            if not keep_plain or self.weight.dtype != torch.float32:
                self.weight = None  # only the packed copy is kept

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                exact_rows: torch.Tensor | None = None) -> torch.Tensor:
        """`exact_rows` (bool [T], None: none): the rows a tiled quantized weight computes with x in
        fp32 (a prompt's tokens) rather than as int8 blocks (see by_row_kind)."""
        # a row-parallel shard's output is a partial sum: the residual is added once, after the all-reduce
        add = None if self.all_reduce else residual
        if self.quantized is not None:
            y = by_row_kind(
                lambda exact, xs, adds: self.native.qlinear(xs, self.quantized, self.bias, adds, exact=exact), x, add,
                exact_rows if self.quantized.tiled else None)
        elif self.native_weight is not None:
            y = self.native.linear(x, self.native_weight, self.bias, add)
        elif self.packed is not None and (self.weight is None or x.shape[0] > 1):
            y = _packed_linear(x, self.packed, self.bias, add)
        else:
            base = self.bias if add is None else add if self.bias is None else add + self.bias
            y = x @ self.weight if base is None else torch.addmm(base, x, self.weight)
        if self.all_reduce:
            torch.distributed.all_reduce(y)
            if residual is not None:
                y = y + residual
        return y


def by_row_kind(run, x: torch.Tensor, add: torch.Tensor | None, exact_rows: torch.Tensor | None) -> torch.Tensor:
    """run(exact, x rows, their `add` rows) over the rows of x by kind: `exact_rows` (a prompt's tokens)
    with exact=True, the others (tokens the model wrote: decodes, jump-forward's, drafts) with
    exact=False. A written token's numbers then never depend on what else its pass holds (the int8
    kernel computes each row alone), so batching and speculation leave outputs as they are. A
    prompt's rows keep x in fp32 (against the weights dequantized a panel at a time, csrc/cpu_tgemm.c,
    whose sums are in one order whatever the pass's rows): with them as
    int8 blocks too, the embedded model's greedy replies of 48 tokens left the exact path's on 5 of 6
    prompts (one at its first token), against 2 of 6 this way. A reply's tokens cached as int8 K/V and
    read back in a later prompt keep them; recomputed after an eviction, they are a prompt's."""
    if exact_rows is None or not bool(exact_rows.any()):
        return run(False, x, add)
    if bool(exact_rows.all()):
        return run(True, x, add)
    exact = exact_rows.nonzero().squeeze(1)
    written = (~exact_rows).nonzero().squeeze(1)
    parts = []
    for flag, rows in ((True, exact), (False, written)):
        parts.append((rows, run(flag, x[rows], None if add is None else add[rows])))
    y = torch.empty(x.shape[0], parts[0][1].shape[1], dtype=parts[0][1].dtype)
    for rows, part in parts:
        y[rows] = part
    return y


def tiled(native: NativeKernels, w: QuantWeight) -> QuantWeight:
    """`w` in tiles of 16 rows (csrc/cpu_tiles.c) where the CPU has the tiled kernels' body and the type
    is one they take; else `w` as it is (the row-major kernels of csrc/cpu_quant.c)."""
    types = {p.qtype for p in w.parts or (w,)}
    if native.qtile_fast and types <= TILED_TYPES and not w.tiled:
        return native.tile(w)
    assert w.tiled or types <= ROW_MAJOR_TYPES, "the loader keeps only the types the kernels here take"
    return w


class LogitsProjection(nn.Module):
    """The vocabulary projection: `weight` [vocab, hidden] is the embedding table when tied, so the
    packed copy is the only extra memory. Measured here for [T, 576] x [576, 49152]: 4.1 / 10.5 ms at
    T = 1 / 16 packed, against 8.0 / 21 ms for F.linear."""

    def __init__(self, weight: torch.Tensor | QuantWeight, native: NativeKernels | None = None):
        super().__init__()
        self.weight = weight
        self.native, self.native_weight, self.packed = native, None, None
        # the last forward's input rows where its logits were the int8 projection's (None: exact):
        # the best tokens a grammar allows are re-scored from them (ModelRunner.exact_logits)
        self.approx_rows: torch.Tensor | None = None
        if isinstance(weight, QuantWeight):  # a GGUF's quantized table: multiplied in its blocks
            pass
        elif _native_linear(native, weight.t()):  # see Linear
            self.native_weight = native.pack_linear(weight.t())
        elif _can_pack(weight):
            self.packed = _pack(weight)

    def forward(self, x: torch.Tensor, exact_rows: torch.Tensor | None = None) -> torch.Tensor:
        """`exact_rows` (bool [rows of x]): rows whose every logit is exact (a prompt's last token);
        the others of a tiled weight go through the int8 projection (see by_row_kind)."""
        quant = isinstance(self.weight, QuantWeight)
        self.approx_rows = None
        if quant and self.weight.tiled and x.dtype == torch.float32:
            # int8 activations for every logit, then each row's top ones re-scored with x in fp32:
            # the argmax of 49k logits is decided by margins that int8 activations erase (SmolLM2's
            # first answer token flips from "The" to "L" with them alone)
            self.approx_rows = x.contiguous()
            return by_row_kind(
                lambda exact, xs, _: (
                    self.native.qlinear(xs, self.weight, exact=True)
                    if exact
                    else self.native.qlogits(xs.contiguous(), self.weight)
                ),
                self.approx_rows,
                None,
                exact_rows,
            )
        if quant:  # x kept in fp32 for every logit (see above)
            return self.native.qlinear(x.contiguous(), self.weight, exact=True)
        if self.native_weight is not None:
            return self.native.linear(x.contiguous(), self.native_weight)
        if self.packed is not None:
            return _packed_linear(x, self.packed, None, None)
        return F.linear(x, self.weight)


class QuantEmbedding(nn.Module):
    """An embedding table kept in a GGUF's quantized blocks: a lookup dequantizes the rows it reads."""

    def __init__(self, weight: QuantWeight):
        super().__init__()
        self.weight = weight
        self.native: NativeKernels | None = None  # set by CausalLM.finalize
        self.register_buffer("dtype_of_model", torch.empty(0), persistent=False)  # cast with the model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.native.qdequant(self.weight, ids, self.dtype_of_model.dtype)
