"""Grammar token masks applied to logits: the torch reference (a Triton kernel comes with the GPU path).

A bitmask row holds one bit per token id (bit i of int32 word i // 32), as the grammar layer's
`Matcher.fill_next_token_bitmask` writes it. Tokens whose bit is 0 get a logit of -inf.
"""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, W] int32 -> [B, vocab_size] bool (True = allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits` [B, V] with -inf where the bitmask [B, ceil(V / 32)] disallows the token, and the [B]
    bool tensor of rows that allow at least one token."""
    allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf")), allowed.any(-1)
