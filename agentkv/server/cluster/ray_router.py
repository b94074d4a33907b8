"""The cache-aware policy as a Ray Serve request router (Ray Serve's custom request router API).

Ray Serve calls `choose_replicas` with the replicas that can take a request and the request itself
(`pending_request.args[0]` is the OpenAI request body the ingress forwards); the policy ranks the
replica it picks first and the others after it, so Ray falls back to them when the first is full.
Where the request really went, and when it finished, come back through `on_request_routed` and
`on_request_completed`; replicas that die or are removed leave the prefix tree.

The tree is keyed by text, not token ids: the router runs in Ray's proxy/handle processes, which have
no tokenizer, and a request's text prefix (tools, then messages in order) is a stable stand-in for
the rendered prompt's token prefix. Each router process keeps its own tree: with one ingress, as
`agentkv serve --replicas` deploys it, that is the whole picture.

Needs `pip install 'agentkv[cluster]'` (Ray Serve).
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from agentkv.server.cluster.policy import CacheAwareRouter, RouterConfig
from agentkv.server.cluster.request_keys import body_text, session_key

# keys the ingress adds to a body that creates ("create") or deletes ("delete") a pin of its prefix
PIN, PIN_ID = "agentkv_pin", "agentkv_pin_id"
# the stored response a body creates, the one it reads or continues, and a replica by its index
RESPONSE_ID, RESPONSE_OF, REPLICA = "agentkv_response_id", "agentkv_response_of", "agentkv_replica"


def request_text(pending: PendingRequest | None) -> str | None:
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return None
    return body_text(pending.args[0])


def body_of(pending: PendingRequest | None) -> dict:
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return {}
    return pending.args[0]


def pin_op(pending: PendingRequest | None) -> str | None:
    return body_of(pending).get(PIN)


class CacheAwareRequestRouter(FIFOMixin, RequestRouter):
    """`request_router_kwargs` are RouterConfig fields (cache_threshold, balance_abs, ...)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._config = RouterConfig(**kwargs)
        self._policy: CacheAwareRouter | None = None
        self._routed: set[str] = set()  # internal ids of requests counted in the policy's load

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        ids = {r.replica_id.to_full_id_str() for r in replicas}
        if self._policy is None:
            self._policy = CacheAwareRouter(sorted(ids), self._config) if ids else None
            return
        for gone in set(self._policy.load) - ids:
            self._policy.mark_failed(gone)
        for new in ids - set(self._policy.load):
            self._policy.add_replica(new)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        if self._policy is not None:
            self._policy.mark_failed(replica_id.to_full_id_str())

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if self._policy is None or not candidate_replicas:
            return [candidate_replicas]
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        body = body_of(pending_request)
        target = self._addressed(body)
        if target is not None:  # only that replica can answer: wait for it (an empty choice makes Ray retry)
            return [[by_id[target]]] if target in by_id else []
        key = session_key(body)
        if key is not None and by_id.get(self._policy.session(key) or "") is not None:
            sticky = by_id[self._policy.session(key)]  # a session's turns where its conversation is pinned
            return [[sticky], [r for r in candidate_replicas if r is not sticky]]
        text = request_text(pending_request)
        if text is None:
            return [candidate_replicas]
        chosen = by_id.get(self._policy.choose(text))
        if pin_op(pending_request) == "delete":
            # only the pinned replica holds it: wait for it (an empty choice makes Ray retry)
            return [[chosen]] if chosen is not None else []
        if chosen is None:  # the policy's pick cannot take it now: Ray picks among the rest by queue length
            return [candidate_replicas]
        return [[chosen], [r for r in candidate_replicas if r is not chosen]]

    def _addressed(self, body: dict) -> str | None:
        """The one replica a request must go to: the one stats were asked of (by index, in the order
        of the replicas' ids), or the one that stores the response it reads or continues."""
        if isinstance(body.get(REPLICA), int):
            replicas = sorted(self._policy.load)
            return replicas[body[REPLICA] % len(replicas)] if replicas else None
        of = body.get(RESPONSE_OF)
        return self._policy.holder(of) if isinstance(of, str) else None  # unknown: any replica answers 404

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        if self._policy is None:
            return
        replica = replica_id.to_full_id_str()
        body = body_of(pending_request)
        if isinstance(body.get(RESPONSE_ID), str):  # the response it creates is stored there
            self._policy.stored(body[RESPONSE_ID], replica)
        if session_key(body) is not None:  # the session's conversation is pinned there
            self._policy.session(session_key(body), replica)
        text = request_text(pending_request)
        if text is None:
            return
        op = pin_op(pending_request)
        if op == "create":  # requests starting with this prefix go where it is pinned
            self._policy.pin(text, replica)
        elif op == "delete":
            self._policy.unpin(text)
        self._policy.sent(text, replica)
        self._policy.started(replica)
        self._routed.add(pending_request.metadata.internal_request_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if internal_request_id in self._routed and self._policy is not None:
            self._routed.discard(internal_request_id)
            self._policy.finished(replica_id.to_full_id_str())
