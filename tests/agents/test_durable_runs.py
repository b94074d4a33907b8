"""Durable agent runs (agents/_journal.py) on the tiny model: a run killed (SIGKILL) at each point of a
step resumes to the output an uninterrupted run gives, every tool having run exactly once (counted in
a file), the recorded replies not generated again, the resumed step's prompt read back from disk; a
call that was running when the process died runs again only where its tool is idempotent; a journal
of another agent definition, or a run another live worker holds, is refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentkv as ak

ROOT = Path(__file__).parents[2]

WORKER = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from typing import Annotated
    from pydantic import Field
    import agentkv as ak

    model, folder, mode, run_id = sys.argv[1:5]
    counter = os.path.join(folder, "charges")
    kill_at = os.environ.get("KILL_AT", "")

    one_at_a_time = threading.Lock()

    @ak.tool(idempotent=os.environ.get("IDEMPOTENT") == "1")
    def charge(amount: Annotated[int, Field(ge=1, le=9)]) -> str:
        '''Charge the card.'''
        if kill_at == "tool":  # killed after the tool did its work, before its result is recorded
            one_at_a_time.acquire()  # (the step's other calls wait: the kill comes first)
            with open(counter, "a") as f:
                f.write("charge\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        with open(counter, "a") as f:
            f.write("charge\\n")
        return f"charged {amount}"

    engine = ak.Engine(model, num_slots=8192, seed=0, kv_dir=os.path.join(folder, "kv"), kv_warm_fraction=0.0)
    agent = ak.Agent("You charge cards, then say done.", tools=[charge], tool_choice="required", max_steps=3,
                     engine=engine, temperature=0.0, max_tokens=160, journal=ak.Journal(os.path.join(folder, "j")))
    if kill_at == "step2":  # killed while the model writes its second step (the first step's call done)
        real, calls = engine.stream, [0]
        def stream(*a, **k):
            calls[0] += 1
            if calls[0] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        engine.stream = stream
    kw = {"approvals": json.loads(os.environ["APPROVALS"])} if os.environ.get("APPROVALS") else {}
    result = agent.resume_sync(run_id, **kw) if mode == "resume" else agent.run_sync("charge 3", run_id=run_id)
    out = result.output if isinstance(result.output, str) else {"waiting": [c.id for c in result.output.calls]}
    print(json.dumps({"output": out, "steps": [
        {"replayed": s.replayed, "cached": s.usage.cached_tokens, "prompt": s.usage.prompt_tokens,
         "results": [r.replayed for r in s.tool_results]} for s in result.steps]}))
""")


def worker(model, folder: Path, mode: str, run_id: str = "r1", **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", WORKER, str(model), str(folder), mode, run_id], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env={**os.environ, **env})


def charges(folder: Path) -> int:
    path = folder / "charges"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def whole(tiny_long_dir, tmp_path_factory):
    """An uninterrupted run: its output and how many times it charged."""
    folder = tmp_path_factory.mktemp("whole")
    done = worker(tiny_long_dir, folder, "run")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), charges(folder)


def test_killed_while_the_model_writes_the_next_step(tiny_long_dir, tmp_path, whole):
    killed = worker(tiny_long_dir, tmp_path, "run", KILL_AT="step2")
    assert killed.returncode == -signal.SIGKILL
    assert charges(tmp_path) == whole[1] >= 1  # the first step's calls ran before the kill
    done = worker(tiny_long_dir, tmp_path, "resume")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["output"] == whole[0]["output"] and charges(tmp_path) == whole[1]  # each tool ran once
    first, second = result["steps"][:2]
    assert first["replayed"] and all(first["results"]) and not second["replayed"]
    assert second["cached"] >= second["prompt"] - 16  # its prompt, pinned before the kill, read back from disk


def test_a_finished_run_resumes_to_its_output_without_the_model_or_its_tools(tiny_long_dir, tmp_path, whole):
    assert worker(tiny_long_dir, tmp_path, "run").returncode == 0
    done = worker(tiny_long_dir, tmp_path, "resume")
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["output"] == whole[0]["output"] and charges(tmp_path) == whole[1]
    assert all(s["replayed"] for s in result["steps"])


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not"])
def test_killed_between_a_tool_and_its_record(tiny_long_dir, tmp_path, whole, idempotent):
    flag = "1" if idempotent else "0"
    killed = worker(tiny_long_dir, tmp_path, "run", KILL_AT="tool", IDEMPOTENT=flag)
    assert killed.returncode == -signal.SIGKILL and charges(tmp_path) == 1
    done = worker(tiny_long_dir, tmp_path, "resume", IDEMPOTENT=flag)
    result = json.loads(done.stdout.splitlines()[-1])
    if idempotent:  # run again: the same effect twice is its contract
        assert result["output"] == whole[0]["output"] and charges(tmp_path) == whole[1] + 1
        return
    # the calls recorded as started may have run: asked, not run again (a step's calls start together)
    waiting = result["output"]["waiting"]
    ran = 1 + whole[1] - len(waiting)  # the one killed inside it, and the step's calls that had not started
    assert 1 <= len(waiting) <= whole[1] and charges(tmp_path) == ran
    told = worker(tiny_long_dir, tmp_path, "resume", IDEMPOTENT=flag,
                  APPROVALS=json.dumps({c: "checked: the card was charged" for c in waiting}))
    assert told.returncode == 0, told.stderr
    assert isinstance(json.loads(told.stdout.splitlines()[-1])["output"], str)
    assert charges(tmp_path) == ran  # none of the asked ones ran again


def test_a_journal_refuses_what_it_cannot_resume(tiny_long_dir, tmp_path):
    journal = ak.Journal(tmp_path)
    with ak.Engine(str(tiny_long_dir), num_slots=4096) as engine:
        with ak.Agent("one way", engine=engine, max_tokens=8, journal=journal) as agent:
            agent.run_sync("hi", run_id="r")
            with pytest.raises(ak.JournalError, match="already in"):
                agent.run_sync("hi", run_id="r")
            with pytest.raises(ak.JournalError, match="no run 'missing'"):
                agent.resume_sync("missing")
        with ak.Agent("another way", engine=engine, max_tokens=8, journal=journal) as other:
            with pytest.raises(ak.JournalError, match=r"defined otherwise \(instructions differ\)"):
                other.resume_sync("r")
        with pytest.raises(ak.RequestError, match="give journal="):
            ak.Agent("x", engine=engine).run_sync("hi", run_id="z")
    assert journal.runs() == [{"id": "r", "agent": "agent", "status": "done"}]


def test_two_workers_resuming_one_run_one_wins(tiny_long_dir, tmp_path):
    import sqlite3

    first, second = ak.Journal(tmp_path), ak.Journal(tmp_path)
    with ak.Engine(str(tiny_long_dir), num_slots=4096) as engine, \
            ak.Agent("x", engine=engine, max_tokens=8) as agent:
        agent.run_sync("hi", run_id="r", journal=first)
        db = sqlite3.connect(str(tmp_path / "journal.db"))
        db.execute("UPDATE runs SET status = 'open', owner = NULL")  # as a run whose worker died
        db.commit()
        first.claim("r", agent)  # this process's first worker takes it...
        with pytest.raises(ak.JournalError, match="being run by another worker"):
            second.claim("r", agent)  # ...and the second, alive beside it, is refused
        with pytest.raises(ak.JournalError, match="format 9"):
            db.execute("UPDATE meta SET value = '9' WHERE key = 'format'")
            db.commit()
            ak.Journal(tmp_path)


DBOS_WORKER = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from typing import Annotated
    from pydantic import Field
    from dbos import DBOS
    import agentkv as ak

    model, folder, mode = sys.argv[1:4]
    DBOS(config={"name": "agentkv-durable-test", "run_admin_server": False,
                 "system_database_url": "sqlite:///" + os.path.join(folder, "dbos.sqlite")})
    counter = os.path.join(folder, "charges")

    @ak.tool
    def charge(amount: Annotated[int, Field(ge=1, le=9)]) -> str:
        '''Charge the card.'''
        with open(counter, "a") as f:
            f.write("charge\\n")
        return f"charged {amount}"

    engine = ak.Engine(model, num_slots=8192, seed=0, kv_dir=os.path.join(folder, "kv"), kv_warm_fraction=0.0)
    agent = ak.Agent("You charge cards, then say done.", tools=[charge], tool_choice="required", max_steps=3,
                     engine=engine, temperature=0.0, max_tokens=160)
    durable = ak.DBOSAgent(agent)
    real, streams = engine.stream, []
    def stream(*a, **k):
        streams.append(1)
        if os.environ.get("KILL_AT") == "step2" and len(streams) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    engine.stream = stream

    async def main():
        DBOS.launch()
        if mode == "run":
            return await durable.run("charge 3", run_id="r1")
        return await durable.resume("r1")  # (recovered by the launch)
    result = asyncio.run(main())
    print(json.dumps({"output": result.output, "streams": len(streams), "steps": [
        {"cached": s.usage.cached_tokens, "prompt": s.usage.prompt_tokens} for s in result.steps]}))
""")


def test_the_same_through_dbos_on_sqlite(tiny_long_dir, tmp_path, whole):
    pytest.importorskip("dbos")
    import os

    def dbos_worker(folder: Path, mode: str, **env):
        return subprocess.run([sys.executable, "-c", DBOS_WORKER, str(tiny_long_dir), str(folder), mode],
                              capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, **env})

    uninterrupted = tmp_path / "whole"
    uninterrupted.mkdir()
    ref = dbos_worker(uninterrupted, "run")
    assert ref.returncode == 0, ref.stderr
    ref = json.loads(ref.stdout.splitlines()[-1])
    assert ref["output"] == whole[0]["output"]  # the same run as the journal's
    killed = dbos_worker(tmp_path, "run", KILL_AT="step2")
    assert killed.returncode == -signal.SIGKILL and charges(tmp_path) == whole[1]
    done = dbos_worker(tmp_path, "resume")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["output"] == ref["output"] and charges(tmp_path) == whole[1]  # each tool ran once
    assert result["streams"] == ref["streams"] - 1  # the first step's reply came from DBOS, not the model
    second = result["steps"][1]
    assert second["cached"] >= second["prompt"] - 16  # its prompt, pinned before the kill, read back from disk


def test_a_journal_that_cannot_record_stops_the_run(tiny_long_dir, tmp_path, monkeypatch):
    """A full disk: the run stops with a JournalError before acting on what it could not record."""
    import sqlite3

    ran = []

    @ak.tool
    def effect(x: int) -> str:
        """Do something."""
        ran.append(x)
        return "done"

    journal = ak.Journal(tmp_path)
    real = journal._db

    class Full:  # the connection, with every record refused as SQLite refuses it on a full disk
        def execute(self, sql, *args):
            if sql.startswith("INSERT OR REPLACE INTO records"):
                raise sqlite3.OperationalError("database or disk is full")
            return real.execute(sql, *args)

    monkeypatch.setattr(journal, "_db", Full())
    with ak.Engine(str(tiny_long_dir), num_slots=4096) as engine, \
            ak.Agent("x", tools=[effect], tool_choice="required", engine=engine, max_tokens=96,
                     journal=journal) as agent:
        with pytest.raises(ak.JournalError, match="could not record its step .*disk is full.*resume"):
            agent.run_sync("go", run_id="r")
    assert ran == []  # the reply it could not record was not acted on
