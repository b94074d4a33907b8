"""The JSON style a chat template writes tool calls in: the style a model was trained to write them.

A template that renders an assistant's `tool_calls` writes their arguments with `tojson` (spaced, as
`json.dumps` writes JSON: Qwen 2.5's, Hermes', Llama 3.1's) or with `tojson(separators=(',', ':'))`
(compact: Kimi K2's). Rendering one probe call and finding its arguments in the text says which; a
template that writes no calls (SmolLM2's) or writes them otherwise says nothing, and the model
chooses (grammar/schema/style.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentkv.grammar.schema.style import SEPARATORS

_ARGUMENTS = {"probe_city": "Paris", "probe_days": [1, 2]}
_TOOL = {"type": "function", "function": {
    "name": "probe_tool", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"probe_city": {"type": "string"},
                                                    "probe_days": {"type": "array", "items": {"type": "integer"}}},
                   "required": ["probe_city", "probe_days"]}}}


def template_json_style(render: Callable[..., str]) -> str | None:
    """"compact" or "spaced" as `render(messages, add_generation_prompt=False, tools=...)` (a chat template)
    writes a call's arguments, or None where it does not write them as JSON."""
    # (an id of 9 letters: Mistral's templates refuse other ids)
    call = {"id": "probecall", "type": "function", "function": {"name": "probe_tool", "arguments": _ARGUMENTS}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "probe"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "probecall", "name": "probe_tool", "content": "ok"},
    ]
    try:  # (with the tool offered: templates that list `tools` fail without them)
        text = render(messages, add_generation_prompt=False, tools=[_TOOL])
    except Exception:  # noqa: BLE001  (a template that refuses the probe says nothing of its style)
        return None
    for style, separators in SEPARATORS.items():
        if json.dumps(_ARGUMENTS, ensure_ascii=False, separators=separators) in text:
            return style
    return None
