"""The disk tier at an engine's start and close: what makes a restart find the KV it served.

At close, the engine's leased pins are kept beside the blocks (their tokens, time to live and what is
left of it), and the pool's prefixes are written to the tier, the most recently used first, within a time
bound (`kv_flush_timeout`), then the writer finishes what is queued. At start, in the background,
the pins are made again (their KV read back from disk) and the tier's most recently used prefixes are
read back into a share of the pool (`kv_warm_fraction`): read on the tier's reader threads, copied in
on the engine thread between its steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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
    if core.closed:
        return deadline
    try:
        # (a pin without a lease belongs to the handle that made it, gone with this process: the program
        # that pins again after a restart finds its KV on disk; restored here, nobody could unpin it)
        pins = core.call(lambda: core.scheduler.tree.pin_records()).result(timeout=30)
        tier.write_pins([p for p in pins if p[1] is not None])
        if timeout > 0:
            core.call(lambda: core.scheduler.kv.save(deadline)).result(timeout=timeout + 1)
    except Exception as e:  # (a stopping engine still stops: what was not written is recomputed)
        log.warning("agentkv: writing the KV pool to disk at close failed: %s", e)
    return deadline


def warm_at_start(core: EngineCore, tier: DiskTier, room: int, repin: Callable[[list[int], float | None,
                                                                                 float | None], object]) -> None:
    """Pin again what an earlier run had pinned (`repin(tokens, ttl_s, left_s)`: its KV read back from
    disk), then read the tier's most recently used prefixes into at most `room` free slots, one prefix at
    a time (requests that come meanwhile are served as usual, and read back what they need themselves)."""
    for tokens, ttl, left in tier.read_pins():
        try:
            repin(tokens, ttl, left)
        except EngineClosedError:
            return
        except Exception as e:  # (over the pin budget of a smaller pool, ...: its KV is still on disk)
            log.warning("agentkv: a pin of %d tokens kept by an earlier run could not be restored: %s", len(tokens), e)
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
