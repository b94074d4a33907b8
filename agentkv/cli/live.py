"""The live view of an agent run: one row per step (its tool calls and results, or its reply), and a
status line with the step, tokens/s and the cache hit rate so far."""

from __future__ import annotations

import json
import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

import agentkv as ak

MAX_CELL = 160


class AgentView:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []  # (step, what the model did, what came back)
        self.step, self.mode, self.text = 0, "", ""
        self.usage: ak.AgentUsage | None = None
        self.started = time.perf_counter()
        self.step_started = self.started
        self.generated = 0  # completion tokens of finished steps
        self.generating_s = 0.0

    def update(self, event: ak.AgentEvent) -> None:
        if isinstance(event, ak.StepStart):
            self.step, self.mode, self.text = event.step, event.tool_choice, ""
            self.step_started = time.perf_counter()
        elif isinstance(event, ak.TextDelta):
            self.text += event.text
        elif isinstance(event, ak.StepEnd):
            step = event.step
            self.usage = event.usage
            self.generated += step.usage.completion_tokens
            self.generating_s += time.perf_counter() - self.step_started
            if step.tool_calls:
                did = "\n".join(f"{c.name}({_args(c.arguments)})" for c in step.tool_calls)
                got = "\n".join(_result_text(r) for r in step.tool_results)
            elif step.error:
                did, got = _cut(step.text), "error: " + step.error
            else:
                did, got = _cut(step.content) or "(empty reply)", ""
            self.rows.append((f"{step.index} {step.tool_choice}", did, got))
            self.text = ""

    def render(self) -> Group:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=True)
        table.add_column("step", no_wrap=True)
        table.add_column("model")
        table.add_column("result")
        for step, did, got in self.rows:
            table.add_row(step, Text(did), Text(got, style="red" if got.startswith("error") else ""))
        if self.text:
            table.add_row(f"{self.step} {self.mode}", Text(_cut(self.text), style="dim"), "")
        return Group(table, Text(self.status(), style="dim"))

    def status(self) -> str:
        u = self.usage
        speed = self.generated / self.generating_s if self.generating_s else 0.0
        parts = [f"step {self.step}", f"{speed:.1f} tokens/s"]
        if u is not None:
            parts += [f"cache hit {u.cache_hit_rate:.0%}", f"{u.tool_calls} tool calls",
                      f"{u.jump_forward_tokens} jump-forward tokens", f"{u.forward_passes} forward passes"]
        parts.append(f"{time.perf_counter() - self.started:.1f} s")
        return " | ".join(parts)


def format_output(output) -> str:
    """An agent's or `main`'s result for the terminal: JSON for models, dicts and lists."""
    def plain(value):
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json")
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    if isinstance(output, str):
        return output
    try:
        return json.dumps(plain(output), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(output)


def _args(arguments: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())


def _result_text(result: ak.ToolResult) -> str:
    if result.repeated:
        return "(a repeat: not run again; the next step goes without this tool)"
    return "error: " + result.error if result.error else _cut(result.content)


def _cut(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
