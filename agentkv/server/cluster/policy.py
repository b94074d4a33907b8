"""Cache-aware routing across engine replicas: send a request where its prefix already is.

Round-robin throws the radix cache away: every replica ends up recomputing every agent's system
prompt. This policy keeps an approximate prefix tree of what each replica was sent (prefix_tree.py)
and decides, per request:

1. a pinned prefix's requests go to the replica that holds the pin (pins follow their agents), and
   what reads or continues a stored response to the replica that stores it (`holder`);
2. when load is imbalanced (the longest and shortest queues differ by more than `balance_abs` and
   by a factor over `balance_rel`), to the least loaded replica;
3. otherwise to the replica with the longest match, when it covers more than `cache_threshold` of
   the text; below that (a new prefix), to the least loaded, ties to the one that holds least, so
   new prefixes spread over the replicas.

It is pure Python and knows nothing of Ray: the serving layer reports loads (`started`/`finished`
or `set_load`), failures (`mark_failed`) and new replicas (`add_replica`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from agentkv.errors import EngineError
from agentkv.server.cluster.prefix_tree import PrefixTree

MAX_RESPONSES = 1 << 20  # stored responses remembered (their ids), across all replicas


class NoReplicaError(EngineError):
    """No healthy replica is left to serve the request."""


@dataclass(frozen=True)
class RouterConfig:
    cache_threshold: float = 0.5  # route by prefix when the best match covers more than this share of the text
    balance_abs: int = 32  # imbalanced when the queues differ by more than this many requests ...
    balance_rel: float = 1.5  # ... and the longest is more than this many times the shortest
    max_chars_per_replica: int = 2_000_000  # prefix-tree budget per replica (characters)


class CacheAwareRouter:
    """The routing decisions (see the module docstring). Not thread-safe: one router per event loop."""

    def __init__(self, replicas: list[str], config: RouterConfig = RouterConfig()):
        if not replicas:
            raise NoReplicaError("a router needs at least one replica")
        self.config = config
        self.tree = PrefixTree(config.max_chars_per_replica)
        self.load: dict[str, int] = {r: 0 for r in replicas}
        self.pins: dict[str, str] = {}  # pinned prefix text -> replica
        self.responses: OrderedDict[str, str] = OrderedDict()  # stored response id -> the replica holding it
        self.sessions: OrderedDict[str, str] = OrderedDict()  # prompt_cache_key -> the replica its turns go to

    # -- what the serving layer reports -----------------------------------------------------------------

    def add_replica(self, replica: str) -> None:
        self.load.setdefault(replica, 0)

    def mark_failed(self, replica: str) -> None:
        """Take a replica out: it gets no more requests, and its pins are re-placed on their next use."""
        self.load.pop(replica, None)
        self.tree.remove_replica(replica)
        self.pins = {p: r for p, r in self.pins.items() if r != replica}
        self.responses = OrderedDict((k, r) for k, r in self.responses.items() if r != replica)
        self.sessions = OrderedDict((k, r) for k, r in self.sessions.items() if r != replica)

    def started(self, replica: str) -> None:
        if replica in self.load:  # a failed replica stays out until add_replica
            self.load[replica] += 1

    def finished(self, replica: str) -> None:
        if replica in self.load:
            self.load[replica] = max(0, self.load[replica] - 1)

    def set_load(self, replica: str, queue_length: int) -> None:
        if replica in self.load:
            self.load[replica] = queue_length

    # -- decisions -------------------------------------------------------------------------------------

    def route(self, text: str) -> str:
        """The replica for a request whose rendered prompt is `text` (recorded as sent there)."""
        replica = self.choose(text)
        self.sent(text, replica)
        return replica

    def choose(self, text: str) -> str:
        """The replica for `text`, not recorded: for a serving layer that may send it elsewhere (a
        full replica) and then reports where it went with `sent`."""
        return self._pinned(text) or self._choose(text)

    def sent(self, text: str, replica: str) -> None:
        """`text` went to `replica`: its prefixes are expected in that replica's cache from now on."""
        if replica in self.load:
            self.tree.insert(text, replica)

    def pin(self, prefix: str, replica: str | None = None) -> str:
        """Keep `prefix`'s requests on one replica (the given one, or where routing puts it now)."""
        if replica is not None and replica not in self.load:
            raise NoReplicaError(f"cannot pin to {replica!r}: not a healthy replica ({sorted(self.load)})")
        replica = replica or self.route(prefix)
        self.pins[prefix] = replica
        return replica

    def unpin(self, prefix: str) -> None:
        self.pins.pop(prefix, None)

    def stored(self, response_id: str, replica: str) -> None:
        """`replica` stores the response `response_id`: what reads or continues it goes there. The
        oldest are forgotten past MAX_RESPONSES (a replica keeps fewer than that itself)."""
        self.responses[response_id] = replica
        self.responses.move_to_end(response_id)
        while len(self.responses) > MAX_RESPONSES:
            self.responses.popitem(last=False)

    def session(self, key: str, replica: str | None = None) -> str | None:
        """The healthy replica session `key`'s turns go to (where its conversation is pinned); with
        `replica`, record that its latest turn went there."""
        if replica is not None:
            self.sessions[key] = replica
            self.sessions.move_to_end(key)
            while len(self.sessions) > MAX_RESPONSES:
                self.sessions.popitem(last=False)
        held = self.sessions.get(key)
        return held if held in self.load else None

    def holder(self, response_id: str) -> str | None:
        """The healthy replica that stores `response_id` (None: unknown, or its replica failed)."""
        replica = self.responses.get(response_id)
        return replica if replica in self.load else None

    def _pinned(self, text: str) -> str | None:
        best = max((p for p in self.pins if text.startswith(p)), key=len, default=None)
        return None if best is None else self.pins[best]

    def _choose(self, text: str) -> str:
        if not self.load:
            raise NoReplicaError("no healthy replica left: every replica failed or was removed")
        cfg = self.config
        lo, hi = min(self.load.values()), max(self.load.values())
        if hi - lo > cfg.balance_abs and hi > cfg.balance_rel * lo:
            return self._least_loaded()
        matches = {r: n for r, n in self.tree.match(text).items() if r in self.load}
        if matches and text:
            best = max(matches, key=lambda r: (matches[r], -self.load[r]))
            if matches[best] / len(text) > cfg.cache_threshold:
                return best
        return self._least_loaded()

    def _least_loaded(self) -> str:
        return min(self.load, key=lambda r: (self.load[r], self.tree.chars.get(r, 0), r))
