"""OpenTelemetry spans of an agent run (run > step > tool), carrying what hosted APIs cannot show:
cached vs computed prompt tokens, jump-forward tokens, forward passes; and agent.override swapping
the engine for agentkv.testing's tiny one."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field

import agentkv as ak
from agentkv.testing import tiny_engine

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


@pytest.fixture(scope="module")
def spans():
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process: OpenTelemetry refuses a second
    yield exporter


@ak.tool
def lookup(key: Annotated[str, Field(max_length=4)]) -> str:
    """Look a key up."""
    return f"value of {key}"


def test_spans_of_a_run_its_steps_and_tools(spans):
    agent = ak.Agent("Look things up.", tools=[lookup], tool_choice="lookup", max_steps=2, max_tokens=160)
    with tiny_engine() as engine, agent.override(engine=engine):
        spans.clear()
        result = agent.run_sync("find x")
        assert agent.engine is engine
    assert agent._engine is None  # the override ended
    agent.close()
    got = {s.name: s for s in spans.get_finished_spans()}
    run, tool = got["agent run"], got["tool lookup"]
    steps = [s for s in spans.get_finished_spans() if s.name == "agent step"]
    assert len(steps) == len(result.steps) == 2
    assert all(s.parent.span_id == run.context.span_id for s in steps)
    assert tool.parent.span_id == steps[0].context.span_id
    u = result.usage
    assert run.attributes["gen_ai.usage.input_tokens"] == u.prompt_tokens
    assert run.attributes["agentkv.cached_tokens"] == u.cached_tokens > 0
    assert run.attributes["agentkv.computed_tokens"] == u.prompt_tokens - u.cached_tokens
    assert run.attributes["agentkv.jump_forward_tokens"] == u.jump_forward_tokens > 0
    assert run.attributes["agentkv.forward_passes"] == u.forward_passes
    assert run.attributes["agentkv.pinned_tokens"] > 0
    assert steps[0].attributes["agentkv.tool_choice"] == "lookup"
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in steps) == u.completion_tokens
    assert tool.attributes["gen_ai.tool.name"] == "lookup" and "agentkv.tool.error" not in tool.attributes
