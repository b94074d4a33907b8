"""Cache-aware routing across engine replicas (the policy; the Ray Serve deployment builds on it)."""

from agentkv.routing.policy import CacheAwareRouter, NoReplicaError, RouterConfig
from agentkv.routing.prefix_tree import PrefixTree

__all__ = ["CacheAwareRouter", "NoReplicaError", "PrefixTree", "RouterConfig"]
