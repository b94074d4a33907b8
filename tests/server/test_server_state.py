"""Stored responses through a restart (`--state-dir`, server/state.py): a conversation continued with
previous_response_id after the server stopped gets the answer an uninterrupted server gives, from
cache (the KV on disk); without the state, the id is a 404."""

from __future__ import annotations

import sqlite3

import pytest

import agentkv as ak
from agentkv.server import create_app
from tests.server.test_server import KEY, serving

openai = pytest.importorskip("openai")

FIRST = "You are a terse assistant. " * 12 + "Name a color."
SECOND = "And another one?"


def turn(base: str, text: str, previous: str | None = None):
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    return client.responses.create(model="tiny", input=text, previous_response_id=previous, max_output_tokens=8,
                                   temperature=0.0)


def server(model, tmp_path, state: bool):
    engine = ak.Engine(str(model), num_slots=4096, kv_dir=str(tmp_path / "kv"), kv_warm_fraction=0.0)
    return engine, create_app(engine, "tiny", KEY, state_dir=str(tmp_path / "state") if state else None)


def test_a_continued_response_works_across_a_restart(tiny_long_dir, tmp_path):
    engine, app = server(tiny_long_dir, tmp_path / "uninterrupted", state=False)
    with serving(app) as base:
        ref = turn(base, SECOND, turn(base, FIRST).id)
    engine.close()
    engine, app = server(tiny_long_dir, tmp_path, state=True)
    with serving(app) as base:
        first = turn(base, FIRST)
    engine.close()  # (as `agentkv serve` closes it at SIGTERM: the conversation's KV written to disk)
    engine, app = server(tiny_long_dir, tmp_path, state=True)
    try:
        with serving(app) as base:
            second = turn(base, SECOND, first.id)
    finally:
        engine.close()
    assert second.output_text == ref.output_text and second.status == ref.status
    # the first turn's whole 16-token blocks, from disk
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + 8 - 16
    rows = sqlite3.connect(str(tmp_path / "state" / "responses.db")).execute("SELECT id FROM responses").fetchall()
    assert {first.id, second.id} == {r[0] for r in rows}


def test_without_the_state_the_id_is_not_found_after_a_restart(tiny_long_dir, tmp_path):
    engine, app = server(tiny_long_dir, tmp_path, state=False)
    with serving(app) as base:
        first = turn(base, FIRST)
    engine.close()
    engine, app = server(tiny_long_dir, tmp_path, state=False)
    try:
        with serving(app) as base, pytest.raises(openai.NotFoundError):
            turn(base, SECOND, first.id)
    finally:
        engine.close()


def test_a_state_of_another_tokenizer_is_dropped(tiny_long_dir, tmp_path, caplog):
    from agentkv.server.state import StateFile

    StateFile(tmp_path, "one tokenizer").put("resp_1", 60, {"response": {}, "messages": [], "tokens": [1],
                                                             "carry": []})
    assert [r for r, _, _ in StateFile(tmp_path, "one tokenizer").load()] == ["resp_1"]
    assert StateFile(tmp_path, "another").load() == [] and "another model setup" in caplog.text
