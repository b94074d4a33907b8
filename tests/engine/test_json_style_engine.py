"""The model's JSON style in the engine: a model that leans to `": "` (as Gemma 3 does) writes spaced
JSON under the default style, its number stops at the digit bound, and the output parses; a forced
style holds whatever the model leans to; chat turns take the template's style."""

from __future__ import annotations

import json

import jsonschema
import pytest

from agentkv.engine import SamplingParams
from agentkv.errors import RequestError

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                         "population": {"type": "integer"}},
        "required": ["city", "population"]}


def leaning(engine, *texts: str) -> dict[int, float]:
    """A logit bias toward each text's token: a random model then writes what a trained one prefers."""
    return {engine.tokenizer.encode(t)[0]: 30.0 for t in texts}


def test_a_model_that_leans_to_spaces_writes_spaced_json_and_its_number_stops(tiny_engine):
    out = tiny_engine.generate("City:", schema=CITY, temperature=0.0, max_tokens=200,
                               logit_bias=leaning(tiny_engine, " ", "1"))
    assert out.finish_reason == "stop", out.text
    assert out.text.startswith('{"city": "') and '", "population": ' in out.text
    value = json.loads(out.text)
    jsonschema.validate(value, CITY)
    assert value["population"] == int("1" * 16)  # the run-on number held to 16 digits


def test_a_forced_style_holds_against_the_models_lean(tiny_engine):
    bias = leaning(tiny_engine, " ", "1")
    out = tiny_engine.generate("City:", schema=CITY, temperature=0.0, max_tokens=200, logit_bias=bias,
                               json_style="compact")
    assert out.text.startswith('{"city":"') and '","population":' in out.text
    assert json.loads(out.text)["population"] == int("1" * 16)
    out = tiny_engine.generate("City:", schema=CITY, temperature=0.0, max_tokens=200, json_style="spaced",
                               logit_bias=leaning(tiny_engine, "1"))
    assert out.text.startswith('{"city": "') and '", "population": ' in out.text
    jsonschema.validate(json.loads(out.text), CITY)


def test_a_model_that_leans_against_spaces_writes_compact(tiny_engine):
    out = tiny_engine.generate("City:", schema=CITY, temperature=0.0, max_tokens=200,
                               logit_bias={**leaning(tiny_engine, '"'), tiny_engine.tokenizer.encode(" ")[0]: -30.0})
    assert out.text.startswith('{"city":"') and ' "population"' not in out.text
    jsonschema.validate(json.loads(out.text), CITY)


def test_an_unknown_style_is_refused_naming_the_choices():
    with pytest.raises(RequestError, match=r"json_style='pretty'.*'compact', 'spaced', 'model'"):
        SamplingParams(json_style="pretty")


@pytest.fixture(scope="module")
def qwen_engine(tmp_path_factory):
    import agentkv as ak
    from tests.tiny import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("qwen") / "m", chat="qwen2.5", max_positions=2048)
    with ak.Engine(str(path), seed=0) as engine:
        yield engine


def test_a_chat_takes_the_style_its_template_writes_calls_in(qwen_engine):
    """Qwen 2.5's template writes calls `tojson` (spaced): a chat's JSON is spaced unless the request
    names a style, with tools or without, whole or streamed; a raw prompt is the model's choice."""
    assert qwen_engine.tool_format.json_style == "spaced"
    chat = [{"role": "user", "content": "A city?"}]
    bias = {qwen_engine.tokenizer.encode(" ")[0]: -30.0}  # (a lean against spaces: the template's style holds)
    out = qwen_engine.chat(chat, schema=CITY, temperature=0.0, max_tokens=120, logit_bias=bias)
    assert out.text.startswith('{"city": "'), out.text
    assert qwen_engine.chat(chat, schema=CITY, temperature=0.0, max_tokens=120, logit_bias=bias,
                            json_style="compact").text.startswith('{"city":"')
    tool = {"type": "function", "function": {"name": "where", "parameters": CITY}}
    called = qwen_engine.chat(chat, tools=[tool], tool_choice="required", temperature=0.0, max_tokens=160,
                              logit_bias=bias)
    assert called.text.startswith('<tool_call>\n{"name": "where", "arguments": {"city": "'), called.text

    async def streamed():
        return "".join([d.text async for d in qwen_engine.stream(chat, schema=CITY, temperature=0.0, max_tokens=120,
                                                                 logit_bias=bias)])

    import asyncio

    assert asyncio.run(streamed()).startswith('{"city": "')
    raw = qwen_engine.generate("A city?", schema=CITY, temperature=0.0, max_tokens=120, logit_bias=bias)
    assert raw.text.startswith('{"city":"')  # (no chat: the model's choice, which the lean decides)
