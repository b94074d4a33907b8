"""A server's stored responses kept in SQLite (`agentkv serve --state-dir DIR`): a client continuing a
conversation with `previous_response_id` after a deploy finds it, and its KV on disk where the engine
has a --kv-dir tier.

One table, written as responses are stored and deleted (each write committed before the route
answers), read once at start. A folder holds the state of one model setup: rows carry the tokenizer's
identity, and a folder of another is left alone with one warning (its tokens would mean other text).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

log = logging.getLogger("agentkv")
SCHEMA_VERSION = 1


class StateFile:
    """responses.db in `folder`: response id -> (its expiry in wall-clock seconds, the stored record)."""

    def __init__(self, folder: str | Path, model_key: str):
        self.path = Path(folder) / "responses.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, expires REAL, record TEXT)")
        found = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        expected = {"schema": str(SCHEMA_VERSION), "model": model_key}
        if found and found != expected:
            log.warning("agentkv: %s holds the stored responses of another model setup or agentkv version (%s); "
                        "they are dropped", self.path, ", ".join(k for k in expected if found.get(k) != expected[k]))
            self._db.execute("DELETE FROM responses")
        self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", expected.items())

    def load(self) -> list[tuple[str, float, dict]]:
        """The responses kept and not expired, oldest expiry first: (id, seconds left, record)."""
        now = time.time()
        with self._lock:
            self._db.execute("DELETE FROM responses WHERE expires <= ?", (now,))
            rows = self._db.execute("SELECT id, expires, record FROM responses ORDER BY expires").fetchall()
        return [(rid, expires - now, json.loads(record)) for rid, expires, record in rows]

    def put(self, rid: str, ttl_s: float, record: dict) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?)",
                             (rid, time.time() + ttl_s, json.dumps(record)))

    def delete(self, rid: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM responses WHERE id = ?", (rid,))

    def close(self) -> None:
        with self._lock:
            self._db.close()


def tokenizer_key(tokenizer) -> str:
    """What a stored response's tokens mean: a digest of the tokenizer's whole definition."""
    return hashlib.blake2b(tokenizer.backend.to_str().encode(), digest_size=16).hexdigest()
