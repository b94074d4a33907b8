"""Cache-aware routing: the prefix tree against a brute-force model, and the policy's decisions."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.server.cluster import CacheAwareRouter, NoReplicaError, PrefixTree, RouterConfig

SYSTEM_A = "You are agent A. Tools: search(query), fetch(url). " * 4
SYSTEM_B = "You are agent B. Tools: add(a, b), mul(a, b). " * 4


def tree_chars(tree: PrefixTree) -> dict[str, int]:
    """Characters each replica marks, recounted by walking the tree."""
    out: dict[str, int] = {}
    stack = [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        for r in node.marks:
            out[r] = out.get(r, 0) + len(node.edge)
    return out


def common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r0", "r1", "r2"]), st.text(alphabet="abc", min_size=1, max_size=12)),
                min_size=1, max_size=40),
       st.text(alphabet="abc", max_size=12))
def test_prefix_tree_matches_brute_force_without_eviction(inserts, probe):
    tree = PrefixTree(max_chars_per_replica=10**6)
    for replica, text in inserts:
        tree.insert(text, replica)
    expected: dict[str, int] = {}
    for replica, text in inserts:
        n = common(text, probe)
        if n:
            expected[replica] = max(expected.get(replica, 0), n)
    assert tree.match(probe) == expected
    assert tree.chars == {r: tree_chars(tree).get(r, 0) for r in tree.chars}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r0", "r1"]), st.text(alphabet="abcd", min_size=1, max_size=15)),
                min_size=1, max_size=60),
       st.integers(5, 40))
def test_prefix_tree_eviction_keeps_the_bound_and_the_latest(inserts, budget):
    tree = PrefixTree(max_chars_per_replica=budget)
    for replica, text in inserts:
        tree.insert(text, replica)
        # The accounting is exact, the bound holds after every insert, and the text just sent is
        # still matched in full unless it alone is over the budget.
        assert tree.chars == {r: tree_chars(tree).get(r, 0) for r in tree.chars}
        assert all(c <= budget for c in tree.chars.values())
        if len(text) <= budget:
            assert tree.match(text).get(replica) == len(text)
    tree.remove_replica("r0")
    assert "r0" not in tree_chars(tree) and all("r0" not in m for m in [tree.match(t) for _, t in inserts])


def test_longest_prefix_match_wins():
    router = CacheAwareRouter(["r0", "r1"])
    assert router.route(SYSTEM_A + "user: hi") == "r0"  # empty: least loaded, ties by name
    assert router.route(SYSTEM_B + "user: hi") == "r1"  # no match for B: least loaded tree goes next
    for turn in range(5):
        assert router.route(SYSTEM_A + f"user: question {turn}") == "r0"
        assert router.route(SYSTEM_B + f"user: question {turn}") == "r1"


def test_a_short_match_goes_to_the_least_loaded():
    router = CacheAwareRouter(["r0", "r1"], RouterConfig(cache_threshold=0.5))
    router.route("shared start, then a long and different tail " * 3)
    router.started("r0")
    # Only "shared start" in common: under half the text, so the cache does not decide.
    assert router.route("shared start" + " something else entirely" * 6) == "r1"


def test_imbalance_falls_back_to_the_least_loaded():
    router = CacheAwareRouter(["r0", "r1"], RouterConfig(balance_abs=4, balance_rel=1.5))
    assert router.route(SYSTEM_A + "user: 1") == "r0"
    for _ in range(10):
        router.started("r0")
    assert router.route(SYSTEM_A + "user: 2") == "r1"  # r0 holds the prefix but has 10 queued vs 0
    for _ in range(8):
        router.finished("r0")
    assert router.route(SYSTEM_A + "user: 3") in ("r0", "r1")  # 2 vs 0: balanced; both hold A now
    router.set_load("r1", 3)
    assert router.route(SYSTEM_A + "user: 4") == "r0"


def test_failed_replica_is_removed():
    router = CacheAwareRouter(["r0", "r1"])
    assert router.route(SYSTEM_A + "user: 1") == "r0"
    router.mark_failed("r0")
    assert router.route(SYSTEM_A + "user: 2") == "r1"
    assert "r0" not in router.tree.match(SYSTEM_A)
    router.mark_failed("r1")
    with pytest.raises(NoReplicaError, match="no healthy replica"):
        router.route("anything")


def test_sessions_and_stored_responses_stay_with_their_replica():
    """A prompt_cache_key's turns and a stored response's reads go to the replica recorded for them,
    while it is healthy; a failed replica's records go with it."""
    router = CacheAwareRouter(["r0", "r1"])
    assert router.session("s1") is None and router.holder("resp_1") is None
    router.session("s1", "r1")
    router.stored("resp_1", "r1")
    assert router.session("s1") == "r1" and router.holder("resp_1") == "r1"
    router.session("s1", "r0")  # its latest turn went elsewhere (r1 was full): follow it
    assert router.session("s1") == "r0"
    router.mark_failed("r1")
    assert router.holder("resp_1") is None and router.session("s1") == "r0"


def test_pins_follow_their_agents():
    router = CacheAwareRouter(["r0", "r1"], RouterConfig(balance_abs=2))
    assert router.pin(SYSTEM_B, "r1") == "r1"
    router.set_load("r1", 50)  # heavily loaded, and the request is new text after the pin
    assert router.route(SYSTEM_B + "user: anything") == "r1"
    assert router.route(SYSTEM_A + "user: anything") == "r0"
    router.unpin(SYSTEM_B)
    assert router.route(SYSTEM_B + "user: again") == "r0"  # imbalance decides again
    with pytest.raises(NoReplicaError, match="not a healthy replica"):
        router.pin(SYSTEM_A, "r9")
    router.pin(SYSTEM_A, "r0")
    router.mark_failed("r0")
    assert router.route(SYSTEM_A + "user: after the failure") == "r1"


@functools.cache
def _routing_benchmark():
    """benchmarks/routing.py as a module (its ceiling of the hit rate is checked here); the paths it
    puts on sys.path for its own imports are taken off again."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "routing.py"
    spec = importlib.util.spec_from_file_location("routing_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc", min_size=1, max_size=10), st.text(alphabet="abc", max_size=4)),
                min_size=1, max_size=30))
def test_best_hit_rate_matches_brute_force(requests):
    bench = _routing_benchmark()
    sent = [(prompt, prompt + output) for prompt, output in requests]
    cached = 0
    for i, (prompt, _) in enumerate(sent):
        best = max((common(prompt, whole) for _, whole in sent[:i]), default=0)
        cached += min(best, len(prompt) - 1)
    assert bench.best_hit_rate(sent) == pytest.approx(cached / sum(len(p) for p, _ in sent))


def test_an_adapters_requests_and_sessions_are_routed_apart_from_the_bases():
    """The router keys a request by the model it names, then its prompt: a LoRA adapter's turns stay on the
    replica that holds that adapter's prefix, never taken for the base's (its KV differs), and a
    prompt_cache_key session is one per model."""
    from agentkv.server.cluster import body_text, session_key

    def body(model: str, turn: int) -> dict:
        return {"model": model, "messages": [{"role": "system", "content": SYSTEM_A},
                                             {"role": "user", "content": f"question {turn}"}],
                "prompt_cache_key": "s1"}

    assert body_text(body("tiny", 0)) != body_text(body("support", 0))
    assert body_text(body("support", 0)).startswith("support\n")
    assert session_key(body("tiny", 0)) != session_key(body("support", 0))
    router = CacheAwareRouter(["r0", "r1"])
    assert router.route(body_text(body("tiny", 0))) == "r0"
    assert router.route(body_text(body("support", 0))) == "r1"  # no prefix of the base's is the adapter's
    for turn in range(1, 6):
        assert router.route(body_text(body("support", turn))) == "r1"
        assert router.route(body_text(body("tiny", turn))) == "r0"
