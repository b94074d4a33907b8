"""The disk tier at an engine's start and close: what makes a restart find the KV it served.

At close, the pool's prefixes are written to the tier, the most recently used first, within a time
bound (`kv_flush_timeout`), then the writer finishes what is queued. At start, the tier's most
recently used prefixes are read back into a share of the pool (`kv_warm_fraction`) in the
background: read on the tier's reader threads, copied in on the engine thread between its steps.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agentkv.errors import EngineClosedError

if TYPE_CHECKING:
    from agentkv.engine.core import EngineCore
    from agentkv.engine.disk.tier import DiskTier

log = logging.getLogger("agentkv")


def save_at_close(core: EngineCore, tier: DiskTier, timeout: float) -> float:
    """Write the pool's prefixes to `tier` for at most `timeout` seconds (the engine still running);
    returns the deadline, which the writer's own finish keeps to as well."""
    deadline = time.monotonic() + timeout
    if timeout > 0 and not core.closed:
        try:
            core.call(lambda: core.scheduler.kv.save(deadline)).result(timeout=timeout + 1)
        except Exception as e:  # (a stopping engine still stops: what was not written is recomputed)
            log.warning("agentkv: writing the KV pool to disk at close failed: %s", e)
    return deadline


def warm_at_start(core: EngineCore, tier: DiskTier, room: int) -> None:
    """Read the tier's most recently used prefixes into at most `room` free slots, one prefix at a time
    (requests that come meanwhile are served as usual, and read back what they need themselves)."""
    warmed = 0
    for ids in tier.hot_prefixes(room):
        futures = tier.prefetch(ids, 0, len(ids)) or {}
        for f in futures.values():
            f.exception()  # (waits; a block that cannot be read is dropped by the copy)
        try:
            warmed += core.call(lambda ids=ids, futures=futures: core.scheduler.kv.warm([ids], room - warmed,
                                                                                       futures)).result()
        except EngineClosedError:
            return
    if warmed:
        log.info("agentkv: %d tokens of KV read back from %s at start", warmed, tier.dir)
