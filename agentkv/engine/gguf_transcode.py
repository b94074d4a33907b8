"""Which blocks a GGUF's matrix is multiplied in, and blocks rewritten without changing a single weight.

The tiles (csrc/cpu_tiles.c, cpu_ktiles.c, cpu_ftiles.c) multiply Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
Q4_K, Q5_K, Q6_K, IQ4_XS, F16 and BF16 in the file's own bytes, and MXFP4 (gpt-oss's experts) as IQ4_NL's
blocks holding its codes, its power-of-two scale written as the fp16 it is exactly (mxfp4_held). The
row-major kernels of CPUs without AVX2 (csrc/cpu_quant.c) take the first three, Q4_K and Q6_K. A linear
made of several matrices (q, k and v; gate and up) keeps each in its own type where a file mixes them
(Q4_K_M: q and k in Q4_K beside a v in Q6_K; Gemma 3 270M's q and k in Q5_0 beside a v in Q8_0): the
loader stacks them (QuantWeight.stacked).

Q5_0, IQ4_NL and MXFP4 blocks hold 32 weights as small integers times one scale: Q5_0's are q - 16 with q
of 5 bits, IQ4_NL's and MXFP4's are entries of a fixed table of 16 int8 values. Q8_0's block holds 32 int8
times one fp16 scale, so each such block is a Q8_0 block with the same scale and its integers written out:
dequantized, the two give the same floats bit for bit (tests/engine/test_gguf_transcode.py). That is how
they run where the tiles do not (34 bytes a block read where the file holds 22, 18 or 17). A part in a
type no kernel here takes (Q5_1, Q5_K and IQ4_XS there; MXFP4 with a scale fp16 cannot hold) makes its
linear dequantized (the loader says so; F16 and BF16 are widened to fp32 there without a notice: no
precision is lost).
"""

from __future__ import annotations

import numpy as np

from agentkv.kernels.cpu_quant import QUANT_TYPES, ROW_MAJOR_TYPES

Q8_0_BLOCK = 34  # fp16 scale + 32 int8
# IQ4_NL's (and IQ4_XS's) values for its 16 codes (ggml-common.h: kvalues_iq4nl)
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# MXFP4's E2M1 values, doubled (ggml-common.h: kvalues_mxfp4; its scale halved to match)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
MXFP4_FILE_BLOCK = 17  # the E8M0 exponent, then 16 bytes of codes
# the types rewritten as Q8_0, by name -> bytes a block of 32 (MXFP4's: as mxfp4_held holds them)
AS_Q8_0 = {"Q5_0": 22, "IQ4_NL": 18, "MXFP4": 18}
# the types each kind of kernel multiplies in their blocks
# (by name: kernels/cpu_quant.py holds them by code)
TILED = frozenset(QUANT_TYPES)
ROW_MAJOR = frozenset(name for name, (code, _, _) in QUANT_TYPES.items() if code in ROW_MAJOR_TYPES)
FLOATS = ("F16", "BF16")  # tiled as blocks of 32 values (csrc/cpu_ftiles.c): rows of whole blocks


def kept_parts(parts: list[tuple[np.ndarray, str]], tiles: bool) -> list[tuple[np.ndarray, str]] | None:
    """The parts of one linear ((uint8 rows, type name) each), each in a type the kernels here multiply
    (`tiles`: the tiled kernels run): as the file holds it where they take it, Q5_0 and IQ4_NL rewritten
    as Q8_0 where only the row-major kernels run; None where a part has no kernel here (the caller
    dequantizes the linear)."""
    runs = TILED if tiles else ROW_MAJOR
    out = []
    for raw, kind in parts:
        if kind == "MXFP4" and (raw := mxfp4_held(raw)) is None:
            return None
        if kind not in runs and kind in AS_Q8_0:
            raw, kind = to_q8_0(raw, kind), "Q8_0"
        if kind not in runs or kind in FLOATS and raw.shape[-1] % 64:
            return None
        out.append((raw, kind))
    return out


def to_q8_0(raw: np.ndarray, kind: str) -> np.ndarray:
    """`raw` (uint8 [..., blocks * bytes a block], a matrix's rows of `kind` blocks) as Q8_0 blocks
    (uint8 [..., blocks * 34]) holding the same weights."""
    size = AS_Q8_0[kind]
    lead = raw.shape[:-1]
    if raw.shape[-1] % size:
        raise ValueError(f"a row of {kind} blocks is a multiple of {size} bytes, not {raw.shape[-1]}")
    blocks = np.ascontiguousarray(raw).reshape(-1, size)
    out = np.empty((len(blocks), Q8_0_BLOCK), dtype=np.uint8)
    out[:, :2] = blocks[:, :2]  # the fp16 scale, as it is
    if kind == "Q5_0":
        qh = blocks[:, 2:6].copy().view("<u4")  # [n, 1]: bit j is weight j's fifth bit
        qs = blocks[:, 6:22]
        low = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # weights 0-15 in the low nibbles, 16-31 in the high
        high = (qh >> np.arange(32, dtype=np.uint32)) & 1
        values = (low | (high.astype(np.uint8) << 4)).astype(np.int16) - 16
    else:  # IQ4_NL, MXFP4 (as mxfp4_held holds it)
        qs = blocks[:, 2:18]
        values = (IQ4_NL_VALUES if kind == "IQ4_NL" else MXFP4_VALUES)[np.concatenate([qs & 0x0F, qs >> 4], axis=1)]
    out[:, 2:] = values.astype(np.int8).view(np.uint8)
    return out.reshape(*lead, -1)


def mxfp4_held(raw: np.ndarray) -> np.ndarray | None:
    """MXFP4 rows (uint8 [..., blocks * 17]: each block's E8M0 exponent e, then its 16 bytes of codes) as
    the kernels hold them (IQ4_NL's block: the scale 2^(e - 128) as fp16, then the codes), the same
    weights; None where a scale has no exact fp16 (e outside 104..143: the caller dequantizes)."""
    lead = raw.shape[:-1]
    if raw.shape[-1] % MXFP4_FILE_BLOCK:
        raise ValueError(f"a row of MXFP4 blocks is a multiple of {MXFP4_FILE_BLOCK} bytes, not {raw.shape[-1]}")
    blocks = np.ascontiguousarray(raw).reshape(-1, MXFP4_FILE_BLOCK)
    e = blocks[:, 0].astype(np.int32)
    if len(e) and (e.min() < 104 or e.max() > 143):
        return None
    out = np.empty((len(blocks), 18), dtype=np.uint8)
    out[:, :2] = np.ldexp(np.float32(1.0), e - 128).astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = blocks[:, 1:]
    return out.reshape(*lead, -1)
