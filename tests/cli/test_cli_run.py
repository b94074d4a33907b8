"""`agentkv run`: agents with the live view, `main` functions, and one-line errors; every example
runs to exit 0 on the embedded model (subprocesses, as a user runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentkv.cli.main import app
from tests.conftest import requires_embedded

ROOT = Path(__file__).resolve().parents[2]
AGENT_FILE = '''
from typing import Annotated

from pydantic import Field

import agentkv as ak

@ak.tool
def add(a: Annotated[int, Field(ge=0, le=9)], b: Annotated[int, Field(ge=0, le=9)]) -> int:
    """Add two digits."""
    return a + b

agent = ak.Agent("Add numbers.", tools=[add], tool_choice="add", max_steps=2, max_tokens=100, temperature=1.0,
                 parallel_tool_calls=False)
'''


def run(*args, input=None):
    return CliRunner().invoke(app, ["run", *map(str, args)], input=input)


def test_run_agent_with_live_view(tiny_long_dir, tmp_path):
    tiny_dir = tiny_long_dir
    f = tmp_path / "adder.py"
    f.write_text(AGENT_FILE)
    result = run(f, "--input", "1+2", "--model", tiny_dir)
    assert result.exit_code == 0, result.output
    assert "add(" in result.output and "tokens/s" in result.output and "cache hit" in result.output
    quiet = run(f, "--input", "1+2", "--model", tiny_dir, "--quiet")
    assert quiet.exit_code == 0 and "tokens/s" not in quiet.output
    piped = run(f, "--model", tiny_dir, "-q", input="1+2")  # input on stdin
    assert piped.exit_code == 0, piped.output


def test_run_main_with_args(tiny_dir, tmp_path):
    f = tmp_path / "prog.py"
    f.write_text("def main(name, greeting='hello'):\n    return {'text': f'{greeting} {name}'}\n")
    result = run(f, "--arg", "name=ada", "-a", "greeting=hi", "--model", tiny_dir)
    assert result.exit_code == 0, result.output
    assert '"text": "hi ada"' in result.output
    bad = run(f, "--arg", "oops", "--model", tiny_dir)
    assert bad.exit_code == 1 and "key=value" in bad.output


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    ("x = 1\n", "defines neither `agent`"),
    ("raise RuntimeError('boom')\n", "failed to load: RuntimeError: boom"),
    ("def main():\n    return 1\n", "no `agent`"),  # --input for a file without an agent
])
def test_run_errors_are_one_line(tiny_dir, tmp_path, content, message):
    f = tmp_path / "m.py"
    if content is not None:
        f.write_text(content)
    args = [f, "--model", tiny_dir] + (["--input", "x"] if "agent`" in message and "neither" not in message else [])
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_run_model_load_failure(tmp_path):
    f = tmp_path / "adder.py"
    f.write_text(AGENT_FILE)
    result = run(f, "--input", "x", "--model", tmp_path / "missing")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1


def test_help_everywhere():
    for command in ([], ["run"], ["serve"], ["generate"], ["chat"]):
        result = CliRunner().invoke(app, [*command, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output


@pytest.mark.slow
@requires_embedded
@pytest.mark.parametrize("example, args", [
    ("agent.py", ["--input", "What is the weather in Oslo?"]),
    ("agent.py", []),
    ("extract.py", []),
    ("batch_agents.py", []),
    ("support_desk.py", []),
    ("chat.py", []),
    ("fork_compare.py", ["--arg", "topic=a rainy day"]),
    ("mcp_agent.py", ["--input", "What is the weather in Oslo?"]),
])
def test_examples_exit_zero(example, args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "agentkv.cli.main", "run", str(ROOT / "examples" / example), *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip()
    # agents left open are unpinned at exit, after their engine closed: quietly
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]
    # every generator of the run closed on its own loop (one left to the collector warns at exit)
    assert "Task was destroyed" not in proc.stderr + proc.stdout, proc.stderr[-2000:]


def test_serve_command_serves(tiny_long_dir):
    import json
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentkv.cli.main", "serve", "--model", str(tiny_long_dir), "--port", str(port),
         "--served-model-name", "tiny", "--api-key", "k"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert json.loads(r.read()) == {"status": "ok"}
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    proc.stderr.read() if proc.poll() else "timeout")
                time.sleep(0.2)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(req) as r:
            assert json.loads(r.read())["data"][0]["id"] == "tiny"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
