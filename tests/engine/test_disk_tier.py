"""The KV disk tier (agentkv/engine/disk/): a prefix evicted to disk or written through on pin is read
back exactly, across a restart, and nothing damaged, torn, foreign or unwritable is ever served."""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentkv as ak
from agentkv.engine.disk import blocks as block_files
from agentkv.engine.disk import tier as tier_module
from agentkv.engine.disk.fingerprint import differences, fingerprint, tier_id
from tests.tiny import make_tiny_model

P = "".join(f"tool {i}: look things up, then answer tersely. " for i in range(6))[:256]  # 256 byte tokens
Q = "user: what is the capital of France?"
B = 64  # tokens a block (P is four)


def engine(model: Path, kv_dir=None, **kw) -> ak.Engine:
    """(Without the read-back at start, unless asked: these tests read blocks back when a request needs them;
    test_kv_durability.py tests the warm start.)"""
    if kv_dir is not None:
        kw = {"kv_dir": str(kv_dir), "kv_block_tokens": B, "kv_warm_fraction": 0.0, **kw}
    return ak.Engine(str(model), num_slots=2048, seed=0, **kw)


def answer(e: ak.Engine, prompt: str = P + Q):
    out = e.generate(prompt, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    c = out.completions[0]
    return c.token_ids, [(t.logprob, t.top) for t in c.logprobs], out.usage


@pytest.fixture(scope="module")
def cold(tiny_dir):
    """The answer of an engine without a tier: P computed as a prefix first, then P + Q."""
    with engine(tiny_dir) as e:
        e.prefill(P)
        warm = answer(e)
    with engine(tiny_dir) as e:
        whole = answer(e)
    return warm, whole


def test_evicted_prefix_is_read_back_bit_for_bit(tiny_dir, tmp_path, cold):
    with engine(tiny_dir, tmp_path) as e:
        assert e.prefill(P) == 256
        e.flush_cache()
        st = e.stats()
        assert st["cached_tokens"] == 0 and st["disk_blocks"] == 4 and st["disk_written_blocks"] == 4
        ids, logprobs, usage = answer(e)
        assert usage.cached_tokens == usage.disk_cached_tokens == 256
        assert (ids, logprobs) == cold[0][:2]  # the same bits as the prefix never evicted
        # served from the pool now: no second read
        again = answer(e)
        assert again[2].disk_cached_tokens == 0 and again[2].cached_tokens >= 256
        assert e.stats()["disk_restored_tokens"] == 256


def test_a_restarted_engine_serves_a_pinned_prompt_from_disk(tiny_dir, tmp_path, cold, caplog):
    with engine(tiny_dir, tmp_path) as e:
        e.pin(P)  # written through: nothing evicted it, yet it is on disk when the engine stops
    with caplog.at_level(logging.INFO, logger="agentkv"), engine(tiny_dir, tmp_path) as e:
        assert "4 blocks (256 tokens" in caplog.text
        ids, _, usage = answer(e)
        assert usage.disk_cached_tokens == 256 and ids == cold[1][0]  # greedy, as a cold engine's


def test_a_tier_of_another_model_is_ignored(tiny_dir, tmp_path, caplog):
    other = make_tiny_model(tmp_path / "other", seed=1)
    with engine(tiny_dir, tmp_path / "kv") as e:
        e.pin(P)
    with caplog.at_level(logging.WARNING, logger="agentkv"), engine(other, tmp_path / "kv") as e:
        _, _, usage = answer(e)
        assert usage.disk_cached_tokens == 0 and e.stats()["disk_restored_tokens"] == 0
    assert "another model setup (weights differ)" in caplog.text


def test_the_fingerprint_names_what_changed(tiny_dir, tmp_path):
    import shutil

    from agentkv.engine.model_config import ModelConfig

    mc = ModelConfig.from_hf(json.loads((tiny_dir / "config.json").read_text()))
    base = fingerprint(tiny_dir, mc, dtype="float32", kv_dtype="float32", quantized=False, native=True)
    copy = Path(shutil.copytree(tiny_dir, tmp_path / "copy"))
    tok = json.loads((copy / "tokenizer.json").read_text())
    tok["added_tokens"][0]["content"] = "<|other|>"
    (copy / "tokenizer.json").write_text(json.dumps(tok))
    changed = fingerprint(copy, mc, dtype="float32", kv_dtype="float32", quantized=False, native=True)
    assert differences(base, changed) == ["tokenizer"] and tier_id(base) != tier_id(changed)
    assert differences(base, fingerprint(tiny_dir, mc, dtype="float32", kv_dtype="bfloat16", quantized=False,
                                         native=True)) == ["kv_dtype"]
    rope = ModelConfig.from_hf({**json.loads((tiny_dir / "config.json").read_text()), "rope_theta": 5.0})
    assert differences(base, fingerprint(tiny_dir, rope, dtype="float32", kv_dtype="float32", quantized=False,
                                         native=True)) == ["architecture"]


def stored(tiny_dir, kv_dir) -> list[Path]:
    """P's four blocks written by one engine, which then stops; the block files in write order."""
    with engine(tiny_dir, kv_dir) as e:
        e.pin(P)
        e._tier.flush()
        return sorted(e._tier.dir.glob("*.kvb"), key=lambda p: json.loads(_header(p))["start"])


def _header(path: Path) -> bytes:
    raw = path.read_bytes()
    n = int.from_bytes(raw[6:10], "little")
    return raw[10 : 10 + n]


@pytest.mark.parametrize("damage", ["flipped", "cut", "header"])
def test_a_damaged_block_is_recomputed_with_one_warning(tiny_dir, tmp_path, cold, caplog, damage):
    files = stored(tiny_dir, tmp_path)
    victim = files[2]  # the third block: the first two are still served
    raw = bytearray(victim.read_bytes())
    if damage == "flipped":
        raw[-100] ^= 0x40
    elif damage == "cut":
        raw = raw[: len(raw) - 1000]
    else:
        raw[12] = ord("!")  # inside the JSON header
    victim.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="agentkv"), engine(tiny_dir, tmp_path) as e:
        ids, _, usage = answer(e)
        st = e.stats()
        removed = not victim.exists()  # (the close writes the block again, computed afresh)
    assert ids == cold[1][0]
    assert usage.disk_cached_tokens == 2 * B  # the blocks before the damaged one, never it or those after
    assert removed and len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert ("could not be served" in caplog.text and st["disk_errors"] == 1) if damage != "header" else (
        "unreadable KV block" in caplog.text)


def test_a_block_of_other_tokens_is_not_served(tiny_dir, tmp_path, cold):
    """A block whose tokens are not the prompt's (as a hash collision would give) is never read back."""
    victim = stored(tiny_dir, tmp_path)[2]
    raw = victim.read_bytes()
    header = json.loads(_header(victim))
    header["tokens"][5] += 1
    body = json.dumps(header, separators=(",", ":")).encode()
    victim.write_bytes(raw[:6] + len(body).to_bytes(4, "little") + body + raw[10 + len(_header(victim)):])
    with engine(tiny_dir, tmp_path) as e:
        ids, _, usage = answer(e)
    assert ids == cold[1][0] and usage.disk_cached_tokens == 2 * B


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_an_unwritable_disk_leaves_the_engine_serving(tiny_dir, tmp_path, cold, caplog, monkeypatch, fault):
    code = errno.EROFS if fault == "read-only" else errno.ENOSPC

    def refuse(directory, header, payload):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tier_module, "write_block", refuse)
    with caplog.at_level(logging.WARNING, logger="agentkv"), engine(tiny_dir, tmp_path) as e:
        e.prefill(P)
        e.flush_cache()
        ids, logprobs, usage = answer(e)
        e.flush_cache()
        assert (ids, logprobs) == cold[1][:2] and usage.disk_cached_tokens == 0
        assert e.stats()["disk_blocks"] == 0 and e.stats()["disk_errors"] >= 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and os.strerror(code) in warnings[0], warnings


def test_a_read_only_directory_is_still_read(tiny_dir, tmp_path, cold, caplog):
    stored(tiny_dir, tmp_path)
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only directories")
    tier_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    tier_dir.chmod(0o555)
    try:
        with engine(tiny_dir, tmp_path) as e:
            ids, _, usage = answer(e)
            assert usage.disk_cached_tokens == 256 and ids == cold[1][0] and not e._tier.writable
    finally:
        tier_dir.chmod(0o755)


def test_a_zero_budget_writes_nothing(tiny_dir, tmp_path, cold):
    with engine(tiny_dir, tmp_path, kv_disk_bytes=0) as e:
        e.prefill(P)
        e.flush_cache()
        ids, logprobs, usage = answer(e)
        assert (ids, logprobs) == cold[1][:2] and usage.disk_cached_tokens == 0 and e.stats()["disk_blocks"] == 0
    assert not list(tmp_path.rglob("*.kvb"))


def test_the_budget_keeps_the_most_recent_blocks(tiny_dir, tmp_path):
    with engine(tiny_dir, tmp_path) as e:
        size = e._tier.layout.nbytes(B) + 600  # a block and its header
    with engine(tiny_dir, tmp_path, kv_disk_bytes=6 * size) as e:
        for i in range(4):  # 4 prefixes of 2 blocks each through a budget of 6
            e.prefill(f"{i}" * 128)
            e.flush_cache()
        st = e.stats()
        assert st["disk_blocks"] == 6 and st["disk_bytes"] <= 6 * size
        # the first prefix's blocks went first; the last one's are read back
        assert answer(e, "3" * 128 + Q)[2].disk_cached_tokens == 128
        assert answer(e, "0" * 128 + Q)[2].disk_cached_tokens == 0


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import agentkv as ak
    from agentkv.engine.disk import tier

    def torn(directory, header, payload):
        tmp = directory / f"{header.digest}.{__import__('os').getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(header.encode())
            f.write(payload[: len(payload) // 2])
            f.flush()
        print("writing", flush=True)
        time.sleep(60)

    tier.write_block = torn
    e = ak.Engine(sys.argv[1], num_slots=2048, kv_dir=sys.argv[2], kv_block_tokens=64)
    e.pin(sys.argv[3])
    time.sleep(60)
""")


def test_a_writer_killed_mid_write_leaves_nothing_served(tiny_dir, tmp_path, cold, caplog):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tiny_dir), str(tmp_path), P],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        assert ready and proc.stdout.readline().strip() == "writing"
    finally:
        proc.kill()  # SIGKILL: no handler, no cleanup
        proc.wait()
    assert list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.kvb"))
    with caplog.at_level(logging.WARNING, logger="agentkv"), engine(tiny_dir, tmp_path) as e:
        ids, _, usage = answer(e)
        assert ids == cold[1][0] and usage.disk_cached_tokens == 0
        e.flush_cache()
    assert not list(tmp_path.rglob("*.tmp")) and "unfinished" in caplog.text
    assert len(list(tmp_path.rglob("*.kvb"))) == 4  # this run wrote its own


def test_block_files_refuse_other_tokens(tmp_path):
    """A block is served only for the tokens it holds: the header's tokens and shape must be the ones
    the index expects, whatever the file's name."""
    from crc32c import crc32c

    payload = memoryview(bytes(range(16)))
    header = block_files.BlockHeader("ab" * 16, "", "t", 0, (1, 2), (2, 1, 2, 1, 1), "float32", 16,
                                     crc32c(payload))
    path = block_files.write_block(tmp_path, header, payload)
    into = bytearray(16)
    block_files.read_block(path, header, memoryview(into))
    assert bytes(into) == bytes(range(16))
    with pytest.raises(block_files.BlockError, match="tokens differs"):
        block_files.read_block(path, block_files.BlockHeader(**{**header.__dict__, "tokens": (1, 3)}),
                               memoryview(into))


def test_a_pool_too_small_for_its_prefixes_gives_the_same_outputs(tiny_dir, tmp_path):
    """Four agents' prompts through a pool that holds about two, concurrently, three rounds: with the
    tier their prefixes come back from disk (under evictions, retractions and restores in one step)
    and every output equals the one computed without it."""
    from agentkv.kernels import cpu_native

    if cpu_native.load() is None:  # (equal bits are the C kernels' property: each token computed as alone)
        pytest.skip("torch's ops give a token numbers that depend on how its pass groups tokens (the same "
                    "prompts with the radix cache off differ by up to 0.006 in logprob here)")
    prompts = [f"agent {i}: " + "".join(f"step {j} of agent {i}. " for j in range(14)) for i in range(4)]

    def rounds(kv_dir=None):
        outs = []
        kw = {"kv_dir": str(kv_dir), "kv_block_tokens": 16} if kv_dir else {}
        with ak.Engine(str(tiny_dir), num_slots=700, seed=0, **kw) as e:
            for r in range(3):
                outs += [(o.completions[0].token_ids, [t.logprob for t in o.completions[0].logprobs])
                         for o in e.generate([p + f" round {r}" for p in prompts], max_tokens=16, temperature=0,
                                             logprobs=True)]
            return outs, e.stats()

    plain, _ = rounds()
    tiered, st = rounds(tmp_path)
    assert tiered == plain
    assert st["disk_restored_tokens"] > 0 and st["disk_errors"] == 0


def test_options_that_cannot_hold_a_disk_tier_are_refused(tiny_dir, tmp_path):
    with pytest.raises(ak.RequestError, match="enable_radix_cache"):
        ak.Engine(str(tiny_dir), kv_dir=str(tmp_path), enable_radix_cache=False)
    with pytest.raises(ak.RequestError, match="tensor_parallel"):
        ak.Engine(str(tiny_dir), kv_dir=str(tmp_path), tensor_parallel=2)
    with pytest.raises(ak.RequestError, match="kv_disk_bytes"):
        ak.Engine(str(tiny_dir), kv_dir=str(tmp_path), kv_disk_bytes=-1)


def test_a_waiting_request_reads_its_prefix_ahead(tiny_dir, tmp_path):
    """With one request running at a time, the second waits: its blocks are read while it waits and
    copied in at its admission, giving what the same prefix gives computed."""
    prefixes = [P, P[::-1]]
    with engine(tiny_dir) as e:
        for p in prefixes:
            e.prefill(p)
        want = [answer(e, p + Q)[:2] for p in prefixes]
    with engine(tiny_dir, tmp_path, max_running_requests=1) as e:
        for p in prefixes:
            e.pin(p)
        e.flush_cache()  # (pinned: still in the pool)
        for h in e.pins():
            e.unpin(h)
        assert e.flush_cache() == 2 * 256
        outs = e.generate([p + Q for p in prefixes], max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
        assert e.stats()["disk_read_ahead_blocks"] == 256 // B  # the second's, read while the first ran
    got = [(o.completions[0].token_ids, [(t.logprob, t.top) for t in o.completions[0].logprobs]) for o in outs]
    assert got == want and [o.usage.disk_cached_tokens for o in outs] == [256, 256]
