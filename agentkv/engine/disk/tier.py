"""The disk tier: KV blocks the pool evicted (or a pin wrote through), kept in files under a byte
budget with their own LRU, read back into the pool when a request's prefix reaches them.

The engine thread only copies: a block's KV out of the pool before its slots are freed (`spill`), and
read-back KV into new slots (`take`). Files are written by one writer thread and read ahead by a
reader pool while a request waits in the queue (`prefetch`); a block waiting to be written is served
from memory. Blocks are keyed by a hash chain over token ids (blocks.py), so one digest names a whole
prefix; the tier's folder is named by the engine's fingerprint (fingerprint.py).

Nothing wrong is served: a block is read only if its length, checksum, tier, shape and token ids all
agree; anything else (a cut or damaged file, a full or read-only disk) costs a recompute and one
warning, never the engine.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from crc32c import crc32c

from agentkv.engine.disk.blocks import SUFFIX, BlockError, BlockHeader, chain, read_block, read_header, write_block
from agentkv.engine.disk.fingerprint import differences, tier_id

log = logging.getLogger("agentkv")
MAX_PENDING_BYTES = 512 << 20  # KV copied out of the pool and not yet on disk; past it, evictions are dropped
STAGING_BYTES = 1 << 30  # the most take's buffer keeps between calls
WRITE_PAUSE_S = 30.0  # after a failed write (full or read-only disk), how long writes wait before trying again


@dataclass(frozen=True)
class KVLayout:
    """The shape of one token's KV in the pool (memory.token_shape): a block is [tokens, layers, 2,
    kv_heads, head_dim], or a hybrid's [tokens, entries]."""

    token_shape: tuple[int, ...]
    dtype: torch.dtype

    def shape(self, tokens: int) -> tuple[int, ...]:
        return (tokens, *self.token_shape)

    def nbytes(self, tokens: int) -> int:
        return tokens * math.prod(self.token_shape) * self.dtype.itemsize


@dataclass
class _Entry:
    header: BlockHeader
    path: Path
    size: int  # bytes on disk


class DiskTier:
    def __init__(self, kv_dir: str | Path, budget_bytes: int, fp: dict[str, str], layout: KVLayout,
                 block_tokens: int = 16):
        self.root, self.budget, self.layout, self.block_tokens = Path(kv_dir), budget_bytes, layout, block_tokens
        self.id = tier_id(fp)
        self.dir = self.root / self.id
        self._salt = bytes.fromhex(self.id)
        self._dtype = str(layout.dtype).removeprefix("torch.")
        self._lock = threading.Lock()
        self._index: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._pending: dict[str, tuple[BlockHeader, torch.Tensor]] = {}
        self._pending_bytes = self._disk_bytes = 0
        self._warned: set[str] = set()
        self._paused_until = 0.0
        self.written_blocks = self.errors = self.dropped_blocks = self.read_ahead_blocks = 0
        self.restored_tokens = 0  # counted by the pool's owner, which may find no room for what `take` read
        self._stage: torch.Tensor | None = None  # take's buffer (_staging)
        self.writable = self._open(fp)
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="agentkv-kv-writer", daemon=True)
        self._writer.start()
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="agentkv-kv-reader")

    # ---- opening: the fingerprint, and the index of an earlier run --------------------------------

    def _open(self, fp: dict[str, str]) -> bool:
        """Read the index of what an earlier run left (headers only); True if the tier can be written."""
        others = []
        if self.root.is_dir():
            for sub in self.root.iterdir():
                try:
                    stored = json.loads((sub / "tier.json").read_text())
                except (OSError, ValueError):
                    continue
                if differences(stored, fp):
                    others.append(", ".join(differences(stored, fp)))
        if others:
            log.warning("agentkv: %s also holds %d KV tier(s) of another model setup (%s differ); they are "
                        "ignored, never served", self.root, len(others), "; ".join(sorted(set(others))))
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = self.dir / "tier.json"
            if not meta.exists():
                meta.write_text(json.dumps(fp, indent=1, sort_keys=True))
            writable = os.access(self.dir, os.W_OK)
        except OSError as e:
            self.warn_once("open", f"agentkv: the KV disk tier cannot use {self.dir} ({e.strerror or e}); "
                               "evicted prefixes are recomputed instead of read back")
            writable = False
        if self.dir.is_dir():
            self._scan()
        return writable

    def _scan(self) -> None:
        found, bad, torn = [], 0, 0
        for path in self.dir.iterdir():
            if path.suffix == ".tmp" and not _writer_alive(path):
                torn += 1  # a write a process stopped in the middle of: never under a block's name
                _unlink(path)
            elif path.suffix == SUFFIX:
                try:
                    header, _ = read_header(path)
                    st = path.stat()
                except (BlockError, OSError):
                    bad += 1
                    _unlink(path)
                    continue
                if header.tier != self.id or path.stem != header.digest:
                    bad += 1
                    continue
                found.append((st.st_mtime_ns, header, path, st.st_size))
        for _, header, path, size in sorted(found, key=lambda f: f[0]):
            self._index[header.digest] = _Entry(header, path, size)
            self._disk_bytes += size
        if torn:
            self.warn_once("torn", f"agentkv: {torn} unfinished KV block write(s) (a process stopped mid-write) were "
                               f"removed from {self.dir}")
        if bad:
            self.warn_once("scan", f"agentkv: {bad} unreadable KV block file(s) in {self.dir} were skipped")
        if found:
            tokens = sum(len(e.header.tokens) for e in self._index.values())
            log.info("agentkv: KV disk tier %s: %d blocks (%d tokens, %.1f MB) from an earlier run", self.dir,
                     len(self._index), tokens, self._disk_bytes / 1e6)
        with self._lock:
            self._shrink(0)

    # ---- the engine thread: out of the pool, and back --------------------------------------------------

    def salt(self, ns: str | None) -> bytes:
        """What a digest chain of namespace `ns` starts from: the tier's fingerprint, and the namespace's
        hash (a LoRA adapter's content), so that no two namespaces' blocks are ever each other's."""
        return self._salt if ns is None else self._salt + bytes.fromhex(ns)

    def spill(self, tokens: Sequence[int], start: int, read_kv: Callable[[int, int], torch.Tensor],
              ns: str | None = None) -> int:
        """Queue for writing the full blocks of `tokens` (of namespace `ns`) from the one holding position
        `start` on, those not on disk yet; `read_kv(a, b)` copies the KV of positions [a, b) out of the pool.
        Returns the number of blocks queued."""
        B = self.block_tokens
        first, end = start // B, len(tokens) // B
        if end <= first or not self.writable or self.budget <= 0 or time.monotonic() < self._paused_until:
            return 0
        digests = chain(tokens, end * B, B, self.salt(ns))
        with self._lock:
            todo = [k for k in range(first, end) if digests[k] not in self._index and digests[k] not in self._pending]
            for k in reversed(range(first, end)):  # on disk already: used now, as take counts a hit
                if digests[k] in self._index:
                    self._index.move_to_end(digests[k])
        if not todo:
            return 0
        kv = read_kv(todo[0] * B, (todo[-1] + 1) * B)
        queued = 0
        for k in todo:
            size = self.layout.nbytes(B)
            if self._pending_bytes + size > MAX_PENDING_BYTES or size > self.budget:
                self.dropped_blocks += 1
                continue
            block = kv[(k - todo[0]) * B : (k - todo[0] + 1) * B]
            header = BlockHeader(digests[k], digests[k - 1] if k else "", self.id, k * B,
                                 tuple(tokens[k * B : (k + 1) * B]), self.layout.shape(B), self._dtype, size, 0,
                                 ns or "")
            with self._lock:
                self._pending[header.digest] = (header, block)
                self._pending_bytes += size
            self._queue.put(header.digest)
            queued += 1
        return queued

    def prefetch(self, tokens: Sequence[int], cached: int, limit: int,
                 ns: str | None = None) -> dict[str, Future] | None:
        """Start reading the blocks on disk that continue `tokens[:cached]` (up to `limit`), so that they
        are in memory when the request is admitted (`take`)."""
        B = self.block_tokens
        if limit // B <= cached // B:
            return None
        futures = {}
        for k, d in enumerate(chain(tokens, limit // B * B, B, self.salt(ns))):
            if k < cached // B:
                continue
            with self._lock:
                entry, pending = self._index.get(d), d in self._pending
            if entry is None and not pending:
                break
            if entry is not None:
                futures[d] = self._readers.submit(self._read, entry, None)
        return futures or None

    def take(self, tokens: Sequence[int], cached: int, limit: int, room: int,
             prefetched: dict[str, Future] | None = None, ns: str | None = None) -> torch.Tensor | None:
        """The KV of `tokens[cached:end]` for the longest `end <= limit` the tier holds and `room` slots
        take, as [end - cached, layers, 2, kv_heads, head_dim] on the CPU, or None."""
        B = self.block_tokens
        first, last = cached // B, min(limit, cached + room) // B
        if last <= first:
            return None
        digests, found = chain(tokens, last * B, B, self.salt(ns)), []
        for k in range(first, last):  # the blocks the tier holds, in order, each of the prompt's tokens
            with self._lock:
                pending, entry = self._pending.get(digests[k]), self._index.get(digests[k])
            header = pending[0] if pending is not None else entry.header if entry is not None else None
            # (a collision, or another namespace's block: not served)
            if header is None or header.tokens != tuple(tokens[k * B : (k + 1) * B]) or header.ns != (ns or ""):
                break
            found.append((pending, entry))
        if not found:
            return None
        out = self._staging(len(found) * B)
        reads = []  # blocks not read ahead are read now, by the reader threads side by side, straight into out
        for i, (pending, entry) in enumerate(found):
            dst = out[i * B : (i + 1) * B]
            if pending is not None:
                dst.copy_(pending[1])
                reads.append(None)
            elif prefetched and entry.header.digest in prefetched:
                reads.append(prefetched[entry.header.digest])
                self.read_ahead_blocks += 1
            else:
                reads.append(self._readers.submit(self._read, entry, dst))
        used = []
        for i, ((pending, entry), read) in enumerate(zip(found, reads)):
            if read is None:
                continue
            if not self._load(entry, read, out[i * B : (i + 1) * B]):
                for later in reads[i + 1 :]:  # none may write into the buffer once it is handed out
                    if later is not None and not later.cancel():
                        wait([later])
                out = out[: i * B]
                break
            used.append(entry)
        if not len(out):
            return None
        with self._lock:
            for entry in reversed(used):  # the deepest block least recent: the tier keeps prefixes' heads longest
                if entry.header.digest in self._index:
                    self._index.move_to_end(entry.header.digest)
        for entry in used:
            try:
                os.utime(entry.path)  # the LRU order a restarted engine reads back
            except OSError:
                pass
        return out[cached - first * B :]

    def _staging(self, tokens: int) -> torch.Tensor:
        """A tensor of `tokens` tokens' KV that `take` fills and its caller copies into the pool before the
        next `take`: kept from one call to the next (up to STAGING_BYTES), since a fresh 100 MB buffer
        costs its first-touch page faults (~30 ms) on every read-back."""
        nbytes = self.layout.nbytes(tokens)
        if nbytes > STAGING_BYTES:
            return torch.empty(self.layout.shape(tokens), dtype=self.layout.dtype)
        if self._stage is None or self._stage.numel() < nbytes:
            self._stage = torch.empty(nbytes, dtype=torch.uint8)
        return self._stage[:nbytes].view(self.layout.dtype).view(self.layout.shape(tokens))

    def _read(self, entry: _Entry, dst: torch.Tensor | None) -> torch.Tensor:
        """Read `entry`'s block into `dst` (or a new tensor), checked; raises BlockError or OSError."""
        if dst is None:
            dst = torch.empty(self.layout.shape(self.block_tokens), dtype=self.layout.dtype)
        read_block(entry.path, entry.header, memoryview(dst.view(torch.uint8).numpy()).cast("B"))
        return dst

    def _load(self, entry: _Entry, read: Future, dst: torch.Tensor) -> bool:
        """Wait for `entry`'s block to be read into `dst` (or read ahead: then copied there); False where it
        cannot be served (the block is then dropped, with one warning)."""
        try:
            block = read.result()
            if block.data_ptr() != dst.data_ptr():
                dst.copy_(block)
            return True
        except (BlockError, OSError) as e:
            with self._lock:
                if self._index.get(entry.header.digest) is not entry:
                    return False  # the budget removed it meanwhile: a miss, not a fault
            self.errors += 1
            self.warn_once("read", f"agentkv: a KV block on disk could not be served and is recomputed ({e}); "
                               "the file is removed")
            with self._lock:
                if self._index.pop(entry.header.digest, None) is not None:
                    self._disk_bytes -= entry.size
            _unlink(entry.path)
            return False

    # ---- the writer thread -----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while (digest := self._queue.get()) is not None:
            with self._lock:
                header, kv = self._pending[digest]
            payload = kv.view(torch.uint8).numpy().data
            header = replace(header, crc32c=crc32c(payload))
            size = len(header.encode()) + header.payload_bytes
            if time.monotonic() < self._paused_until:  # (queued before a write failed)
                with self._lock:
                    self._drop_pending(digest)
                self.dropped_blocks += 1
                continue
            try:
                with self._lock:
                    self._shrink(size)
                path = write_block(self.dir, header, payload)
            except OSError as e:
                self.errors += 1
                self._paused_until = time.monotonic() + WRITE_PAUSE_S
                self.warn_once(f"write{e.errno}", f"agentkv: the KV disk tier cannot write to {self.dir} "
                                              f"({e.strerror or e}); evicted prefixes are dropped (recomputed when "
                                              "needed) until it can")
                with self._lock:
                    self._drop_pending(digest)
                continue
            with self._lock:
                self._drop_pending(digest)
                self._index[digest] = _Entry(header, path, size)
                self._disk_bytes += size
                self.written_blocks += 1

    def _drop_pending(self, digest: str) -> None:
        header, _ = self._pending.pop(digest)
        self._pending_bytes -= header.payload_bytes

    def _shrink(self, room: int) -> None:
        """Remove least recently used blocks until `room` more bytes fit in the budget (lock held)."""
        while self._index and self._disk_bytes + room > self.budget:
            _, entry = self._index.popitem(last=False)
            self._disk_bytes -= entry.size
            _unlink(entry.path)

    # ---- reporting and lifetime ------------------------------------------------------------------------

    def warn_once(self, kind: str, message: str) -> None:
        """Log `message` the first time a fault of this `kind` happens (one line a kind, not one a block)."""
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"disk_blocks": len(self._index), "disk_bytes": self._disk_bytes, "disk_budget": self.budget,
                    "disk_tokens": len(self._index) * self.block_tokens, "disk_pending_bytes": self._pending_bytes,
                    "disk_written_blocks": self.written_blocks, "disk_restored_tokens": self.restored_tokens,
                    "disk_dropped_blocks": self.dropped_blocks, "disk_read_ahead_blocks": self.read_ahead_blocks,
                    "disk_errors": self.errors}

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued block is on disk (or failed)."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.005)

    def wait_room(self, deadline: float) -> bool:
        """Wait until the blocks queued and not yet written hold under half MAX_PENDING_BYTES (so that a
        flush of the whole pool queues no more than the writer keeps up with); False at `deadline`."""
        while self._pending_bytes > MAX_PENDING_BYTES // 2:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def hot_prefixes(self, max_tokens: int) -> list[list[int]]:
        """The token sequences of the most recently used prefixes on disk, most recent first, whole from
        the sequence's start (each block's parents all held), up to `max_tokens` tokens in all: what a
        restarted engine reads back into its pool before it is asked (the blocks are read when used). The
        base model's only: an adapter's prefixes are read back when a request of it asks."""
        with self._lock:
            index = {d: e.header for d, e in self._index.items()}
            recent = list(reversed(self._index))
        out, covered, total = [], set(), 0
        for digest in recent:
            if digest in covered:
                continue
            chain_, d = [], digest
            while d:  # (each header names its parent: the start of the sequence has none)
                h = index.get(d)
                if h is None:
                    break
                chain_.append(h)
                d = h.parent
            else:
                chain_.reverse()
                if chain_[0].start != 0 or chain_[0].ns or total + len(chain_) * self.block_tokens > max_tokens:
                    continue
                covered.update(h.digest for h in chain_)
                out.append([t for h in chain_ for t in h.tokens])
                total += len(out[-1])
        return out

    def close(self, timeout: float = 60.0) -> None:
        """Write what is queued within `timeout`, then stop the threads (the tier's files stay for the next
        run; a write still going at the deadline leaves a temporary file the next run removes)."""
        self._queue.put(None)
        self._writer.join(timeout=timeout)
        self._readers.shutdown(wait=True)


def _writer_alive(tmp: Path) -> bool:
    """Whether the process that is writing `tmp` (named digest.pid.tmp) still runs."""
    try:
        os.kill(int(tmp.name.split(".")[-2]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
