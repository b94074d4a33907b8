"""Each offered tool's part text, kept by definition (chat/formats/parts.py): written once per distinct
definition in every format, apart by format and by definition, refused every time where the format
refuses it, and bounded."""

from __future__ import annotations

import json

import pytest

from agentkv.chat.calls import FunctionSpec
from agentkv.chat.formats import Hermes, Llama3Json, Pythonic, parts
from agentkv.errors import RequestError
from tests.chat.test_tool_formats import ADD, ALL, TOOLS, WEATHER


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_a_steps_parts_are_written_once_per_definition(fmt):
    parts.clear()
    for close in (True, False):
        for tool in TOOLS:
            first = parts.part_text(fmt, tool, close)
            assert first == fmt.call_part(tool, close)
            # An equal definition read afresh (as a server reads each request's tools) finds it.
            again = parts.part_text(fmt, FunctionSpec(tool.name, json.loads(json.dumps(tool.parameters))), close)
            assert again is first
    assert fmt.grammar(TOOLS, "required", None).parts == tuple(fmt.call_part(t, True) for t in TOOLS)


def test_kept_parts_are_apart_by_format_and_by_definition(monkeypatch):
    parts.clear()
    hermes, llama = parts.part_text(Hermes(), ADD, True), parts.part_text(Llama3Json(), ADD, True)
    assert hermes != llama and llama == Llama3Json().call_part(ADD, True)
    # A definition changed in place is another definition.
    tool = FunctionSpec("add", json.loads(json.dumps(ADD.parameters)))
    before = parts.part_text(Hermes(), tool, True)
    tool.parameters["properties"]["a"]["maximum"] = 5
    after = parts.part_text(Hermes(), tool, True)
    assert after != before and after == Hermes().call_part(tool, True)
    # Another JSON style is another part.
    spaced = parts.part_text(Hermes(json_style="spaced"), tool, True)
    assert spaced != after and spaced == Hermes(json_style="spaced").call_part(tool, True)
    # A definition the format refuses is refused every time, and not kept.
    bad = FunctionSpec("not-an-identifier", ADD.parameters)
    for _ in range(2):
        with pytest.raises(RequestError, match="Python identifier"):
            parts.part_text(Pythonic(), bad, True)
    # The kept parts are bounded, the least recently used out first.
    monkeypatch.setattr(parts, "MAX_PARTS", 2)
    parts.part_text(Hermes(), WEATHER, True)
    assert len(parts._PARTS) == 2 and (Hermes, "spaced", "add", json.dumps(tool.parameters), True) in parts._PARTS
    parts.clear()
