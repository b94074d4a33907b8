"""One block of KV on disk: a file per `block_tokens` tokens, named by the hash of every token up to
its end, holding its token ids, its KV and a checksum.

A file is `MAGIC`, a little-endian uint32 header length, a JSON header, then the payload: the block's
K and V for every layer, [tokens, layers, 2, kv_heads, head_dim] in the pool's dtype, raw bytes
(token-major, so that consecutive blocks read into one buffer are one tensor). The
header alone (a few hundred bytes) is what a restarted engine reads to rebuild its index; the payload
is read only when a request needs it, and then checked: its length, its CRC-32C, the tier, the shape
and the token ids must all agree, or the block is not served.

A file is written under a temporary name and renamed into place, so a process killed mid-write leaves
a `.tmp` file (removed at the next start), never a half block under a block's name.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

MAGIC = b"AKVB1\n"
SUFFIX = ".kvb"
_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20  # a header is a few hundred bytes; more than this is a damaged file


class BlockError(Exception):
    """A block file that cannot be served (cut, damaged, or of other tokens); the message says which."""


@dataclass(frozen=True)
class BlockHeader:
    digest: str  # hex hash of every token from the start of the sequence to this block's end
    parent: str  # the previous block's digest ("" for the first)
    tier: str  # the tier's fingerprint id: a block of another model is never served
    start: int  # the position of the block's first token
    tokens: tuple[int, ...]
    shape: tuple[int, ...]  # [layers, 2, tokens, kv_heads, head_dim]
    dtype: str
    payload_bytes: int
    crc32c: int
    ns: str = ""  # the radix cache's namespace (a LoRA adapter's hash, also in the digests' salt); "": the base's

    def encode(self) -> bytes:
        fields = {"digest": self.digest, "parent": self.parent, "tier": self.tier, "start": self.start,
                  "tokens": list(self.tokens), "shape": list(self.shape), "dtype": self.dtype,
                  "payload_bytes": self.payload_bytes, "crc32c": self.crc32c}
        if self.ns:
            fields["ns"] = self.ns
        body = json.dumps(fields, separators=(",", ":"))
        raw = body.encode()
        return MAGIC + _LEN.pack(len(raw)) + raw


def chain(tokens: Sequence[int], end: int, block_tokens: int, salt: bytes) -> list[str]:
    """The digests of the full blocks of `tokens[:end]`: block k's hashes block k-1's digest and its own
    token ids, so one digest stands for the whole sequence up to its block's end."""
    out, prev = [], salt
    for start in range(0, end - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(array("q", tokens[start : start + block_tokens]).tobytes())
        prev = h.digest()
        out.append(prev.hex())
    return out


def write_block(directory: Path, header: BlockHeader, payload: memoryview) -> Path:
    """Write the block under a temporary name, then rename it into place (atomic on POSIX)."""
    path = directory / (header.digest + SUFFIX)
    tmp = directory / f"{header.digest}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.encode())
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_header(path: Path) -> tuple[BlockHeader, int]:
    """The block's header and the offset of its payload, reading only the header's bytes."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _LEN.size)
        if len(head) < len(MAGIC) + _LEN.size or not head.startswith(MAGIC):
            raise BlockError(f"{path.name} is not a KV block (bad magic, or cut short)")
        (n,) = _LEN.unpack(head[len(MAGIC):])
        if n > MAX_HEADER:
            raise BlockError(f"{path.name}'s header claims {n} bytes")
        raw = f.read(n)
    if len(raw) < n:
        raise BlockError(f"{path.name} is cut short inside its header")
    try:
        d = json.loads(raw)
        header = BlockHeader(d["digest"], d["parent"], d["tier"], int(d["start"]), tuple(d["tokens"]),
                             tuple(d["shape"]), d["dtype"], int(d["payload_bytes"]), int(d["crc32c"]),
                             str(d.get("ns", "")))
    except (ValueError, KeyError, TypeError) as e:
        raise BlockError(f"{path.name}'s header does not parse ({type(e).__name__}: {e})") from None
    return header, len(MAGIC) + _LEN.size + n


def read_block(path: Path, expect: BlockHeader, into: memoryview) -> None:
    """Read the payload of the block at `path` into `into` (payload_bytes long), checked against what
    the index expects of it (the same digest, tier, tokens, shape and dtype) and against its own
    length and checksum."""
    header, offset = read_header(path)
    for field in ("digest", "tier", "tokens", "shape", "dtype", "start", "payload_bytes", "ns"):
        if getattr(header, field) != getattr(expect, field):
            raise BlockError(f"{path.name} holds another block ({field} differs)")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(offset)
        got = f.readinto(into)
    if got != header.payload_bytes or size != offset + header.payload_bytes:
        raise BlockError(f"{path.name} is cut short: {got} of {header.payload_bytes} payload bytes"
                         if got < header.payload_bytes else f"{path.name} has bytes past its payload")
    if crc32c(into) != header.crc32c:
        raise BlockError(f"{path.name} fails its checksum (damaged on disk)")
