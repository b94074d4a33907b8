"""A mixture-of-experts model served by `agentkv serve` (the command, in its own process): tool
calls and a schema under grammar, and greedy text equal to HF's generate on the same tokens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import torch

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

from tests.tiny import make_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ADD = {"type": "function", "function": {"name": "add", "description": "Add two digits.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}}
PAIR = {"type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
        "required": ["n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def moe_server(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", "qwen3_moe", max_positions=4096)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentkv.cli.main", "serve", "--model", str(path), "--port", str(port),
         "--served-model-name", "moe", "--api-key", "k"],
        cwd=ROOT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    proc.stderr.read() if proc.poll() else "timeout")
                time.sleep(0.2)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=120), path
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_moe_serves_tools_and_schemas(moe_server):
    client, _ = moe_server
    for seed in range(3):
        r = client.chat.completions.create(model="moe", messages=[{"role": "user", "content": "add 2 and 3"}],
                                           tools=[ADD], tool_choice="required", max_tokens=160, temperature=1.0,
                                           seed=seed)
        calls = r.choices[0].message.tool_calls
        assert calls and r.choices[0].finish_reason == "tool_calls"
        for c in calls:
            jsonschema.validate(json.loads(c.function.arguments), ADD["function"]["parameters"])
        r = client.chat.completions.create(model="moe", messages=[{"role": "user", "content": "a pair"}], seed=seed,
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "pair", "schema": PAIR, "strict": True}},
                                           max_tokens=64, temperature=1.0)
        jsonschema.validate(json.loads(r.choices[0].message.content), PAIR)


def test_moe_greedy_text_matches_hf(moe_server):
    client, path = moe_server
    prompt = "The quick brown fox"
    r = client.completions.create(model="moe", prompt=prompt, max_tokens=16, temperature=0.0,
                                  extra_body={"ignore_eos": True})
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert r.choices[0].text == tok.decode(out[0, ids.shape[1]:])
