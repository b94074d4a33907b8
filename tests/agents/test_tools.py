"""`@ak.tool`: schemas from signatures and docstrings, argument validation, sync and async calls."""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import Literal, Optional

import jsonschema
import pytest
from pydantic import BaseModel

import agentkv as ak
from agentkv.agents._tools import parse_docstring


class Unit(str, Enum):
    c = "C"
    f = "F"


class Location(BaseModel):
    city: str
    country: Optional[str] = None


@ak.tool
def get_weather(where: Location, unit: Unit = Unit.c, days: int = 1, tags: list[str] | None = None,
                mode: Literal["brief", "full"] = "brief") -> str:
    """Current weather and a forecast.

    Args:
        where: The place to look up.
        unit: Celsius or Fahrenheit.
        days (int): How many days to forecast,
            counting today.
    """
    return f"{where.city}:{unit.value}:{days}:{tags}:{mode}"


def test_schema_from_signature_and_docstring():
    assert get_weather.name == "get_weather"
    assert get_weather.description == "Current weather and a forecast."
    p = get_weather.parameters
    assert p["type"] == "object" and p["required"] == ["where"] and p["additionalProperties"] is False
    props = p["properties"]
    assert props["days"] == {
        "type": "integer", "default": 1, "description": "How many days to forecast, counting today."}
    assert props["mode"]["enum"] == ["brief", "full"]
    assert props["unit"]["description"] == "Celsius or Fahrenheit." and "title" not in props["unit"]
    assert "title" not in p
    jsonschema.Draft202012Validator.check_schema(p)
    assert get_weather.definition["function"]["name"] == "get_weather"
    # the schema compiles to a grammar, so a model's call can be generated under it
    from tests.grammar_helpers import BYTE_COMPILER, accepts

    g = BYTE_COMPILER.compile_json_schema(p)
    assert accepts(g, '{"where":{"city":"Oslo"},"unit":"F","days":3}')
    assert not accepts(g, '{"where":{"city":"Oslo"},"unit":"K"}')


def test_validate_converts_and_calls():
    kwargs = get_weather.validate('{"where": {"city": "Oslo"}, "unit": "F", "days": 3}')
    assert isinstance(kwargs["where"], Location) and kwargs["unit"] is Unit.f and kwargs["tags"] is None
    assert get_weather.call({"where": {"city": "Oslo"}}) == "Oslo:C:1:None:brief"
    assert get_weather(Location(city="Rome"), days=2) == "Rome:C:2:None:brief"  # still a plain function
    assert asyncio.run(get_weather.acall({"where": {"city": "Oslo"}, "tags": ["x"]})) == "Oslo:C:1:['x']:brief"


@pytest.mark.parametrize("args, problem", [
    ("{not json", "not JSON"),
    ("[1]", "JSON object"),
    ({"unit": "C"}, "where: Field required"),
    ({"where": {"city": "Oslo"}, "days": "many"}, "days"),
    ({"where": {"city": "Oslo"}, "extra": 1}, "extra"),
    ({"where": {"city": "Oslo"}, "unit": "K"}, "unit"),
])
def test_bad_arguments_raise_with_the_field(args, problem):
    with pytest.raises(ak.ToolArgumentsError, match=problem) as err:
        get_weather.validate(args)
    assert err.value.tool == "get_weather"


def test_async_tool_and_options():
    @ak.tool(name="lookup", description="Find a contact.")
    async def find(name: str) -> dict:
        await asyncio.sleep(0)
        return {"name": name}

    assert find.is_async and find.name == "lookup" and find.description == "Find a contact."
    assert asyncio.run(find.acall({"name": "Dana"})) == {"name": "Dana"}
    assert find.call({"name": "Omar"}) == {"name": "Omar"}


def test_functions_that_cannot_be_tools():
    with pytest.raises(ak.ToolDefinitionError, match="annotation"):
        ak.tool(lambda x: x)
    with pytest.raises(ak.ToolDefinitionError, match=r"\*args"):

        @ak.tool
        def f(*args: int) -> None: ...

    with pytest.raises(ak.ToolDefinitionError, match="no JSON schema"):

        @ak.tool
        def g(callback: type) -> None: ...


def test_docstring_styles():
    rest = parse_docstring("""Send a message.

    :param to: Recipient address.
    :param str body: The text,
        possibly long.
    :returns: nothing
    """)
    assert rest == ("Send a message.", {"to": "Recipient address.", "body": "The text, possibly long."})
    numpy = parse_docstring("""Convert money.

    Parameters
    ----------
    amount : float
        How much.
    currency : str, optional
        ISO code.

    Returns
    -------
    float
    """)
    assert numpy == ("Convert money.", {"amount": "How much.", "currency": "ISO code."})
    google = parse_docstring("Add.\n\nArgs:\n    a: First.\n    b: Second.\n\nReturns:\n    The sum.")
    assert google == ("Add.", {"a": "First.", "b": "Second."})


def test_engine_renders_tool_objects_as_their_definitions(tiny_dir, tmp_path):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}" + cfg["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    with ak.Engine(str(model), num_slots=256) as engine:
        msgs = [{"role": "user", "content": "hi"}]
        text = engine.render(msgs, tools=[get_weather])
        assert text == engine.render(msgs, tools=[get_weather.definition])
        assert text.startswith("TOOLS:") and '"name": "get_weather"' in text and '"days"' in text
