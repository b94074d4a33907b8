"""KV that survives the ways a process ends: the pool written to the disk tier at close (the most
recently used prefix first, within kv_flush_timeout), a prefix hit twice written through as it is used
(so SIGKILL loses little), and a restarted engine reading its hottest prefixes back into the pool at
start. Each answer is the one a cold engine gives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentkv.engine.kv_owner import KVOwner
from tests.engine.test_disk_tier import B, P, Q, answer, engine

OTHER = "".join(f"note {i}: keep it short and plain. " for i in range(8))[:192]  # three blocks


@pytest.fixture(scope="module")
def cold_ids(tiny_dir):
    with engine(tiny_dir) as e:
        return answer(e)[0], answer(e, OTHER + Q)[0]


def test_close_writes_the_pool_to_disk(tiny_dir, tmp_path, cold_ids):
    with engine(tiny_dir, tmp_path) as e:
        answer(e)  # nothing pinned, nothing evicted: only the pool holds it
        assert e.stats()["disk_blocks"] == 0
    with engine(tiny_dir, tmp_path) as e:
        ids, _, usage = answer(e)
        assert usage.disk_cached_tokens == 256 and ids == cold_ids[0]


def test_close_writes_the_hottest_prefix_first_within_its_time(tiny_dir, tmp_path, monkeypatch):
    order = []
    spill = KVOwner._spill
    monkeypatch.setattr(KVOwner, "_spill", lambda self, node, whole: (order.append(self.tree.path(node)[0][:4]),
                                                                    spill(self, node, whole))[1])
    with engine(tiny_dir, tmp_path) as e:
        for prompt in (OTHER + Q, P + Q, "a third prompt, short " * 8):
            answer(e, prompt)
        tok = e.tokenizer
        expected = [tok.encode(p)[:4] for p in ("a third prompt, short " * 8, P, OTHER)]
        order.clear()
    assert order == expected  # most recently used first
    order.clear()
    with engine(tiny_dir, tmp_path / "none", kv_flush_timeout=0) as e:
        answer(e)
    assert order == []  # no time to write: the close writes nothing more


KILLED = textwrap.dedent("""
    import os, signal, sys, time
    import agentkv as ak
    e = ak.Engine(sys.argv[1], num_slots=2048, seed=0, kv_dir=sys.argv[2], kv_block_tokens=64, kv_warm_fraction=0.0)
    for prompt in sys.argv[3:]:
        e.generate(prompt, max_tokens=12, temperature=0)
    time.sleep(2)  # (the writer thread's few milliseconds)
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no handler: as an OOM kill
""")


def test_a_prefix_used_twice_survives_sigkill(tiny_dir, tmp_path, cold_ids):
    # P + Q asked twice (the second a hit: written through), OTHER + Q once (kept in the pool only)
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tiny_dir), str(tmp_path), P + Q, P + Q, OTHER + Q],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=300)
    assert proc.returncode == -signal.SIGKILL and "ready" in proc.stdout, proc.stderr
    with engine(tiny_dir, tmp_path) as e:
        ids, _, usage = answer(e)
        assert usage.disk_cached_tokens >= 256 and ids == cold_ids[0]
        other = answer(e, OTHER + Q)
        assert other[2].disk_cached_tokens == 0 and other[0] == cold_ids[1]  # used once: not written


def test_a_restarted_engine_reads_its_hottest_prefixes_back_at_start(tiny_dir, tmp_path, cold_ids):
    with engine(tiny_dir, tmp_path) as e:
        answer(e)
    with engine(tiny_dir, tmp_path, kv_warm_fraction=0.5) as e:
        deadline = time.monotonic() + 60
        while e.stats()["cached_tokens"] < 256 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert e.stats()["cached_tokens"] >= 256  # resident before anything asked for it
        ids, _, usage = answer(e)
        assert usage.cached_tokens >= 256 and usage.disk_cached_tokens == 0 and ids == cold_ids[0]


def test_the_warm_start_takes_no_more_than_its_share(tiny_dir, tmp_path):
    with engine(tiny_dir, tmp_path) as e:
        answer(e)
        answer(e, OTHER + Q)
    share = 0.1  # of 2,048 slots: 204, less than either prefix's whole blocks
    with engine(tiny_dir, tmp_path, kv_warm_fraction=share) as e:
        time.sleep(1.0)
        assert e.stats()["cached_tokens"] <= 2048 * share


def test_sigterm_on_a_server_keeps_its_prompts(tiny_long_dir, tmp_path):
    """`agentkv serve` stopped as a deploy stops it: a restart serves the same prompt from disk."""
    openai = pytest.importorskip("openai")
    from tests.server.test_server import free_port

    system = "You are the durability test's agent. " + "Tools: lookup, convert, schedule, notify. " * 12
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Which tool converts?"}]
    replies = []
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-c", "from agentkv.cli.main import app; app()", "serve", "--model",
                                 str(tiny_long_dir), "--port",
                                 str(port), "--kv-dir", str(tmp_path), "--num-slots", "4096"],
                                cwd=Path(__file__).parents[2], stderr=subprocess.PIPE, text=True)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
            deadline = time.monotonic() + 120
            while True:
                try:
                    r = client.chat.completions.create(model=tiny_long_dir.name, messages=messages, max_tokens=6,
                                                       temperature=0.0)
                    break
                except openai.APIConnectionError:
                    assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                    time.sleep(0.3)
            replies.append(r)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # (uvicorn ends by the signal it took)
    first, second = replies
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= len(system) - B  # from disk, or read back at start
    assert second.choices[0].message.content == first.choices[0].message.content
    assert os.listdir(tmp_path)


def wait_for(check, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_pins_and_their_leases_come_back_after_a_restart(tiny_dir, tmp_path, cold_ids):
    with engine(tiny_dir, tmp_path) as e:
        e.pin(P, ttl_s=600)
        e.pin(OTHER, ttl_s=900)
        e.pin("a pin whose lease ends while the engine is down " * 2, ttl_s=0.5)
        e.pin("a pin without a lease: its handle's, gone with the process " * 2)
    time.sleep(1.0)
    with engine(tiny_dir, tmp_path) as e:
        assert wait_for(lambda: len(e.pins()) == 2)  # (the third ran out meanwhile; the fourth had no owner left)
        time.sleep(0.5)
        assert sorted(p.num_tokens for p in e.pins()) == [192, 256]
        leases = e._core.call(lambda: sorted(e._tree.leases.lease(i) for i in e._tree._pins)).result()
        assert [ttl for ttl, _ in leases] == [600, 900] and all(ttl - 10 < left <= ttl - 1 for ttl, left in leases)
        ids, _, usage = answer(e)
        assert usage.cached_tokens >= 256 and usage.disk_cached_tokens == 0 and ids == cold_ids[0]
        e.flush_cache()  # pinned: nothing of them leaves the pool
        assert e.stats()["pinned_tokens"] == 448
