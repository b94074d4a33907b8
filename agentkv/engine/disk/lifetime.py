"""The disk tier at an engine's start and close: what makes a restart find the KV it served.

At close, the engine's leased pins are kept beside the blocks (their tokens, time to live and what is
left of it), and the pool's prefixes are written to the tier, the most recently used first, within a time
bound (`kv_flush_timeout`), then the writer finishes what is queued. At start, in the background,
the pins are made again (their KV read back from disk) and the tier's most recently used prefixes are
read back into a share of the pool (`kv_warm_fraction`): read on the tier's reader threads, copied in
on the engine thread between its steps.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentkv.errors import EngineClosedError

if TYPE_CHECKING:
    from agentkv.engine.core import EngineCore
    from agentkv.engine.disk.tier import DiskTier

log = logging.getLogger("agentkv")
PINS = "pins.json"  # the pins a close kept, for the next run


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
        keep_pins(tier, [p for p in pins if p[1] is not None])
        if timeout > 0:
            core.call(lambda: core.scheduler.kv.save(deadline)).result(timeout=timeout + 1)
    except Exception as e:  # (a stopping engine still stops: what was not written is recomputed)
        log.warning("agentkv: writing the KV pool to disk at close failed: %s", e)
    return deadline


def warm_at_start(core: EngineCore, tier: DiskTier, room: int,
                  repin: Callable[[list[int], float | None, float | None, str | None], object]) -> None:
    """Pin again what an earlier run had pinned (`repin(tokens, ttl_s, left_s, ns)`: its KV read back from
    disk), then read the tier's most recently used prefixes into at most `room` free slots, one prefix at
    a time (requests that come meanwhile are served as usual, and read back what they need themselves)."""
    for tokens, ttl, left, ns in kept_pins(tier):
        try:
            repin(tokens, ttl, left, ns)
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


def keep_pins(tier: DiskTier, records: list[tuple[list[int], float | None, float | None, str | None]]) -> None:
    """Keep the engine's pins (tokens, time to live, seconds left, namespace) beside the blocks, for a restart
    to pin again (their KV was written through when pinned). Replaces what an earlier close kept."""
    if not tier.writable:
        return
    body = {"written": time.time(), "pins": [{"tokens": t, "ttl_s": ttl, "left_s": left, "ns": ns}
                                             for t, ttl, left, ns in records]}
    tmp = tier.dir / f"pins.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(body))
        os.replace(tmp, tier.dir / PINS)
    except OSError as e:
        tier.warn_once("pins", f"agentkv: the pins could not be kept in {tier.dir} ({e.strerror or e}); a restart "
                               "finds their KV on disk but does not pin it")


def kept_pins(tier: DiskTier) -> list[tuple[list[int], float | None, float | None, str | None]]:
    """The pins an earlier run kept, less those whose time ran out meanwhile (the seconds left are
    counted from when they were kept: time a server is down counts)."""
    try:
        body = json.loads((tier.dir / PINS).read_text())
        down = max(0.0, time.time() - float(body["written"]))
        out = []
        for p in body["pins"]:
            tokens, ttl, left = [int(t) for t in p["tokens"]], p["ttl_s"], p["left_s"]
            if ttl is None or left - down > 0:
                out.append((tokens, ttl, None if ttl is None else left - down, p.get("ns")))
        return out
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        tier.warn_once("pins", f"agentkv: {tier.dir / PINS} is unreadable; the pins it held are not restored")
        return []
