"""KV that outlives the pool and the process: a disk tier under the radix tree (tier.py), its files
(blocks.py) and the fingerprint that keys them to one model setup (fingerprint.py)."""

from agentkv.engine.disk.fingerprint import fingerprint
from agentkv.engine.disk.tier import DiskTier, KVLayout

__all__ = ["DiskTier", "KVLayout", "fingerprint"]
