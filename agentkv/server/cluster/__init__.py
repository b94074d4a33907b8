"""`agentkv serve --replicas N`: the same routes over engine replicas on Ray Serve.

The cache-aware policy (policy.py, over an approximate prefix tree per replica: prefix_tree.py) is
pure Python, as is what it keys a request by (request_keys.py); the rest needs the `cluster` extra:
ray_router.py runs the policy as Ray Serve's request router, handle.py is the routes' engine handle over
the replicas, and deploy.py the replicas, the ingress that serves the routes, and `serve_cluster`.
"""

from agentkv.server.cluster.policy import CacheAwareRouter, NoReplicaError, RouterConfig
from agentkv.server.cluster.prefix_tree import PrefixTree
from agentkv.server.cluster.request_keys import body_text, session_key

__all__ = ["CacheAwareRouter", "NoReplicaError", "PrefixTree", "RouterConfig", "body_text", "session_key"]
