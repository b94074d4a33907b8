"""Grammar token masks applied to logits: the torch reference, and the Triton kernel on a GPU.

A bitmask row holds one bit per token id (bit i of int32 word i // 32), as the grammar layer's
`Matcher.fill_next_token_bitmask` writes it. Tokens whose bit is 0 get a logit of -inf.
"""

from __future__ import annotations

import torch

from agentkv.kernels.triton_backend import triton_usable

_SHIFTS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, W] int32 -> [B, vocab_size] bool (True = allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits` [B, V] with -inf where the bitmask [B, ceil(V / 32)] disallows the token, and the [B]
    bool tensor of rows that allow at least one token."""
    bitmask = bitmask.to(logits.device)
    if logits.is_cuda and triton_usable(logits.device)[0]:
        # imported here: triton's import takes seconds, and only a CUDA pass needs it
        from agentkv.kernels.triton_small import apply_token_bitmask_inplace

        out = logits.contiguous().clone()
        apply_token_bitmask_inplace(out, bitmask.contiguous())
        return out, _rows_alive(bitmask, logits.shape[-1])
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf")), allowed.any(-1)


def _rows_alive(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B] bool: the row allows some token below `vocab_size` (whole words, then the last word's low bits)."""
    full, rest = divmod(vocab_size, 32)
    alive = (bitmask[:, :full] != 0).any(-1)
    if rest:
        alive |= (bitmask[:, full] & ((1 << rest) - 1)) != 0
    return alive

