"""Durable runs: a journal of each run's steps, so that a run killed mid-way resumes where it stopped.

Every model reply (its text, tokens and usage) is recorded before the run acts on it, every tool call
before it runs and its result once it has: a resumed run reads the replies instead of generating them
and the results instead of calling the tools, then goes on live. A call recorded as started but never
finished (the process ended while it ran) is run again only where its tool is `idempotent`; otherwise
the run ends asking for a decision, as a call awaiting approval does (`approvals={call id: True}` runs
it again, False or a reason tells the model it was not). Handoffs are not journaled: they only choose
the next agent, which the replay does again.

`Journal(path)` keeps them in SQLite (`journal.db` in a folder, WAL, each record committed before the
run moves on). A run belongs to one worker at a time: resuming claims it, and a second worker's
resume is refused while the first is alive. A journal is refused, with the difference named, when
the agent resuming it is defined otherwise (its tools, instructions, output) or it was written by
another journal format.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv.errors import JournalError

FORMAT = 1
_HOST = socket.gethostname()


def agent_key(agent) -> dict[str, str]:
    """What a journal's replay depends on, each part as a digest: a resumed run's agent must match."""
    def digest(value: Any) -> str:
        return hashlib.blake2b(json.dumps(value, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()

    return {"instructions": digest(agent.static_instructions),
            "tools": digest(sorted((t.name, t.parameters, t.requires_approval) for t in agent.tools.values())),
            "output": digest(agent.output_spec.schema)}


@dataclass
class ReplayedCompletion:
    """A recorded model reply as the run reads a completion."""

    text: str
    token_ids: list[int]
    finish_reason: str
    complete: bool = False
    truncated: bool = False
    tool_calls: list = field(default_factory=list)
    content: str | None = None
    reasoning: str | None = None


@dataclass
class ReplayedUsage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    forward_passes: int = 0
    jump_forward_tokens: int = 0


def step_record(completion, usage) -> dict:
    """A model reply and its usage as a journal (or a DBOS step) keeps them."""
    return {"completion": {"text": completion.text, "token_ids": list(completion.token_ids),
                           "finish_reason": completion.finish_reason, "complete": bool(completion.complete),
                           "truncated": bool(getattr(completion, "truncated", False))},
            "usage": {k: getattr(usage, k) for k in ReplayedUsage.__dataclass_fields__}}


def replayed_step(body: dict) -> tuple[ReplayedCompletion, ReplayedUsage]:
    return ReplayedCompletion(**body["completion"]), ReplayedUsage(**body["usage"])


class Journal:
    """Run journals in SQLite, in the folder `path` (made where missing)."""

    def __init__(self, path: str | Path):
        self.folder = Path(path)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.folder / "journal.db"), check_same_thread=False, isolation_level=None,
                                   timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, agent TEXT, key TEXT, input TEXT, "
                         "status TEXT, owner TEXT, created REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (run TEXT, kind TEXT, name TEXT, body TEXT, "
                         "PRIMARY KEY (run, kind, name))")
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(FORMAT),))
        (found,) = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        if found != str(FORMAT):
            raise JournalError(f"{self.folder} holds a journal of format {found}; this agentkv reads format {FORMAT}: "
                               "finish its runs with the agentkv that wrote them, or give another folder")
        self.worker = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def __repr__(self) -> str:
        return f"Journal({str(self.folder)!r})"

    def runs(self) -> list[dict]:
        """Every run kept: id, agent, status ("open", "done" or "failed")."""
        with self._lock:
            rows = self._db.execute("SELECT id, agent, status FROM runs ORDER BY created").fetchall()
        return [{"id": i, "agent": a, "status": s} for i, a, s in rows]

    def start(self, run_id: str, agent, input: Any, history: Any) -> RunJournal:
        """A new run's journal (a JournalError where the id is taken)."""
        if not isinstance(run_id, str) or not run_id:
            raise JournalError(f"run_id must be a non-empty string, not {run_id!r}")
        try:
            with self._lock:
                self._db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, 'open', ?, ?)",
                                 (run_id, agent.name, json.dumps(agent_key(agent)),
                                  json.dumps({"input": input, "history": history}), self.worker, time.time()))
        except sqlite3.IntegrityError:
            raise JournalError(f"run {run_id!r} is already in {self.folder}: resume it with agent.resume("
                               f"{run_id!r}), or give the new run another run_id") from None
        return RunJournal(self, run_id, {})

    def claim(self, run_id: str, agent) -> tuple[RunJournal, Any, Any]:
        """Resume `run_id`: (its journal, its input, its history), the run now this worker's."""
        with self._lock:
            row = self._db.execute("SELECT key, input, status, owner FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise JournalError(f"no run {run_id!r} in {self.folder}; start it with agent.run(..., run_id=...)")
            key, given, status, owner = row
            differs = [k for k, v in agent_key(agent).items() if json.loads(key).get(k) != v]
            if differs:
                raise JournalError(f"run {run_id!r} was journaled by an agent defined otherwise ({', '.join(differs)} "
                                   "differ): resume it with the agent that started it, or start a new run")
            if owner and owner != self.worker and _alive(owner):
                raise JournalError(f"run {run_id!r} is being run by another worker ({owner}); one worker resumes "
                                   "a run at a time")
            taken = self._db.execute("UPDATE runs SET owner = ? WHERE id = ? AND owner IS ?",
                                     (self.worker, run_id, owner)).rowcount
            if not taken:
                raise JournalError(f"run {run_id!r} was claimed by another worker meanwhile")
            records = {(k, n): json.loads(b) for k, n, b in self._db.execute(
                "SELECT kind, name, body FROM records WHERE run = ?", (run_id,)).fetchall()}
        given = json.loads(given)
        return RunJournal(self, run_id, records, status), given["input"], given["history"]

    def _write(self, run_id: str, kind: str, name: str, body: dict) -> None:
        """Record `body`, or stop the run: nothing is acted on that the journal could not keep."""
        with self._lock:
            owner = self._db.execute("SELECT owner FROM runs WHERE id = ?", (run_id,)).fetchone()
            if owner is None or owner[0] != self.worker:
                raise JournalError(f"run {run_id!r} was taken over by another worker; this one stops")
            try:
                self._db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?)",
                                 (run_id, kind, name, json.dumps(body)))
            except sqlite3.OperationalError as e:  # a full or read-only disk
                raise JournalError(f"run {run_id!r}: {self.folder} could not record its {kind} ({e}); the run stops "
                                   f"before acting on it: free the disk, then agent.resume({run_id!r})") from None

    def _end(self, run_id: str, status: str) -> None:
        with self._lock:
            self._db.execute("UPDATE runs SET status = ?, owner = NULL WHERE id = ? AND owner = ?",
                             (status, run_id, self.worker))

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RunJournal:
    """One run's records: what a resumed run reads back, and what a live one writes."""

    def __init__(self, journal: Journal, run_id: str, records: dict, status: str = "open"):
        self.journal, self.run_id, self.records, self.status = journal, run_id, records, status

    def step(self, index: int) -> tuple[ReplayedCompletion, ReplayedUsage] | None:
        body = self.records.get(("step", str(index)))
        return None if body is None else replayed_step(body)

    def record_step(self, index: int, completion, usage) -> None:
        self._put("step", str(index), step_record(completion, usage))

    def call(self, name: str) -> dict | None:
        """A call's record: {"state": "started"} or {"state": "done", the result}; None: never started."""
        return self.records.get(("call", name))

    def record_call(self, name: str, body: dict) -> None:
        self._put("call", name, body)

    def end(self, status: str) -> None:
        self.journal._end(self.run_id, status)

    def _put(self, kind: str, name: str, body: dict) -> None:
        self.journal._write(self.run_id, kind, name, body)
        self.records[(kind, name)] = body


def _alive(owner: str) -> bool:
    """Whether the worker `owner` (host:pid:tag) may still run: on this host, whether its process lives."""
    host, _, rest = owner.partition(":")
    if host != _HOST:
        return True  # another host's worker: assumed alive (its run is its own)
    try:
        os.kill(int(rest.split(":")[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
