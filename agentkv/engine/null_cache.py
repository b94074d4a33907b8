"""The prefix cache of an engine made with `enable_radix_cache=False`: it holds nothing.

It answers as a RadixCache that is always empty (no prefix cached, nothing to evict, no pins), so
the scheduler, the KV owner and the drafter ask one object either way. `keeps_kv` is False: a
request's KV goes back to the pool when it finishes instead of into the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentkv.engine.pin_leases import PinLeases
from agentkv.engine.radix_cache import RadixCache
from agentkv.errors import RequestError

_NO_SLOTS = torch.empty(0, dtype=torch.int64)
_NO_LEASES = PinLeases()


class NullPrefixCache:
    keeps_kv = False  # the KV owner frees a finished request's slots rather than inserting them
    total_size = evictable_size = protected_size = pinned_size = num_evicted_tokens = pin_budget = 0

    def match_prefix(self, tokens: Sequence[int], touch: bool = True,
                     ns: str | None = None) -> tuple[torch.Tensor, None]:
        return _NO_SLOTS, None

    def cached_length(self, tokens: Sequence[int], limit: int | None = None, ns: str | None = None) -> int:
        return 0

    def continuation(self, tokens: Sequence[int], k: int, ns: str | None = None) -> list[int]:
        return []

    def touch(self, node) -> None:
        pass

    def lock(self, node) -> None:
        pass

    def unlock(self, node) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def pin(self, tokens: Sequence[int], *args, **kwargs):
        raise RequestError("pins need the radix cache; create the Engine with enable_radix_cache=True")

    def unpin(self, handle) -> None:
        raise RequestError("this engine has no radix cache, so it holds no pins")

    def expire_pins(self) -> int:
        return 0

    @property
    def leases(self) -> PinLeases:
        return _NO_LEASES

    def pin_records(self) -> list:
        return []

    @property
    def pins(self) -> list:
        return []

    def nodes(self) -> list:
        return []

    def reset(self) -> None:
        pass


PrefixCache = RadixCache | NullPrefixCache  # what an engine's scheduler, KV owner and drafter are given
