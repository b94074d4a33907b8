"""Each offered tool's part text, kept by its definition.

A step's grammar names every offered tool's part (ToolFormat.call_part: the tool's closed schema, its
JSON, the format's rules), and the compiler keeps each part's automata by that text. Written afresh,
the parts were the cost of a step that differs from the last by one tool: 20-40 us of Python a tool,
every tool, every step (3-5 ms at 128 tools, against ~1.5 ms to compile the step). Kept by the
format's class and JSON style, the tool's name and its parameters' JSON (equal content, not the same
objects: a server reads each request's tools afresh, and a definition changed in place is a new key),
a step writes only the parts it has not seen.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

# Parts are 0.2-2 KB of text: a few thousand tools (several agents' MCP servers) in a few MB.
MAX_PARTS = 4096

_PARTS: OrderedDict[tuple, str] = OrderedDict()
_LOCK = threading.Lock()


def part_text(fmt, tool: Any, close_objects: bool) -> str:
    """`fmt.call_part(tool, close_objects)`, written once per distinct definition. A part depends on
    the format's class, its JSON style and the tool alone (call_part's contract), not on a bound
    format's other fields."""
    try:
        key = (type(fmt), fmt.json_style, tool.name, json.dumps(tool.parameters, ensure_ascii=False), close_objects)
    except (TypeError, ValueError):  # (not JSON: call_part says what is wrong with it)
        return fmt.call_part(tool, close_objects)
    with _LOCK:
        hit = _PARTS.get(key)
        if hit is not None:
            _PARTS.move_to_end(key)
            return hit
    text = fmt.call_part(tool, close_objects)  # (a RequestError for a bad definition is not kept)
    with _LOCK:
        _PARTS[key] = text
        while len(_PARTS) > MAX_PARTS:
            _PARTS.popitem(last=False)
    return text


def clear() -> None:
    with _LOCK:
        _PARTS.clear()
