"""Which blocks a GGUF's matrix is multiplied in, and blocks rewritten without changing a single weight.

The tiles (csrc/cpu_tiles.c, cpu_ktiles.c, cpu_ftiles.c) multiply Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
Q4_K, Q5_K, Q6_K, IQ4_XS, F16 and BF16 in the file's own bytes; the row-major kernels of CPUs without
AVX2 (csrc/cpu_quant.c) the first three, Q4_K and Q6_K. A linear made of several matrices (q, k and v;
gate and up) keeps each in its own type where a file mixes them (Q4_K_M: q and k in Q4_K beside a v in
Q6_K; Gemma 3 270M's q and k in Q5_0 beside a v in Q8_0): the loader stacks them (QuantWeight.stacked).

Q5_0 and IQ4_NL blocks hold 32 weights as small integers times one fp16 scale: Q5_0's are q - 16 with q
of 5 bits, IQ4_NL's are entries of a fixed table of 16 int8 values. Q8_0's block holds 32 int8 times
one fp16 scale, so each such block is a Q8_0 block with the same scale and its integers written out:
dequantized, the two give the same floats bit for bit (tests/engine/test_gguf_transcode.py). That is how
they run where the tiles do not (34 bytes a block read where the file holds 22 or 18). A part in a
type no kernel here takes (Q5_1, Q5_K and IQ4_XS there) makes its linear dequantized (the loader says so;
F16 and BF16 are widened to fp32 there without a notice: no precision is lost).
"""

from __future__ import annotations

import numpy as np

from agentkv.kernels.cpu_quant import QUANT_TYPES, ROW_MAJOR_TYPES

Q8_0_BLOCK = 34  # fp16 scale + 32 int8
# IQ4_NL's (and IQ4_XS's) values for its 16 codes (ggml-common.h: kvalues_iq4nl)
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# the types rewritten as Q8_0, by name -> bytes a block of 32
AS_Q8_0 = {"Q5_0": 22, "IQ4_NL": 18}
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
    else:  # IQ4_NL
        qs = blocks[:, 2:18]
        values = IQ4_NL_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=1)]
    out[:, 2:] = values.astype(np.int8).view(np.uint8)
    return out.reshape(*lead, -1)
