"""The `agentkv` command line on a tiny model."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app


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

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    result = CliRunner().invoke(app, ["generate", "Hi", "--model", str(tiny_dir), "--schema", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) in ({"ok": True}, {"ok": False})
    result = CliRunner().invoke(app, ["generate", "Hi", "--model", str(tiny_dir), "--regex", "[0-9]{3}"])
    assert result.exit_code == 0 and len(result.output.strip()) == 3 and result.output.strip().isdigit()
    cut = CliRunner().invoke(app, ["generate", "Hi", "--model", str(tiny_dir), "--regex", "[a-z]{50}", "--max-tokens", "5"])
    assert cut.exit_code == 1 and "ended before it was complete" in cut.output
    assert len(cut.output.strip().splitlines()) == 1
