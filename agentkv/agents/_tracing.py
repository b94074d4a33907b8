"""OpenTelemetry spans for agent runs, steps and tool calls, where `opentelemetry-api` is installed
(`pip install agentkv[tracing]`); without it, nothing is recorded and nothing is imported.

    agent run            agentkv.agents._agent, gen_ai.usage.input_tokens / output_tokens, agentkv.cached_tokens, ...
      agent step         agentkv.step, agentkv.tool_choice, and the step's engine usage:
                         cached vs computed prompt tokens, jump-forward tokens, forward passes
        tool <name>      gen_ai.tool.name, gen_ai.tool.call.id, agentkv.tool.error
      agent step ...

Spans are started with an explicit parent rather than made current: a run is an async generator
whose consumer's context must not change between its events.
"""

from __future__ import annotations

from typing import Any

try:  # an optional dependency
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - tracing is off without it
    _trace = None


def start(name: str, parent: Any = None, **attributes: Any) -> Any:
    """A started span (a child of `parent`, or of the caller's current span), or None without OpenTelemetry."""
    if _trace is None:
        return None
    context = _trace.set_span_in_context(parent) if parent is not None else None
    span = _trace.get_tracer("agentkv").start_span(name, context=context)
    set_attributes(span, **attributes)
    return span


def set_attributes(span: Any, **attributes: Any) -> None:
    if span is None:
        return
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key.replace("__", "."), value)


def end(span: Any, error: BaseException | None = None, **attributes: Any) -> None:
    if span is None:
        return
    set_attributes(span, **attributes)
    if error is not None:
        span.record_exception(error)
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(error)))
    span.end()


def usage_attributes(usage: Any) -> dict[str, Any]:
    """What hosted APIs cannot show, as span attributes (keys with `__` for dots)."""
    return {"gen_ai__usage__input_tokens": usage.prompt_tokens, "gen_ai__usage__output_tokens": usage.completion_tokens,
            "agentkv__cached_tokens": usage.cached_tokens,
            "agentkv__computed_tokens": usage.prompt_tokens - usage.cached_tokens,
            "agentkv__jump_forward_tokens": usage.jump_forward_tokens, "agentkv__forward_passes": usage.forward_passes}
