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
