"""The `agentkv` command line on a tiny model."""

from __future__ import annotations

from typer.testing import CliRunner

from agentkv.cli.main import app


def test_generate_prints_completion(tiny_dir):
    result = CliRunner().invoke(app, ["generate", "Hello", "--model", str(tiny_dir), "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() != ""


def test_missing_model_exits_with_one_line_reason(tmp_path):
    result = CliRunner().invoke(app, ["generate", "Hello", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert "does not exist" in result.output and len(result.output.strip().splitlines()) == 1


def test_chat_turn(tiny_dir):
    result = CliRunner().invoke(app, ["chat", "--model", str(tiny_dir), "--max-tokens", "3"], input="hi\n\n")
    assert result.exit_code == 0, result.output
    assert "cache hit rate" in result.output


def test_help():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "chat" in result.output and "generate" in result.output


def test_generate_with_schema_and_regex(tiny_dir, tmp_path):
    import json

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    result = CliRunner().invoke(app, ["generate", "Hi", "--model", str(tiny_dir), "--schema", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) in ({"ok": True}, {"ok": False})
    result = CliRunner().invoke(app, ["generate", "Hi", "--model", str(tiny_dir), "--regex", "[0-9]{3}"])
    assert result.exit_code == 0 and len(result.output.strip()) == 3 and result.output.strip().isdigit()
    cut = CliRunner().invoke(
        app, ["generate", "Hi", "--model", str(tiny_dir), "--regex", "[a-z]{50}", "--max-tokens", "5"])
    assert cut.exit_code == 1 and "raise max_tokens to at least 50" in cut.output  # (refused before generating)
    assert len(cut.output.strip().splitlines()) == 1


class RecordingEngine:
    """Stands in for ak.Engine: records how the command line made it."""

    made: list[dict] = []

    def __init__(self, model=None, **options):
        RecordingEngine.made.append({"model": model, **options})
        raise SystemExit(0)  # far enough: the options reached the engine


ENGINE_FLAGS = ["--device", "cpu", "--dtype", "bfloat16", "--tensor-parallel", "2", "--context-length", "256",
                "--num-slots", "1000"]
EXPECTED = {"device": "cpu", "dtype": "bfloat16", "tensor_parallel": 2, "context_length": 256, "num_slots": 1000}


def test_engine_options_reach_the_engine_from_every_command(monkeypatch):
    import agentkv as ak

    monkeypatch.setattr(ak, "Engine", RecordingEngine)
    for command in (["generate", "hi"], ["chat"], ["serve"], ["run", __file__, "--input", "x"]):
        RecordingEngine.made.clear()
        CliRunner().invoke(app, [*command, *ENGINE_FLAGS])
        assert RecordingEngine.made and {k: RecordingEngine.made[0].get(k) for k in EXPECTED} == EXPECTED, command
    RecordingEngine.made.clear()
    CliRunner().invoke(app, ["generate", "hi"])  # the defaults are the engine's own (device and dtype "auto")
    assert RecordingEngine.made == [{"model": None}]


def test_engine_options_reach_every_replica(monkeypatch):
    import agentkv.server.cluster.deploy as cluster

    seen = {}
    monkeypatch.setattr(cluster, "serve_cluster", lambda *a, **k: seen.update(k))
    result = CliRunner().invoke(app, ["serve", "--replicas", "2", *ENGINE_FLAGS, "--tool-format", "mistral",
                                      "--speculative", "ngram"])
    assert result.exit_code == 0, result.output
    assert seen["engine_options"] == {**EXPECTED, "tool_format": "mistral", "speculative": "ngram"}


def test_serve_takes_a_disk_tier(monkeypatch, tmp_path):
    import agentkv as ak

    monkeypatch.setattr(ak, "Engine", RecordingEngine)
    RecordingEngine.made.clear()
    CliRunner().invoke(app, ["serve", "--kv-dir", str(tmp_path), "--kv-disk-size", "1.5GiB"])
    assert RecordingEngine.made[0]["kv_dir"] == str(tmp_path) and RecordingEngine.made[0]["kv_disk_bytes"] == 3 * 2**29
    bad = CliRunner().invoke(app, ["serve", "--kv-dir", str(tmp_path), "--kv-disk-size", "lots"])
    assert bad.exit_code == 1 and "--kv-disk-size 'lots' is not a size" in bad.output
    replicas = CliRunner().invoke(app, ["serve", "--kv-dir", str(tmp_path), "--replicas", "2"])
    assert replicas.exit_code == 1 and "--kv-dir serves one engine" in replicas.output
    CliRunner().invoke(app, ["serve", "--kv-dtype", "bfloat16"])
    assert RecordingEngine.made[-1]["kv_dtype"] == "bfloat16"


def test_serve_takes_lora_adapters(monkeypatch, tmp_path):
    import agentkv as ak

    monkeypatch.setattr(ak, "Engine", RecordingEngine)
    RecordingEngine.made.clear()
    CliRunner().invoke(app, ["serve", "--lora", "support=./a", "--lora", "sales=/b.gguf", "--max-loras", "3"])
    assert RecordingEngine.made[0]["lora"] == {"support": "./a", "sales": "/b.gguf"}
    assert RecordingEngine.made[0]["max_loras"] == 3
    bad = CliRunner().invoke(app, ["serve", "--lora", "support"])
    assert bad.exit_code == 1 and "--lora 'support' is not NAME=PATH" in bad.output


def test_auto_device_and_dtype(monkeypatch):
    import torch

    from agentkv.engine.config import resolve_device
    from agentkv.errors import RequestError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", "auto") == ("cuda", "bfloat16")
    assert resolve_device("auto", "float16") == ("cuda", "float16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", "auto") == ("cpu", "float32")
    assert resolve_device("cuda:1", "auto") == ("cuda:1", "bfloat16")
    import pytest

    with pytest.raises(RequestError, match="dtype"):
        resolve_device("cpu", "fp8")


def test_why_miss(tiny_dir, tmp_path):
    import json

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in ("alpha", "beta")]
    ask = [{"role": "system", "content": "You run the tools."}, {"role": "user", "content": "go"}]
    (tmp_path / "a.json").write_text(json.dumps({"messages": ask, "tools": tools}))
    (tmp_path / "b.json").write_text(json.dumps({"messages": ask, "tools": tools[::-1]}))
    result = CliRunner().invoke(app, ["why-miss", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                      "--model", str(tiny_dir)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["section"] == "tools"
    same = CliRunner().invoke(app, ["why-miss", str(tmp_path / "a.json"), str(tmp_path / "a.json"),
                                    "--model", str(tiny_dir)])
    assert same.exit_code == 0 and same.output.startswith("no miss")


def test_a_durable_run_from_the_command_line(tiny_dir, tmp_path):
    (tmp_path / "a.py").write_text('import agentkv as ak\nagent = ak.Agent("You are terse.", max_tokens=8, '
                                   'temperature=0.0)\n')
    base = ["run", str(tmp_path / "a.py"), "--model", str(tiny_dir), "--quiet", "--journal", str(tmp_path / "j")]
    first = CliRunner().invoke(app, base + ["--run-id", "r1", "--input", "hi"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, base + ["--resume", "r1"])  # read back from the journal, printed the same
    assert again.exit_code == 0 and again.output == first.output, again.output
    missing = CliRunner().invoke(app, base + ["--resume", "nope"])
    assert missing.exit_code == 1 and "no run 'nope'" in missing.output
    loose = CliRunner().invoke(app, base[:-2] + ["--run-id", "r2", "--input", "hi"])
    assert loose.exit_code == 1 and "--journal" in loose.output
