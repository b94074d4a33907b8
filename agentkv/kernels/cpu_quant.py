"""Weights kept in GGUF's quantized blocks on CPU: `QuantWeight`, and the methods of `NativeKernels`
(cpu_native.py) that multiply them: the row-major kernels (csrc/cpu_quant.c), the tiles of 16 rows
(csrc/cpu_tiles.c: int8 rows, the vocabulary with its re-score; csrc/cpu_tgemm.c: exact rows) and the
native decode step (csrc/cpu_step.c). See docs/cpu.md."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from agentkv.errors import EngineError

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the kernels' `bf` flag

# GGUF quantizations the C kernels multiply in their blocks: name -> (its type code, weights a block, bytes a
# block); the K-quants' blocks are super-blocks of 256. The row-major kernels (csrc/cpu_quant.c) take
# the first five, the tiles all (engine/gguf_transcode.py decides which blocks a matrix runs in).
QUANT_TYPES = {"Q8_0": (0, 32, 34), "Q4_0": (1, 32, 18), "Q4_1": (2, 32, 20), "Q4_K": (3, 256, 144),
               "Q6_K": (4, 256, 210), "Q5_0": (5, 32, 22), "Q5_1": (6, 32, 24), "IQ4_NL": (7, 32, 18),
               "Q5_K": (8, 256, 176), "IQ4_XS": (9, 256, 136),
               "F16": (10, 32, 64), "BF16": (11, 32, 64),  # (the float types taken as blocks of 32 values)
               "MXFP4": (12, 32, 18)}  # (as IQ4_NL's blocks: the file's 17 bytes rewritten, gguf_transcode.mxfp4_held)
ROW_MAJOR_TYPES = frozenset((0, 1, 2, 3, 4))
QLINEAR_MAX_ROWS = 16  # rows the kernel takes at once
QLINEAR_DEQUANT_MAX = 1 << 24  # weights up to this many elements are dequantized whole for a long input
# a larger weight, for an input of this many rows or more, is dequantized this many elements at a time
# (slices of its output rows) and multiplied by torch: 512 rows of a 11264 x 2048 weight took 92-97 ms
# so against 178 (Q4_1) and 439 (Q4_K) through the kernel 16 rows at a time (benchmarks/cpu_kernels.py)
QLINEAR_SLICED_MIN_ROWS = 64
# the types csrc/cpu_tiles.c (and cpu_ktiles.c: the K-quants) repack into tiles of 16 rows, and a tile's rows
TILED_TYPES = frozenset(code for code, _, _ in QUANT_TYPES.values())
TILE_ROWS = 16
# logits of each row re-scored exactly after the int8 vocabulary projection (agentkv_qtile_logits)
RESCORE_TOP = 32


@dataclass
class QuantWeight:
    """A weight [out, in] in GGUF's blocks: `data` uint8 [out, in / 32 * bytes a block] (a K-quant's
    blocks: 256 weights), row-major as the file holds it, or (`tiled`) the same blocks repacked in tiles of
    16 rows (csrc/cpu_tiles.c: [ceil(out / 16), in / weights a block, a tile's block]).

    Or (`parts`, `qtype` -1) the stack along out of weights of different types (a Q4_K_M file's q and k in
    Q4_K beside a v in Q6_K): `data` holds their bytes one after the other, the parts view it."""

    data: torch.Tensor
    qtype: int
    in_features: int
    out_features: int
    tiled: bool = False
    parts: tuple[QuantWeight, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @staticmethod
    def stacked(parts: list[QuantWeight]) -> QuantWeight:
        """`parts` (the same in_features, all tiled or none) as one weight, in one buffer."""
        assert len({p.in_features for p in parts}) == 1 and len({p.tiled for p in parts}) == 1
        data = torch.cat([p.data.reshape(-1) for p in parts])
        views, at = [], 0
        for p in parts:
            views.append(QuantWeight(data[at : at + p.data.numel()].view(p.data.shape), p.qtype, p.in_features,
                                     p.out_features, p.tiled))
            at += p.data.numel()
        return QuantWeight(data, -1, parts[0].in_features, sum(p.out_features for p in parts), parts[0].tiled,
                           tuple(views))


class QuantKernels:
    """NativeKernels' quantized-weight methods (`self._lib` is the loaded library). `exact_bf16`: a prompt's
    exact rows through csrc/cpu_tgemm.c's bf16 body (x and the weights rounded to bf16, fp32 sums; the engine's
    prompt_precision="bfloat16", an opt-in: NativeKernels.with_exact_bf16)."""

    exact_bf16 = False

    def qlinear(self, x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, exact: bool = False, generic: bool = False) -> torch.Tensor:
        """x [M, K] @ W^T (+ bias) (+ residual) for W in quantized blocks.

        A tiled weight (csrc/cpu_tiles.c) takes any number of rows, x quantized to int8 per block as
        llama.cpp does (`generic`: its plain-C body): each row is computed as it would be alone, so a
        token's numbers never depend on what else its pass holds (a prompt, a batch, a draft); `exact`
        rows (a prompt's) keep x in fp32, multiplied by the weights dequantized a panel at a time
        (csrc/cpu_tgemm.c: any number of rows, the weights read once a pass). A row-major weight
        (csrc/cpu_quant.c) takes up to 16 rows in its kernel (x as int8 too, unless `exact` or the CPU
        lacks AVX2). Otherwise the weight is dequantized, whole where it is small, else a slice of its
        rows at a time (for 64 rows of x and more), and multiplied by torch in x's dtype; 17-63 rows of
        a large row-major weight go through its kernel 16 at a time."""
        M = x.shape[0]
        if M == 0:  # (a pass that selects no row's logits)
            return torch.empty(0, w.out_features, dtype=x.dtype)
        if w.parts:  # each part into its columns
            out, at = torch.empty(M, w.out_features, dtype=x.dtype), 0
            for p in w.parts:
                cols = slice(at, at + p.out_features)
                out[:, cols] = self.qlinear(x, p, None if bias is None else bias[cols],
                                            None if residual is None else residual[:, cols], exact, generic)
                at += p.out_features
            return out
        if w.tiled or M <= QLINEAR_MAX_ROWS:
            return self._qkernel(x, w, bias, residual, exact, generic)
        if w.out_features * w.in_features <= QLINEAR_DEQUANT_MAX:
            full = self.qdequant(w, None, x.dtype)
            base = bias if residual is None else residual if bias is None else residual + bias
            return x @ full.t() if base is None else torch.addmm(base, x, full.t())
        if M >= QLINEAR_SLICED_MIN_ROWS:
            out = torch.empty(M, w.out_features, dtype=x.dtype)
            step = max(1, QLINEAR_DEQUANT_MAX // w.in_features)
            for n in range(0, w.out_features, step):
                cols = slice(n, min(n + step, w.out_features))
                y = x @ self.qdequant(w, torch.arange(cols.start, cols.stop), x.dtype).t()
                if bias is not None:
                    y += bias[cols]
                if residual is not None:
                    y += residual[:, cols]
                out[:, cols] = y
            return out
        return torch.cat(
            [
                self._qkernel(x[i : i + QLINEAR_MAX_ROWS], w, bias,
                              None if residual is None else residual[i : i + QLINEAR_MAX_ROWS], exact, generic)
                for i in range(0, M, QLINEAR_MAX_ROWS)
            ]
        )

    def _qkernel(self, x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None, residual: torch.Tensor | None,
                 exact: bool, generic: bool) -> torch.Tensor:
        M = x.shape[0]
        assert x.stride(-1) == 1 and (residual is None or (residual.stride(-1) == 1 and residual.dtype == x.dtype))
        out = torch.empty(M, w.out_features, dtype=x.dtype)
        args = (x.data_ptr(), x.stride(0), M, w.in_features, w.data.data_ptr(), w.out_features,
                None if bias is None else bias.data_ptr(), None if residual is None else residual.data_ptr(),
                0 if residual is None else residual.stride(0), out.data_ptr(), out.stride(0), torch.get_num_threads())
        if w.tiled:
            fn = self._lib.agentkv_qtile_exact if exact else self._lib.agentkv_qtile_linear
            bad = fn(w.qtype, _DTYPES[x.dtype], *args, int(generic) | (2 if exact and self.exact_bf16 else 0))
        else:
            bad = self._lib.agentkv_qlinear(w.qtype, _DTYPES[x.dtype], *args, exact)
        if bad:
            raise EngineError(f"quantized linear refused its inputs ({bad}); an engine bug")
        return out

    def qlinear_grouped(self, xs: list[torch.Tensor], ws: list[QuantWeight],
                        biases: list[torch.Tensor | None], generic: bool = False) -> list[torch.Tensor]:
        """[x @ W^T (+ bias) for each (x, W, bias)] of tiled weights of one type and shape (one part each),
        in one call (csrc/cpu_tgroup.c): each row what `qlinear` gives it, the products' tiles one run for
        the threads (a mixture of experts' chosen experts)."""
        w0, x0 = ws[0], xs[0]
        assert all(w.tiled and not w.parts and w.qtype == w0.qtype and w.out_features == w0.out_features
                   and w.in_features == w0.in_features for w in ws)
        xs = [x.contiguous() for x in xs]
        assert all(x.dtype == x0.dtype and x.shape[1] == w0.in_features for x in xs)
        outs = [torch.empty(x.shape[0], w0.out_features, dtype=x0.dtype) for x in xs]
        n = len(xs)
        ptrs = (ctypes.c_void_p * n)
        bad = self._lib.agentkv_qtile_grouped(
            w0.qtype, _DTYPES[x0.dtype], n, ptrs(*(x.data_ptr() for x in xs)),
            (ctypes.c_int64 * n)(*(x.shape[0] for x in xs)), w0.in_features, w0.in_features,
            ptrs(*(w.data.data_ptr() for w in ws)), w0.out_features,
            ptrs(*(None if b is None else b.data_ptr() for b in biases)), ptrs(*(o.data_ptr() for o in outs)),
            w0.out_features, torch.get_num_threads(), int(generic))
        if bad:
            raise EngineError(f"grouped quantized linear refused its inputs ({bad}); an engine bug")
        return outs

    def qdequant(self, w: QuantWeight, rows: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Rows `rows` (int64 [n]; all when None) of a quantized weight as a [n, K] tensor of `dtype`."""
        if w.parts:
            assert rows is None, "a stack of parts is a linear's weight, not a table whose rows are looked up"
            return torch.cat([self.qdequant(p, None, dtype) for p in w.parts])
        n = w.out_features if rows is None else rows.shape[0]
        out = torch.empty(n, w.in_features, dtype=dtype)
        if rows is not None:
            rows = rows.contiguous()
        fn = self._lib.agentkv_qtile_dequant if w.tiled else self._lib.agentkv_qdequant
        bad = fn(w.qtype, _DTYPES[dtype], w.data.data_ptr(), w.out_features, w.in_features,
                 None if rows is None else rows.data_ptr(), n, out.data_ptr(), out.stride(0), torch.get_num_threads())
        if bad:
            raise EngineError(f"dequantizing rows failed ({bad}): a row index out of range")
        return out

    def tile(self, w: QuantWeight) -> QuantWeight:
        """`w`'s blocks repacked in tiles of 16 rows (csrc/cpu_tiles.c, cpu_ktiles.c): the same bytes, but
        Q4_K's 6-bit scales a byte each (the last tile's rows past `out_features` are zero blocks); a stack's
        parts each in tiles of its own."""
        if w.parts:
            return QuantWeight.stacked([self.tile(p) for p in w.parts])
        assert w.qtype in TILED_TYPES and not w.tiled
        tiles = -(-w.out_features // TILE_ROWS)
        per_block = next(v[1] for v in QUANT_TYPES.values() if v[0] == w.qtype)
        out = torch.empty(tiles, w.in_features // per_block, self._lib.agentkv_qtile_block_bytes(w.qtype),
                          dtype=torch.uint8)
        bad = self._lib.agentkv_qtile_pack(
            w.qtype, w.data.data_ptr(), w.out_features, w.in_features, out.data_ptr(), torch.get_num_threads())
        if bad:
            raise EngineError(f"repacking a quantized weight refused its shape {w.out_features} x {w.in_features}")
        return QuantWeight(out, w.qtype, w.in_features, w.out_features, tiled=True)

    def qlogits(
        self, x: torch.Tensor, w: QuantWeight, rescore: int = RESCORE_TOP, generic: bool = False) -> torch.Tensor:
        """Logits [M, out] (fp32) of x [M, in] (fp32) against a tiled W: every logit through the int8
        product, then each row's `rescore` largest computed exactly (x in fp32 against the dequantized
        row), so the greedy token and the top log-probabilities are the exact ones."""
        assert w.tiled and x.dtype == torch.float32 and x.stride(-1) == 1
        out = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
        if x.shape[0] == 0:  # (a pass that selects no row's logits)
            return out
        bad = self._lib.agentkv_qtile_logits(w.qtype, x.data_ptr(), x.stride(0), x.shape[0], w.in_features,
                                             w.data.data_ptr(), w.out_features, rescore, out.data_ptr(), out.stride(0),
                                             torch.get_num_threads(), generic)
        if bad:
            raise EngineError(f"the vocabulary projection refused its inputs ({bad}); an engine bug")
        return out

    def qrescore(self, w: QuantWeight, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The exact logits [n, R] of tokens `ids` [n, R] (int64; -1: none, its entry -inf) for x [n, K]
        (fp32) against a tiled W: x in fp32 against each dequantized row, as qlogits re-scores."""
        assert w.tiled and x.dtype == torch.float32 and x.stride(-1) == 1 and ids.dtype == torch.int64
        ids = ids.contiguous()
        out = torch.full(ids.shape, float("-inf"))
        bad = self._lib.agentkv_qtile_rescore(w.qtype, w.data.data_ptr(), w.out_features, w.in_features, x.data_ptr(),
                                              x.stride(0), ids.shape[0], ids.data_ptr(), ids.shape[1], out.data_ptr(),
                                              torch.get_num_threads())
        if bad:
            raise EngineError(f"re-scoring logits refused its inputs ({bad}); an engine bug")
        return out

    def pool_threads(self, threads: int) -> int:
        """The threads a native step asking for `threads` runs on now: fewer while other processes hold
        the cores (csrc/cpu_pool.c)."""
        return self._lib.agentkv_pool_threads(threads)

    def decode_step(self, model: int, ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor,
                    table: torch.Tensor, rows: torch.Tensor, select: torch.Tensor, logits: torch.Tensor,
                    hidden: torch.Tensor | None = None, generic: bool = False, threads: int | None = None,
                    lora: int | None = None) -> int:
        """csrc/cpu_step.c over the model described at address `model` (engine/native_step.py): a pass
        of len(ids) tokens (their positions, new slots and slot-table rows), the logits of the tokens
        `select` into `logits` [len(select), vocab] (and their final normed states into `hidden`
        [len(select), hidden size] where given), on `threads` threads (torch's count by default), with
        the LoRA adapters described at address `lora` (a StepLora; None: none); 0, or the code of what
        it refused."""
        for t in (ids, positions, out_loc, rows, table, select):
            assert t.dtype == torch.int64 and t.is_contiguous()
        assert ids.shape[0] == positions.shape[0] == out_loc.shape[0] == rows.shape[0]  # one each a token
        assert logits.dtype == torch.float32 and logits.is_contiguous() and logits.shape[0] == select.shape[0]
        return self._lib.agentkv_decode_step(model, ids.shape[0], ids.data_ptr(), positions.data_ptr(),
                                             out_loc.data_ptr(), table.data_ptr(), table.shape[0], table.shape[1],
                                             rows.data_ptr(), select.data_ptr(), select.shape[0], logits.data_ptr(),
                                             None if hidden is None else hidden.data_ptr(),
                                             threads or torch.get_num_threads(), generic, lora)
